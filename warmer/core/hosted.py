"""Hosted providers as boxes: their prompt-cache rules, the request form warmer sends them, and when keeping a
prefix warm there pays. Pure: no I/O.

A hosted API caches like an engine (exact prefix, from the first token) but under rules of its own, each
taken from the provider's documentation:

- OpenAI (https://developers.openai.com/api/docs/guides/prompt-caching): automatic for prompts of 1,024
  tokens or more; requests are routed by a hash of the prompt's first ~256 tokens, combined with
  `prompt_cache_key` when one is sent (a prefix+key taking more than ~15 requests a minute spills to other
  machines: OpenAI's note on routing,
  https://community.openai.com/t/prompt-cache-routing-the-user-parameter/1267103); cached prefixes live
  minutes of inactivity in memory (an extended retention keeps them up to 24 h); the hit is reported in
  `usage.prompt_tokens_details.cached_tokens`. Hits come in increments of 128
  tokens (openai/openai-cookbook examples/Prompt_Caching_201.ipynb, "1.1 Basics"). Writes cost nothing extra
  before the GPT-5.6 family and 1.25x the uncached input rate from it on (the same guide), so the write
  price is a profile figure, not a constant.
- Anthropic (https://platform.claude.com/docs/en/build-with-claude/prompt-caching): a
  `cache_control: {"type": "ephemeral"}` breakpoint on a block caches everything up to and including it, in
  the order tools, system, messages; `ttl` "5m" (the default, refreshed on every use) or "1h"; a minimum
  cacheable length per model (1,024, 2,048 or 4,096 tokens: the model table on that page), below which
  nothing is cached and no error is raised; `usage.cache_creation_input_tokens` (written),
  `usage.cache_read_input_tokens` (read) and `usage.input_tokens` (after the last breakpoint). Writes cost
  1.25x base input ("5m") or 2x ("1h"), reads 0.1x.

The stable prefix of an agent on a hosted box is computed like any other (`warmer.core.prefix`), over the
canonical text `render_request` makes of a chat request: one JSON line for the tools, then one per message.
What a hosted box can warm is the run of WHOLE lines in that prefix (`stable_request`): the tools and every
message before the first per-call value. A provider cannot be sent half a message as "the prefix".
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

CacheTtl = Literal["5m", "1h"]

# The final message a warm or probe request must carry (Anthropic needs one user message; OpenAI's chat
# completions a turn to answer) is counted by the provider but shared by no two requests: how far a verified
# hit may fall short of the provider's count of the prefix sent alone, beyond the cache's increment.
FINAL_MESSAGE_ALLOWANCE_TOKENS = 32


@dataclass(frozen=True, slots=True)
class ProviderCache:
    """A hosted model's prompt-cache rules and prices (one profile's `[provider]` table).

    Prices are per million input tokens, in any one currency: `input_price` uncached, `cache_write_price` a
    token written to the cache (OpenAI before GPT-5.6: the input price), `cache_read_price` a token read
    from it."""

    min_cacheable_tokens: int
    increment_tokens: int
    lifetime_seconds: float
    input_price: float
    cache_write_price: float
    cache_read_price: float
    ttl: CacheTtl | None = None  # Anthropic `cache_control.ttl`; None: the provider's default

    def __post_init__(self) -> None:
        if self.min_cacheable_tokens < 1 or self.increment_tokens < 1:
            raise ValueError("min_cacheable_tokens and increment_tokens must be >= 1")
        if not self.lifetime_seconds > 0:
            raise ValueError("lifetime_seconds must be > 0")
        if min(self.input_price, self.cache_write_price, self.cache_read_price) < 0:
            raise ValueError("prices must be >= 0")

    def cacheable(self, shared_tokens: int) -> int:
        """Tokens a request sharing `shared_tokens` leading tokens with a cached entry may read: nothing below
        the floor, else the shared run rounded down to the increment."""
        if shared_tokens < self.min_cacheable_tokens:
            return 0
        return shared_tokens - shared_tokens % self.increment_tokens

    def hit_allowance(self) -> int:
        """How far a verified hit may fall short of the provider's count of the prefix sent alone."""
        return self.increment_tokens + FINAL_MESSAGE_ALLOWANCE_TOKENS


# -- the request form ------------------------------------------------------------------------------------


def render_request(messages: Sequence[Mapping[str, object]], tools: Sequence[Mapping[str, object]]) -> str:
    """A chat request as canonical text (a `RenderFn`): the tools as one JSON line, then one JSON line per
    message, each ending in a newline. Text before a per-call value is identical across calls, so the stable
    prefix of two calls ends inside the line of the first message that differs."""
    lines = [_line({"tools": [dict(t) for t in tools]})]
    lines += [_line({"role": m.get("role"), "content": m.get("content")}) for m in messages]
    return "".join(lines)


def _line(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":")) + "\n"


@dataclass(frozen=True, slots=True)
class StableRequest:
    """The whole tools and messages every call of an agent starts with: what a hosted box warms."""

    tools: tuple[Mapping[str, object], ...]
    messages: tuple[Mapping[str, str], ...]  # role and content; the system message first when there is one


class NotARequestPrefix(ValueError):
    """The prefix text is not a `render_request` prefix (the profile renders with another template)."""


def stable_request(prefix_text: str) -> StableRequest:
    """The whole lines of a `render_request` prefix; the unfinished last line (the message holding the first
    per-call value) is left out."""
    complete = prefix_text.split("\n")[:-1]
    if not complete:
        return StableRequest((), ())
    items = [_parse_line(line) for line in complete]
    head = items[0]
    tools = head.get("tools")
    if set(head) != {"tools"} or not isinstance(tools, list):
        raise NotARequestPrefix("the first line is not the tools line of a hosted request")
    messages: list[Mapping[str, str]] = []
    for item in items[1:]:
        role, content = item.get("role"), item.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            raise NotARequestPrefix("a message line lacks a string role and content")
        messages.append({"role": role, "content": content})
    return StableRequest(tuple(t for t in tools if isinstance(t, Mapping)), tuple(messages))


def warmable_tokens(prefix_text: str, token_count: int, tokenize: Callable[[str], list[int]]) -> int:
    """Tokens of what a hosted box can warm of a stable prefix (its whole lines, `stable_request`), counted
    by `tokenize` (the profile's tokenizer); `token_count` is the whole prefix's count."""
    cut = prefix_text.rfind("\n") + 1
    if cut == len(prefix_text):
        return token_count
    return len(tokenize(prefix_text[:cut])) if cut else 0


def _parse_line(line: str) -> Mapping[str, object]:
    try:
        value = json.loads(line)
    except ValueError as exc:
        raise NotARequestPrefix(f"not a JSON line: {line[:60]!r}") from exc
    if not isinstance(value, dict):
        raise NotARequestPrefix("a line is not a JSON object")
    return value


# -- when keeping warm pays ------------------------------------------------------------------------------

KeepVerdict = Literal["keep", "too_few_calls", "calls_keep_it_warm", "below_floor"]


@dataclass(frozen=True, slots=True)
class KeepDecision:
    """Whether touching a prefix every `touch_seconds` costs less than the turn-1 misses it saves, with the
    figures (currency per minute) that decided it."""

    verdict: KeepVerdict
    touch_cost_per_minute: float
    miss_savings_per_minute: float
    misses_per_minute: float

    @property
    def keep(self) -> bool:
        return self.verdict == "keep"

    def describe(self) -> str:
        return (
            f"{self.verdict}: touching costs {self.touch_cost_per_minute:.6f}/min, the misses it saves"
            f" {self.miss_savings_per_minute:.6f}/min ({self.misses_per_minute:.3f} misses/min)"
        )


def keep_warm_decision(
    cache: ProviderCache,
    *,
    prefix_tokens: int,
    calls_per_minute: float,
    touch_seconds: float,
    touch_extra_tokens: int = FINAL_MESSAGE_ALLOWANCE_TOKENS,
) -> KeepDecision:
    """Keep a prefix warm on a hosted box only while touching it costs less than the misses it saves.

    Calls arrive at random (Poisson) at `calls_per_minute`; the provider drops the entry `lifetime` after its
    last use. Untouched, a call finds it gone when the gap since the previous call exceeds the lifetime:
    rate x exp(-rate x lifetime) misses a minute, each paying the prefix at the write price instead of the
    read price. Touched every `touch_seconds` (warmer does not see the calls, so every touch is sent), each
    touch reads the prefix and pays its few final-message tokens uncached. `calls_keep_it_warm`: the calls
    alone leave so few misses that touching costs more; `too_few_calls`: so few calls that the misses they
    would meet cost less than the touches.
    """
    if prefix_tokens < cache.min_cacheable_tokens:
        return KeepDecision("below_floor", 0.0, 0.0, 0.0)
    if not 0 < touch_seconds < cache.lifetime_seconds:
        raise ValueError("touch_seconds must be > 0 and shorter than the provider's cache lifetime")
    rate = max(0.0, calls_per_minute)
    lifetime_min = cache.lifetime_seconds / 60.0
    misses = rate * math.exp(-rate * lifetime_min)
    per_miss = prefix_tokens * (cache.cache_write_price - cache.cache_read_price) / 1e6
    per_touch = (prefix_tokens * cache.cache_read_price + touch_extra_tokens * cache.input_price) / 1e6
    cost = per_touch * 60.0 / touch_seconds
    savings = misses * per_miss
    if savings > cost:
        verdict: KeepVerdict = "keep"
    else:
        # which side of the peak (rate = 1 / lifetime) the call rate sits on says why it does not pay
        verdict = "calls_keep_it_warm" if rate * lifetime_min > 1.0 else "too_few_calls"
    return KeepDecision(verdict, cost, savings, misses)
