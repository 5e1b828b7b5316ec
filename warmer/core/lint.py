"""Prompt lint: how much of an agent's turn-1 prompt the cache can reuse, and what breaks it.

Per agent: the computed stable prefix vs the ideal one (the same prompt with every per-call value moved
to the dynamic tail), where the first per-call value sits, what that position costs per call, concrete
advice, and values in static text that look per-call (dates, times, phone numbers, ids, amounts).
Also tokenizer drift: the same prefix text tokenizing to a materially different count after an engine
or model upgrade (seen in the field: +8% from a tokenizer regression).

Pure: the renderer/tokenizer are injected; drift history is passed in (the store persists it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

from warmer.core.agents import AgentSpec, placeholder_sites, sample_values, with_values_frozen_in_static
from warmer.core.model import prefix_hash
from warmer.core.prefix import RenderFn, StablePrefix, TokenizeFn, compute_stable_prefix

Severity = Literal["error", "warning", "info"]

DEFAULT_DRIFT_THRESHOLD = 0.05


@dataclass(frozen=True, slots=True)
class Finding:
    code: str  # stable machine name, e.g. "per-call-value-in-static-text"
    severity: Severity
    message: str
    location: str = ""  # "block 'persona' line 3", "tools", ...
    advice: str = ""


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
    """Literal values in static blocks / few-shot messages that look per-call (dates, times, phones, ids)."""
    findings: list[Finding] = []
    texts = [(f"block '{b.name}'", b.text) for b in spec.blocks]
    texts += [(f"few_shot[{i}]", m.content) for i, m in enumerate(spec.few_shot)]
    for where, text in texts:
        for kind, value, line in looks_per_call(text):
            findings.append(
                Finding(
                    code=f"looks-per-call-{kind}",
                    severity="warning",
                    message=f"{kind} {value!r} in static text looks like a per-call value",
                    location=f"{where} line {line}",
                    advice="if it changes between calls, make it a placeholder in the dynamic tail; "
                    "if it is truly constant, ignore this",
                )
            )
    return findings


def lint_agent(
    spec: AgentSpec,
    render: RenderFn,
    tokenize: TokenizeFn,
    *,
    samples: int = 3,
    stable: StablePrefix | None = None,
) -> AgentLint:
    """Compute the stable prefix (unless given), compare it with the ideal layout, and explain the gap."""
    stable = stable or compute_stable_prefix(spec, render, tokenize, samples=samples)
    static_sites = [s for s in placeholder_sites(spec) if s.section != "tail"]
    if static_sites:
        ideal_spec = with_values_frozen_in_static(spec, sample_values(spec, 0))
        ideal_tokens = compute_stable_prefix(ideal_spec, render, tokenize, samples=samples).token_count
    else:
        ideal_tokens = stable.token_count
    ideal_tokens = max(ideal_tokens, stable.token_count)
    turn1 = stable.turn1_prompt_tokens
    wasted = ideal_tokens - stable.token_count
    site = stable.first_dynamic_site
    findings: list[Finding] = []

    for s in static_sites:
        tail_has_it = any(
            t.section == "tail" and t.placeholder == s.placeholder for t in placeholder_sites(spec)
        )
        findings.append(
            Finding(
                code="per-call-value-in-static-text",
                severity="error",
                message=f"{{{s.placeholder}}} is a per-call value in static text ({s.describe()})",
                location=s.describe(),
                advice=(
                    f"move {{{s.placeholder}}} from {s.describe()} to the dynamic tail"
                    + (" (it is already there: drop it here)" if tail_has_it else "")
                    + (
                        f"; that makes {wasted} more tokens per call cacheable"
                        if wasted and s == site
                        else ""
                    )
                ),
            )
        )

    if site is not None and site.section == "tail" and spec.tail.placement == "system_end" and spec.tools:
        if not stable.tools_reachable:
            findings.append(
                Finding(
                    code="tools-after-dynamic-tail",
                    severity="error",
                    message="the chat template renders the tool definitions after the system text, and the "
                    "dynamic tail is appended to the system text: every tool token is recomputed per call",
                    location="dynamic.placement",
                    advice='set [dynamic] placement = "message" so per-call values go in a final message '
                    "after the tools",
                )
            )
    elif site is not None and not stable.tools_reachable:
        findings.append(
            Finding(
                code="tools-after-dynamic-value",
                severity="error",
                message=f"tool definitions render after the first per-call value ({site.describe()})",
                location=site.describe(),
                advice=f"move {{{site.placeholder}}} to the dynamic tail",
            )
        )

    if wasted > 0 and site is not None:
        findings.append(
            Finding(
                code="early-per-call-value",
                severity="error",
                message=(
                    f"first per-call value {{{site.placeholder}}} at token "
                    f"{stable.first_dynamic_token_offset} of {turn1} ({site.describe()}): "
                    f"{wasted} tokens per call are recomputed that the layout could cache"
                ),
                location=site.describe(),
                advice=f"move {{{site.placeholder}}} from {site.describe()} to the dynamic tail",
            )
        )

    findings += scan_static_text(spec)
    return AgentLint(
        agent=spec.id,
        model=spec.model,
        prefix_hash=stable.hash,
        stable_prefix_tokens=stable.token_count,
        turn1_prompt_tokens=turn1,
        stable_share=stable.stable_share,
        ideal_stable_tokens=ideal_tokens,
        ideal_share=ideal_tokens / turn1 if turn1 else 0.0,
        first_dynamic_token_offset=stable.first_dynamic_token_offset,
        first_dynamic_location=site.describe() if site else None,
        first_dynamic_placeholder=site.placeholder if site else None,
        wasted_tokens_per_call=wasted,
        findings=tuple(findings),
    )


def shared_prefixes(stables: Sequence[StablePrefix]) -> dict[str, list[str]]:
    """prefix hash -> agents, for hashes shared by more than one agent (they share one cache entry)."""
    by_hash: dict[str, list[str]] = {}
    for s in stables:
        by_hash.setdefault(s.hash, []).append(s.agent)
    return {h: agents for h, agents in by_hash.items() if len(agents) > 1}


# --- tokenizer drift ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenCountObservation:
    """One recorded tokenization of a prefix.

    Keyed by `text_hash` (the prefix TEXT's identity, `prefix_hash(text)` without ids): a token-id hash
    changes precisely when the tokenizer does, so it cannot be the key that detects it.
    """

    text_hash: str
    model: str
    engine_version: str
    token_count: int
    at: float = 0.0

    @classmethod
    def of(cls, stable: StablePrefix, engine_version: str, at: float = 0.0) -> TokenCountObservation:
        return cls(prefix_hash(stable.text), stable.model, engine_version, stable.token_count, at)


def drift_baseline(
    history: Sequence[TokenCountObservation], current: TokenCountObservation
) -> TokenCountObservation | None:
    """What `current` is compared with: the newest observation of the same prefix text and model under
    another engine version (None when there is none, or it counted no tokens)."""
    earlier = [
        h
        for h in history
        if h.text_hash == current.text_hash
        and h.model == current.model
        and h.engine_version != current.engine_version
    ]
    if not earlier:
        return None
    previous = max(earlier, key=lambda h: h.at)
    return previous if previous.token_count > 0 else None


def detect_tokenizer_drift(
    history: Sequence[TokenCountObservation],
    current: TokenCountObservation,
    *,
    threshold: float = DEFAULT_DRIFT_THRESHOLD,
) -> Finding | None:
    """A finding when the same prefix text of the same model now tokenizes to a materially different count.

    Compares with the most recent earlier observation of (text_hash, model) under a different engine
    version; `threshold` is the relative change that counts as material (default 5%).
    """
    previous = drift_baseline(history, current)
    if previous is None:
        return None
    change = (current.token_count - previous.token_count) / previous.token_count
    if abs(change) < threshold:
        return None
    return Finding(
        code="tokenizer-drift",
        severity="error",
        message=(
            f"the same prefix tokenizes to {current.token_count} tokens on {current.engine_version} vs "
            f"{previous.token_count} on {previous.engine_version} ({change:+.1%}) for model {current.model}"
        ),
        location=f"prefix text {current.text_hash}",
        advice="check the engine's tokenizer after the upgrade (e.g. tokenizer_class in "
        "tokenizer_config.json); a regression makes every prefill longer",
    )
