"""Prompt lint: how much of an agent's turn-1 prompt the cache can reuse, and what breaks it.

Per agent: the computed stable prefix vs the ideal one (the same prompt with every per-call value moved
to the dynamic tail, and that tail rendered where nothing static comes after it), where the first per-call
value sits, what that position costs per call, concrete advice, and values in static text that look per-call
(dates, times, phone numbers, ids, amounts; repeats of one kind are one finding with a count).
Tokenizer drift, reported with these findings, is `warmer.core.tokenizer_drift`.

Pure: the renderer and tokenizer are injected.

Size: every finding compares the layouts computed once per agent here (as written, values frozen, ideal,
and for a hosted model the provider's floor against them); apart, each part would recompute them.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

from warmer.core.agent_requests import build_request, sample_values, with_values_frozen_in_static
from warmer.core.agents import AgentSpec, DynamicTail, PlaceholderSite, placeholder_sites
from warmer.core.errors import ConfigError
from warmer.core.hosted import ProviderCache, warmable_tokens
from warmer.core.prefix import RenderFn, StablePrefix, TokenizeFn, compute_stable_prefix

Severity = Literal["error", "warning", "info"]

# A repeated heuristic warning is one finding; this many of its places are listed (the rest are counted).
LISTED_PLACES = 3


@dataclass(frozen=True, slots=True)
class SpecPlace:
    """Where in an agent spec a finding points: a block, a few-shot message, the tail, or a spec field.

    `section` is "block" | "few_shot" | "tail" | "tools" | "field" | "spec"; `where` is the block name,
    "few_shot[i]", a field path such as "dynamic.placement", or "" for the spec as a whole; `line` is
    1-based within that text. Report formats (SARIF, GitHub annotations) turn it into a file and line.
    """

    section: str
    where: str = ""
    line: int = 1

    @classmethod
    def of(cls, site: PlaceholderSite) -> SpecPlace:
        return cls(site.section, site.where, site.line)

    def describe(self) -> str:
        if self.section == "block":
            return f"block '{self.where}' line {self.line}"
        if self.section == "tail":
            return f"the dynamic tail line {self.line}"
        if self.section == "few_shot":
            return f"{self.where} line {self.line}"
        return self.where or "the spec"


@dataclass(frozen=True, slots=True)
class Finding:
    code: str  # stable machine name, e.g. "per-call-value-in-static-text"
    severity: Severity
    message: str
    location: str = ""  # "block 'persona' line 3", "tools", ...
    advice: str = ""
    places: tuple[SpecPlace, ...] = ()  # the first LISTED_PLACES places it points at, in spec order
    count: int = 1  # how many occurrences this one finding stands for


@dataclass(frozen=True, slots=True)
class AgentLint:
    """Everything `warmer lint` reports for one agent (its JSON form is `as_json()`)."""

    agent: str
    model: str
    prefix_hash: str
    stable_prefix_tokens: int
    turn1_prompt_tokens: int
    stable_share: float
    ideal_stable_tokens: int
    ideal_share: float
    first_dynamic_token_offset: int
    first_dynamic_location: str | None
    first_dynamic_placeholder: str | None
    wasted_tokens_per_call: int
    findings: tuple[Finding, ...] = field(default_factory=tuple)
    tool_tokens: int = 0  # what the tool definitions add to every turn-1 prompt
    ideal_placement: str = "message"  # where the ideal layout renders the dynamic tail

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "error")

    def as_json(self) -> dict[str, object]:
        data = asdict(self)
        data["stable_share"] = round(self.stable_share, 4)
        data["ideal_share"] = round(self.ideal_share, 4)
        data["findings"] = [asdict(f) for f in self.findings]
        return data


# --- values that look per-call inside static text ---------------------------------------------------------

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
PER_CALL_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("uuid", re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")),
    ("date", re.compile(r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?(?:Z|[+-]\d{2}:?\d{2})?)?\b")),
    ("date", re.compile(r"\b\d{1,2}[/.]\d{1,2}[/.]\d{2,4}\b")),
    ("date", re.compile(rf"\b(?:\d{{1,2}}\s+{_MONTH}\s+\d{{4}}|{_MONTH}\s+\d{{1,2}},?\s+\d{{4}})\b")),
    (
        "time",
        re.compile(r"\b(?:[01]?\d|2[0-3]):[0-5]\d(?::[0-5]\d)?(?:\s?[ap]\.?m\.?)?(?!\d)", re.IGNORECASE),
    ),
    ("phone", re.compile(r"(?<![\w.])\+?\(?\d{1,4}\)?(?:[ .-]?\(?\d{2,4}\)?){2,4}(?![\w.])")),
    ("id", re.compile(r"\b(?=[A-Za-z0-9_-]*\d)(?=[A-Za-z0-9_-]*[A-Za-z])[A-Za-z0-9]{2,}[-_]\d{4,}\b")),
    ("id", re.compile(r"\b[0-9a-f]{16,}\b")),
    ("amount", re.compile(r"(?:[$€£₹¥]\s?\d[\d,]*\.\d{2}\b|\b\d[\d,]*\.\d{2}\s?(?:USD|EUR|GBP|INR)\b)")),
)


def looks_per_call(text: str) -> list[tuple[str, str, int]]:
    """(kind, matched text, 1-based line) for every value in `text` that looks like it changes per call."""
    hits: list[tuple[str, str, int, int]] = []
    taken: list[range] = []
    for kind, pattern in PER_CALL_PATTERNS:
        for match in pattern.finditer(text):
            span = range(match.start(), match.end())
            if any(span.start < t.stop and t.start < span.stop for t in taken):
                continue  # one value, one finding (a UUID is not also a phone number)
            if kind == "phone" and sum(c.isdigit() for c in match.group(0)) < 7:
                continue
            taken.append(span)
            hits.append((kind, match.group(0), text.count("\n", 0, match.start()) + 1, match.start()))
    hits.sort(key=lambda h: h[3])
    return [(kind, value, line) for kind, value, line, _ in hits]


def scan_static_text(spec: AgentSpec) -> list[Finding]:
    """Literal values in static blocks / few-shot messages that look per-call (dates, times, phones, ids).

    One finding per kind of value, with a count and the first LISTED_PLACES places: a reference table of
    opening hours is one warning to look at, not dozens that bury the errors.
    """
    by_kind: dict[str, list[tuple[str, SpecPlace]]] = {}
    texts = [(SpecPlace("block", b.name), b.text) for b in spec.blocks]
    texts += [(SpecPlace("few_shot", f"few_shot[{i}]"), m.content) for i, m in enumerate(spec.few_shot)]
    for base, text in texts:
        for kind, value, line in looks_per_call(text):
            by_kind.setdefault(kind, []).append((value, SpecPlace(base.section, base.where, line)))
    findings: list[Finding] = []
    for kind, hits in by_kind.items():
        listed = hits[:LISTED_PLACES]
        if len(hits) == 1:
            value = hits[0][0]
            message = f"{kind} {value!r} in static text looks like a per-call value"
        else:
            examples = ", ".join(f"{value!r} ({place.describe()})" for value, place in listed)
            more = f", and {len(hits) - len(listed)} more" if len(hits) > len(listed) else ""
            message = f"{len(hits)} values in static text look like a per-call {kind}: {examples}{more}"
        findings.append(
            Finding(
                code=f"looks-per-call-{kind}",
                severity="warning",
                message=message,
                location=listed[0][1].describe(),
                advice="if it changes between calls, make it a placeholder in the dynamic tail; "
                "if it is truly constant (a price list, opening hours), ignore this",
                places=tuple(place for _, place in listed),
                count=len(hits),
            )
        )
    return findings


def tool_token_cost(spec: AgentSpec, render: RenderFn, tokenize: TokenizeFn) -> int:
    """Tokens the tool definitions add to a turn-1 prompt (0 when the template does not render them)."""
    if not spec.tools:
        return 0
    request = build_request(spec, sample_values(spec, 0))
    with_tools = len(tokenize(render(request.messages, request.tools)))
    return max(0, with_tools - len(tokenize(render(request.messages, ()))))


def _as_own_message(spec: AgentSpec) -> AgentSpec:
    """The same spec with its dynamic tail rendered as its own final message (the recommended layout)."""
    role = spec.tail.role if spec.tail.role != "system" else "user"
    return dataclasses.replace(spec, tail=DynamicTail(spec.tail.template, role, "message"))


@dataclass(frozen=True, slots=True)
class _Layouts:
    """The spec as written, with its values moved to the tail (`frozen`), and at its best (`ideal`)."""

    stable: StablePrefix
    frozen: StablePrefix
    ideal: StablePrefix
    ideal_placement: str
    tools_behind: bool  # tool definitions stay behind a system-end tail even with every value in it
    few_shot_behind: bool  # so do the few-shot messages


def _layouts(
    spec: AgentSpec, stable: StablePrefix, render: RenderFn, tokenize: TokenizeFn, samples: int
) -> _Layouts:
    if any(s.section != "tail" for s in placeholder_sites(spec)):
        frozen_spec = with_values_frozen_in_static(spec, sample_values(spec, 0))
        frozen = compute_stable_prefix(frozen_spec, render, tokenize, samples=samples)
    else:
        frozen_spec, frozen = spec, stable
    # What stays behind a system-end tail once every value is in it: unreachable tools, few-shot turns.
    tail_first = frozen.first_dynamic_site is not None and frozen.first_dynamic_site.section == "tail"
    behind_tail = spec.tail.placement == "system_end" and tail_first
    tools_behind = behind_tail and bool(spec.tools) and not frozen.tools_reachable
    few_shot_behind = behind_tail and bool(spec.few_shot)
    ideal, ideal_placement = frozen, spec.tail.placement
    if tools_behind or few_shot_behind:
        try:
            ideal = compute_stable_prefix(_as_own_message(frozen_spec), render, tokenize, samples=samples)
            ideal_placement = "message"
        except ConfigError:  # the template refuses that message order: judge the layout as it is
            tools_behind = few_shot_behind = False
    return _Layouts(stable, frozen, ideal, ideal_placement, tools_behind, few_shot_behind)


def lint_agent(
    spec: AgentSpec,
    render: RenderFn,
    tokenize: TokenizeFn,
    *,
    samples: int = 3,
    stable: StablePrefix | None = None,
    provider: ProviderCache | None = None,
) -> AgentLint:
    """Compute the stable prefix (unless given), compare it with the ideal layout, and explain the gap.

    The ideal moves every per-call value to the dynamic tail AND renders that tail after everything
    static: a tail appended to the system text comes before what a template renders after the system
    message (tool definitions in many tool-calling templates, the few-shot messages always), so there
    the ideal renders the tail as its own final message instead.

    `provider`: the agent's model is a hosted API's (`warmer.core.hosted`), whose floor decides whether the
    prefix warms anything at all.
    """
    stable = stable or compute_stable_prefix(spec, render, tokenize, samples=samples)
    layouts = _layouts(spec, stable, render, tokenize, samples)
    turn1 = stable.turn1_prompt_tokens
    ideal_tokens = max(layouts.ideal.token_count, layouts.frozen.token_count, stable.token_count)
    # The ideal's own turn-1 length when its layout differs (a tail message adds the template's wrapper).
    ideal_turn1 = (
        layouts.ideal.turn1_prompt_tokens if layouts.ideal_placement != spec.tail.placement else turn1
    )
    tools_cost = tool_token_cost(spec, render, tokenize)
    site = stable.first_dynamic_site
    findings = _layout_findings(spec, layouts, ideal_tokens, tools_cost) + scan_static_text(spec)
    if provider is not None:
        findings += _floor_findings(stable, layouts.ideal, provider, tokenize)
    return AgentLint(
        agent=spec.id,
        model=spec.model,
        prefix_hash=stable.hash,
        stable_prefix_tokens=stable.token_count,
        turn1_prompt_tokens=turn1,
        stable_share=stable.stable_share,
        ideal_stable_tokens=ideal_tokens,
        ideal_share=min(1.0, ideal_tokens / ideal_turn1) if ideal_turn1 else 0.0,
        first_dynamic_token_offset=stable.first_dynamic_token_offset,
        first_dynamic_location=site.describe() if site else None,
        first_dynamic_placeholder=site.placeholder if site else None,
        wasted_tokens_per_call=ideal_tokens - stable.token_count,
        findings=tuple(findings),
        tool_tokens=tools_cost,
        ideal_placement=layouts.ideal_placement,
    )


def _floor_findings(
    stable: StablePrefix, ideal: StablePrefix, provider: ProviderCache, tokenize: TokenizeFn
) -> list[Finding]:
    """A prefix below the provider's minimum cacheable length warms nothing: no partial hit, zero."""
    warmable = warmable_tokens(stable.text, stable.token_count, tokenize)
    floor = provider.min_cacheable_tokens
    if warmable >= floor:
        return []
    best = warmable_tokens(ideal.text, ideal.token_count, tokenize)
    fixable = best >= floor
    advice = (
        f"move the per-call values to the dynamic tail: {best} tokens would then be warmable"
        if fixable
        else "nothing to gain from warming this agent on this provider unless its static prompt grows"
    )
    return [
        Finding(
            code="below-provider-cache-floor",
            severity="error" if fixable else "warning",
            message=(
                f"the stable prefix a hosted box can warm is {warmable} tokens (by this profile's tokenizer),"
                f" below the provider's minimum cacheable length of {floor}: warming it caches nothing"
            ),
            location="the spec",
            advice=advice,
            places=(SpecPlace("spec"),),
        )
    ]


_OWN_MESSAGE = 'render the dynamic tail as its own message: set [dynamic] placement = "message"'


def _move_advice(s: PlaceholderSite, tail_names: set[str]) -> str:
    if s.placeholder in tail_names:
        return f"drop {{{s.placeholder}}} from {s.describe()}: the dynamic tail already has it"
    return f"move {{{s.placeholder}}} from {s.describe()} to the dynamic tail"


def _layout_findings(spec: AgentSpec, layouts: _Layouts, ideal_tokens: int, tools_cost: int) -> list[Finding]:
    """What keeps the written layout from the ideal one, each with the change that fixes it."""
    stable = layouts.stable
    sites = placeholder_sites(spec)
    tail_names = {t.placeholder for t in sites if t.section == "tail"}
    static_gain = max(0, layouts.frozen.token_count - stable.token_count)  # from moving values alone
    placement_gain = ideal_tokens - stable.token_count - static_gain
    site = stable.first_dynamic_site
    findings: list[Finding] = []
    for s in sites:
        if s.section == "tail":
            continue
        gain = (
            f"; that makes {static_gain} more tokens per call cacheable" if static_gain and s == site else ""
        )
        findings.append(
            Finding(
                code="per-call-value-in-static-text",
                severity="error",
                message=f"{{{s.placeholder}}} is a per-call value in static text ({s.describe()})",
                location=s.describe(),
                advice=_move_advice(s, tail_names) + gain,
                places=(SpecPlace.of(s),),
            )
        )
    findings += _placement_findings(spec, layouts, tools_cost, placement_gain, tail_names)
    if static_gain > 0 and site is not None:
        findings.append(
            Finding(
                code="early-per-call-value",
                severity="error",
                message=(
                    f"first per-call value {{{site.placeholder}}} at token "
                    f"{stable.first_dynamic_token_offset} of {stable.turn1_prompt_tokens} "
                    f"({site.describe()}): {ideal_tokens - stable.token_count} tokens per call are "
                    "recomputed that the layout could cache"
                ),
                location=site.describe(),
                advice=_move_advice(site, tail_names) + (f", and {_OWN_MESSAGE}" if placement_gain else ""),
                places=(SpecPlace.of(site),),
            )
        )
    return findings


def _placement_findings(
    spec: AgentSpec, layouts: _Layouts, tools_cost: int, placement_gain: int, tail_names: set[str]
) -> list[Finding]:
    """Tool definitions and few-shot messages the template renders after a per-call part."""
    site = layouts.stable.first_dynamic_site
    findings: list[Finding] = []
    if layouts.tools_behind:
        findings.append(
            Finding(
                code="tools-after-dynamic-tail",
                severity="error",
                message="the chat template renders the tool definitions after the system text, and the "
                f"dynamic tail is appended to the system text: the {len(spec.tools)} tool definitions "
                f"({tools_cost} tokens) are recomputed on every call",
                location="dynamic.placement",
                advice=f"{_OWN_MESSAGE} (after the tools); that makes {placement_gain} more tokens per call "
                "cacheable",
                places=(SpecPlace("field", "dynamic.placement"),),
            )
        )
    elif site is not None and site.section != "tail" and not layouts.stable.tools_reachable:
        findings.append(
            Finding(
                code="tools-after-dynamic-value",
                severity="error",
                message=f"tool definitions ({tools_cost} tokens) render after the first per-call value "
                f"({site.describe()})",
                location=site.describe(),
                advice=_move_advice(site, tail_names),
                places=(SpecPlace.of(site),),
            )
        )
    if layouts.few_shot_behind:
        findings.append(
            Finding(
                code="few-shot-after-dynamic-tail",
                severity="error",
                message=f"the dynamic tail is appended to the system text, so the {len(spec.few_shot)} "
                "few-shot messages after it are recomputed on every call",
                location="dynamic.placement",
                advice=f"{_OWN_MESSAGE} (after the few-shot messages)",
                places=(SpecPlace("field", "dynamic.placement"),),
            )
        )
    return findings


def shared_prefixes(stables: Sequence[StablePrefix]) -> dict[str, list[str]]:
    """prefix hash -> agents, for hashes shared by more than one agent (they share one cache entry)."""
    by_hash: dict[str, list[str]] = {}
    for s in stables:
        by_hash.setdefault(s.hash, []).append(s.agent)
    return {h: agents for h, agents in by_hash.items() if len(agents) > 1}
