"""The stable prefix of an agent: computed from rendered, tokenized sample calls, never assumed.

How a turn-1 request is built (see `warmer.core.agents.build_request`): one system message holding the
static blocks joined by the spec's separator, then the few-shot messages, then ONE final message holding
the rendered dynamic tail (every per-call value), plus the tools. The chat template decides where the tools
and the generation prompt go; that is exactly why the prefix must be computed from the rendered text.

Computation: render >= 2 sample calls with different per-call values exactly as the engine sees them
(chat template + tools + generation prompt), tokenize each, and take the longest common TOKEN prefix.
Comparing tokens, not characters, handles boundary merges: "Hello {name}" renders "Hello Ana" and
"Hello Bob", whose characters share "Hello " but whose tokens (" Ana" / " Bob" in a BPE vocabulary)
diverge before the space. The prefix text is then snapped to that token boundary, so the text tokenizes to
exactly the prefix's token ids.

The renderer and tokenizer are injected (`RenderFn`, `TokenizeFn`): the engine's own `/apply-template` +
`/tokenize` when it can, else a local `ChatTemplate` and a `tokenizers` file. Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from warmer.core.agent_requests import build_request, sample_values
from warmer.core.agents import AgentSpec, PlaceholderSite, placeholder_sites
from warmer.core.errors import ConfigError
from warmer.core.model import Prefix

# How far back from the first differing character we look for a text cut that tokenizes to a prefix of
# the common tokens. A token is rarely longer than a few dozen characters.
_SNAP_WINDOW_CHARS = 256
_MARK_OPEN, _MARK_CLOSE = "\u27e6", "\u27e7"  # ⟦name⟧: survives tojson(ensure_ascii=False) unchanged


class RenderFn(Protocol):
    """Chat messages (+ tools) -> the exact prompt text the engine builds, generation prompt included."""

    def __call__(
        self, messages: Sequence[Mapping[str, object]], tools: Sequence[Mapping[str, object]]
    ) -> str: ...


class TokenizeFn(Protocol):
    """Prompt text -> the engine's token ids for a completion request of that text (BOS included)."""

    def __call__(self, text: str) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class StablePrefix:
    """What every turn-1 request of an agent starts with, and what it is worth.

    `text` tokenizes to exactly `token_ids`; `first_dynamic_token_offset` is the index of the first token
    that differs between sample calls (normally == `token_count`). `first_dynamic_site` says which
    placeholder occurrence in the spec is rendered there; None when every sample rendered identically.
    `tools_char_offset` is where the template starts rendering tool definitions (None without tools, or
    when the template does not render them at all).
    """

    agent: str
    model: str
    text: str
    token_ids: tuple[int, ...]
    token_count: int
    hash: str
    turn1_prompt_tokens: int
    stable_share: float
    first_dynamic_token_offset: int
    first_dynamic_char_offset: int
    first_dynamic_site: PlaceholderSite | None
    tools_char_offset: int | None
    samples: int

    @property
    def tools_reachable(self) -> bool:
        """False when the template renders the tool definitions after the first per-call value."""
        return self.tools_char_offset is None or self.tools_char_offset < self.first_dynamic_char_offset

    def as_prefix(self) -> Prefix:
        return Prefix(
            text=self.text, token_count=self.token_count, token_ids=self.token_ids, model=self.model
        )


def common_prefix_length(sequences: Sequence[Sequence[object]]) -> int:
    """Length of the longest run every sequence starts with."""
    if not sequences:
        return 0
    shortest = min(len(s) for s in sequences)
    first = sequences[0]
    for i in range(shortest):
        if any(s[i] != first[i] for s in sequences[1:]):
            return i
    return shortest


def render_sample(spec: AgentSpec, render: RenderFn, index: int) -> str:
    """The full turn-1 prompt text of sample call `index`."""
    request = build_request(spec, sample_values(spec, index))
    return render(request.messages, request.tools)


def snap_to_token_boundary(text: str, char_limit: int, token_ids: Sequence[int], tokenize: TokenizeFn) -> int:
    """Largest cut <= `char_limit` whose tokens are exactly a prefix of `token_ids` (prefer the longest).

    Raises ConfigError when no cut within the window round-trips (a tokenizer that is not deterministic
    over prefixes cannot give a text form of the prefix; send token ids instead).
    """
    for cut in range(char_limit, max(-1, char_limit - _SNAP_WINDOW_CHARS - 1), -1):
        ids = tokenize(text[:cut])
        if len(ids) <= len(token_ids) and list(token_ids[: len(ids)]) == ids:
            return cut
    raise ConfigError(
        [
            (
                "tokenizer",
                f"no text cut within {_SNAP_WINDOW_CHARS} chars of {char_limit} tokenizes to the prefix",
            )
        ]
    )


def _first_dynamic_site(spec: AgentSpec, render: RenderFn) -> tuple[PlaceholderSite | None, int | None]:
    """Which placeholder the template renders first, and where tool definitions start (chars).

    Renders one call with each value replaced by a visible marker ⟦name⟧; the earliest marker names the
    first per-call value. A name used in several places maps to its first site in spec order.
    """
    markers = {p.name: f"{_MARK_OPEN}{p.name}{_MARK_CLOSE}" for p in spec.placeholders}
    request = build_request(spec, markers)
    marked = render(request.messages, request.tools)
    positions = [(marked.find(marker), name) for name, marker in markers.items() if marker in marked]
    site: PlaceholderSite | None = None
    if positions:
        _, name = min(positions)
        site = next((s for s in placeholder_sites(spec) if s.placeholder == name), None)
    tools_at: int | None = None
    if spec.tools:
        first = build_request(spec, sample_values(spec, 0))
        with_tools = render(first.messages, first.tools)
        without = render(first.messages, ())
        if with_tools != without:  # else the template ignores tools (ChatML): nothing of them to reach
            tools_at = common_prefix_length([with_tools, without])
    return site, tools_at


def compute_stable_prefix(
    spec: AgentSpec, render: RenderFn, tokenize: TokenizeFn, *, samples: int = 3
) -> StablePrefix:
    """Render `samples` (>= 2) calls, tokenize, and take the longest common token prefix."""
    if samples < 2:
        raise ValueError("a stable prefix needs at least two sample calls")
    texts = [render_sample(spec, render, i) for i in range(samples)]
    token_lists = [tokenize(t) for t in texts]
    common_tokens = common_prefix_length(token_lists)
    common_chars = common_prefix_length(texts)
    first_text, first_ids = texts[0], token_lists[0]
    stable_ids = first_ids[:common_tokens]
    if common_tokens == len(first_ids) and common_chars == len(first_text):
        cut = len(first_text)  # nothing varies: the whole prompt is stable
    else:
        cut = snap_to_token_boundary(first_text, common_chars, stable_ids, tokenize)
    text = first_text[:cut]
    ids = tuple(tokenize(text)) if cut < len(first_text) else tuple(first_ids)
    site, tools_at = _first_dynamic_site(spec, render)
    prefix = Prefix(text=text, token_count=len(ids), token_ids=ids, model=spec.model)
    turn1 = len(first_ids)
    return StablePrefix(
        agent=spec.id,
        model=spec.model,
        text=text,
        token_ids=ids,
        token_count=len(ids),
        hash=prefix.hash,
        turn1_prompt_tokens=turn1,
        stable_share=len(ids) / turn1 if turn1 else 0.0,
        first_dynamic_token_offset=common_tokens,
        first_dynamic_char_offset=common_chars,
        first_dynamic_site=site if common_chars < len(first_text) else None,
        tools_char_offset=tools_at,
        samples=samples,
    )
