"""Turn 1 as the field measures it: hit rates from per-call usage records, and why they are what they are.

Hit rate here is what the field reports use: cached prompt tokens / prompt tokens, summed over the requests
counted. Turn 1 is the figure that matters: a call's later turns reuse the call's own earlier turns and
fix themselves, while turn 1 starts warm only if something else left the agent's prefix in the cache the
request reaches. So the report splits the hit rate by turn index, by how many turns the call made, by a
grouping column (e.g. call direction), by box, and per agent into its two causes, which look the same in an
average and whose fixes do nothing for each other:

* depth: the share of a turn-1 prompt that is reusable at all (the stable prefix; from warmer's own
  computation for an agent warmer is configured with, else the deepest turn-1 hit in the records);
* coverage: the share of turn-1 requests that reached a cache holding it (a turn-1 request counts as warm
  when it reused at least half of the agent's depth, or 5% of its prompt if that is less: a few shared
  template tokens are not a warm cache).

Turn-1 hit rate is about depth x coverage. The cached-token distribution of turn-1 requests is listed with
each agent's dominant value: a spike far below the prompt length (the field report's exactly 1,024) is a
shared prefix that breaks at the same token on every call: the first per-call value sits there.

Pure: records in, a report out. The same function answers `warmer hitrate --calls` and `GET /v1/usage`.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from warmer.core.call_usage import UsageRecord
from warmer.core.hitrate import Bucket, ValueCount, cached_token_buckets, find_spike

DEFAULT_TURN_BUCKETS = 4  # turns 1, 2, 3, 4+ as in the field report
DEFAULT_DEPTH_OK = 0.5
DEFAULT_COVERAGE_OK = 0.8
WARM_MIN_SHARE = 0.05
SPIKE_MIN_SHARE = 0.2  # of an agent's turn-1 hits
SPIKE_MIN_COUNT = 5
SPIKE_BROKEN_BELOW = 0.5  # a dominant value covering less of the prompt than this is a broken prefix
# The smallest prefix OpenAI and Anthropic cache (OpenAI prompt caching guide: prompts of 1,024 tokens or
# more, cache hits in 128-token steps after that; Anthropic: 1,024 for most models, 2,048 for Haiku).
HOSTED_MIN_CACHEABLE_TOKENS = 1024


@dataclass(frozen=True, slots=True)
class CallUsageOptions:
    turn_buckets: int = DEFAULT_TURN_BUCKETS  # the last bucket is "N+"
    depth_ok: float = DEFAULT_DEPTH_OK
    coverage_ok: float = DEFAULT_COVERAGE_OK
    top: int = 10  # cached-token values listed

    def __post_init__(self) -> None:
        if self.turn_buckets < 1:
            raise ValueError("turn_buckets must be >= 1")
        if not (0.0 <= self.depth_ok <= 1.0 and 0.0 <= self.coverage_ok <= 1.0):
            raise ValueError("depth_ok and coverage_ok must be within [0, 1]")
        if self.top < 0:
            raise ValueError("top must be >= 0")


@dataclass(frozen=True, slots=True)
class HitRate:
    """Cached share of the prompt tokens of the requests under `label`."""

    label: str
    requests: int
    calls: int
    prompt_tokens: int
    cached_tokens: int
    hit_rate: float | None  # None: no prompt tokens


@dataclass(slots=True)
class _Tally:
    requests: int = 0
    prompt: int = 0
    cached: int = 0
    calls: set[str] = field(default_factory=set)

    def add(self, record: UsageRecord) -> None:
        self.requests += 1
        self.prompt += record.prompt_tokens
        self.cached += record.cached_tokens
        self.calls.add(record.call_id)

    def rate(self, label: str) -> HitRate:
        hit = self.cached / self.prompt if self.prompt else None
        return HitRate(label, self.requests, len(self.calls), self.prompt, self.cached, hit)


@dataclass(frozen=True, slots=True)
class GroupRates:
    """One value of the grouping column: its turn-1 and all-turn hit rates."""

    group: str
    turn1: HitRate
    all_turns: HitRate


@dataclass(frozen=True, slots=True)
class CachedSpike:
    """An agent's most common non-zero cached count on turn 1, when it dominates its turn-1 hits."""

    agent: str
    cached_tokens: int
    count: int
    share: float  # of the agent's turn-1 requests with a hit
    median_prompt_tokens: float
    cached_fraction_of_prompt: float
    step: int | None  # every cached count of the agent is a multiple of this (the cache's granularity)
    suspicious: bool  # far below the prompt length: the shared prefix breaks there
    meaning: str


@dataclass(frozen=True, slots=True)
class CachedDistribution:
    """Cached tokens per turn-1 request (later turns reuse their own call and would blur where the shared
    prefix stops)."""

    requests: int
    zero_hit_requests: int
    top_values: tuple[ValueCount, ...]
    buckets: tuple[Bucket, ...]
    spikes: tuple[CachedSpike, ...]


@dataclass(frozen=True, slots=True)
class AgentSplit:
    """Depth vs coverage of one agent's turn 1."""

    agent: str
    calls: int
    turn1_requests: int
    turn1_hit_rate: float | None
    depth: float | None  # reusable share of a turn-1 prompt
    depth_source: str  # "config": warmer's stable prefix; "log": the deepest turn-1 hit in the records
    depth_from_log: float | None
    coverage: float | None  # share of turn-1 requests that reached a warm cache
    warm_turn1_requests: int
    problem: str  # ok | depth | coverage | depth+coverage | no_data
    advice: str


@dataclass(frozen=True, slots=True)
class CallUsageReport:
    records: int
    calls: int
    no_cache_detail_records: int  # usage named no cached count: read as 0 (see warmer.core.call_usage)
    apis: dict[str, int]  # records per usage shape
    all_turns: HitRate
    turn1: HitRate
    by_turn: tuple[HitRate, ...]
    by_turns_in_call: tuple[HitRate, ...]
    by_group: tuple[GroupRates, ...]
    by_box: tuple[HitRate, ...]  # turn 1 only: where first turns landed
    distribution: CachedDistribution
    agents: tuple[AgentSplit, ...]
    depth_ok: float
    coverage_ok: float


def _bucket(turn: int, buckets: int) -> str:
    return str(turn) if turn < buckets else f"{buckets}+"


def _bucket_order(label: str) -> int:
    return int(label.rstrip("+"))


def _warm_floor_share(depth: float | None) -> float:
    return WARM_MIN_SHARE if depth is None else min(WARM_MIN_SHARE, depth / 2)


def is_warm_turn1(record: UsageRecord, depth: float | None) -> bool:
    """Whether a turn-1 request reached a cache holding its agent's prefix (see the module doc)."""
    floor = _warm_floor_share(depth) * record.prompt_tokens
    return record.cached_tokens > 0 and record.cached_tokens >= floor


def _advice(problem: str, depth: float, coverage: float) -> str:
    parts = []
    if "depth" in problem:
        parts.append(
            f"depth: only {depth:.0%} of a turn-1 prompt is reusable however warm the cache is; move every "
            "per-call value after the static part (`warmer lint` shows where the first one sits)"
        )
    if "coverage" in problem:
        parts.append(
            f"coverage: only {coverage:.0%} of first turns reached a cache holding the prefix; keep it warm "
            "where calls land (pre-call asks, campaigns, fewer boxes per agent); a deeper prefix does not "
            "help a request that reaches a cold cache"
        )
    return "; ".join(parts)


def _split(
    agent: str,
    turn1: list[UsageRecord],
    calls: int,
    stable_share: float | None,
    options: CallUsageOptions,
) -> AgentSplit:
    from_log = max((r.cached_tokens / r.prompt_tokens for r in turn1 if r.prompt_tokens), default=None)
    depth, source = (stable_share, "config") if stable_share is not None else (from_log, "log")
    tally = _Tally()
    for record in turn1:
        tally.add(record)
    rate = tally.rate(agent).hit_rate
    warm = sum(1 for r in turn1 if is_warm_turn1(r, depth))
    if not turn1 or depth is None:
        return AgentSplit(agent, calls, len(turn1), rate, depth, source, from_log, None, 0, "no_data", "")
    coverage = warm / len(turn1)
    shallow, missed = depth < options.depth_ok, coverage < options.coverage_ok
    problem = {(True, True): "depth+coverage", (True, False): "depth", (False, True): "coverage"}.get(
        (shallow, missed), "ok"
    )
    return AgentSplit(
        agent=agent,
        calls=calls,
        turn1_requests=len(turn1),
        turn1_hit_rate=rate,
        depth=depth,
        depth_source=source,
        depth_from_log=from_log,
        coverage=coverage,
        warm_turn1_requests=warm,
        problem=problem,
        advice=_advice(problem, depth, coverage),
    )


def _spike_meaning(agent: str, spike: CachedSpike, hits: int) -> str:
    name = agent or "(no agent)"
    head = (
        f"{name}: {spike.count} of {hits} turn-1 hits ({spike.share:.0%}) reused exactly "
        f"{spike.cached_tokens:,} tokens of ~{spike.median_prompt_tokens:,.0f}-token prompts "
        f"({spike.cached_fraction_of_prompt:.0%})"
    )
    if not spike.suspicious:
        return f"{head}: the agent's stable prefix, reused whole"
    where = f"just after token {spike.cached_tokens:,}"
    if spike.step is not None:
        where = (
            f"between token {spike.cached_tokens:,} and {spike.cached_tokens + spike.step:,} "
            f"(cached counts come in steps of {spike.step:,})"
        )
    text = f"{head}: the shared prefix breaks there on every call; the first per-call value sits {where}"
    if spike.cached_tokens == HOSTED_MIN_CACHEABLE_TOKENS:
        text += (
            "; 1,024 is the smallest prefix OpenAI and Anthropic cache, so a prefix that breaks a little "
            "past it is cached at exactly this floor and the rest of the prompt is recomputed on every call"
        )
    return text


def _agent_spike(agent: str, turn1: list[UsageRecord], step: int | None) -> CachedSpike | None:
    hits = [(r.prompt_tokens, r.cached_tokens) for r in turn1 if r.cached_tokens > 0]
    found = find_spike(
        hits, min_share=SPIKE_MIN_SHARE, min_count=SPIKE_MIN_COUNT, broken_below=SPIKE_BROKEN_BELOW
    )
    if found is None:
        return None
    spike = CachedSpike(
        agent=agent,
        cached_tokens=found.cached_tokens,
        count=found.count,
        share=found.share,
        median_prompt_tokens=found.median_prompt_tokens,
        cached_fraction_of_prompt=found.cached_fraction_of_prompt,
        step=step if step != found.cached_tokens else None,
        suspicious=found.suspicious,
        meaning="",
    )
    return dataclasses.replace(spike, meaning=_spike_meaning(agent, spike, len(hits)))


def _step(records: Iterable[UsageRecord]) -> int | None:
    """The gcd of an agent's non-zero cached counts over every turn, when it says something (> 1)."""
    step = 0
    for record in records:
        if record.cached_tokens:
            step = math.gcd(step, record.cached_tokens)
    return step if step > 1 else None


def analyze_call_usage(
    records: Iterable[UsageRecord],
    *,
    stable_shares: Mapping[str, float] | None = None,
    options: CallUsageOptions | None = None,
) -> CallUsageReport:
    """Every figure of the report over `records` (one per call and turn; a later duplicate replaces an
    earlier one). `stable_shares`: warmer's stable-prefix share of a turn-1 prompt per configured agent."""
    options = options or CallUsageOptions()
    shares = stable_shares or {}
    unique = list({(r.call_id, r.turn): r for r in records}.values())
    last_turn: dict[str, int] = defaultdict(int)
    for record in unique:
        last_turn[record.call_id] = max(last_turn[record.call_id], record.turn)
    every, first = _Tally(), _Tally()
    by_turn: dict[str, _Tally] = defaultdict(_Tally)
    by_length: dict[str, _Tally] = defaultdict(_Tally)
    groups: dict[str, tuple[_Tally, _Tally]] = defaultdict(lambda: (_Tally(), _Tally()))
    boxes: dict[str, _Tally] = defaultdict(_Tally)
    agent_records: dict[str, list[UsageRecord]] = defaultdict(list)
    agent_calls: dict[str, set[str]] = defaultdict(set)
    for record in unique:
        every.add(record)
        by_turn[_bucket(record.turn, options.turn_buckets)].add(record)
        by_length[_bucket(last_turn[record.call_id], options.turn_buckets)].add(record)
        group_all, group_first = groups[record.group]
        group_all.add(record)
        agent_records[record.agent].append(record)
        agent_calls[record.agent].add(record.call_id)
        if record.turn == 1:
            first.add(record)
            group_first.add(record)
            if record.box:
                boxes[record.box].add(record)
    turn1 = [r for r in unique if r.turn == 1]
    spikes, splits = _per_agent(agent_records, agent_calls, shares, options)
    return CallUsageReport(
        records=len(unique),
        calls=len(last_turn),
        no_cache_detail_records=sum(1 for r in unique if not r.cached_reported),
        apis=dict(sorted(Counter(r.api.value for r in unique).items())),
        all_turns=every.rate("all"),
        turn1=first.rate("1"),
        by_turn=tuple(by_turn[k].rate(k) for k in sorted(by_turn, key=_bucket_order)),
        by_turns_in_call=tuple(by_length[k].rate(k) for k in sorted(by_length, key=_bucket_order)),
        by_group=tuple(GroupRates(g, groups[g][1].rate(g), groups[g][0].rate(g)) for g in sorted(groups)),
        by_box=tuple(boxes[b].rate(b) for b in sorted(boxes)),
        distribution=_distribution(turn1, spikes, options.top),
        agents=tuple(splits),
        depth_ok=options.depth_ok,
        coverage_ok=options.coverage_ok,
    )


def _per_agent(
    agent_records: Mapping[str, list[UsageRecord]],
    agent_calls: Mapping[str, set[str]],
    shares: Mapping[str, float],
    options: CallUsageOptions,
) -> tuple[list[CachedSpike], list[AgentSplit]]:
    """Each agent's turn-1 spike (where it has one) and its depth vs coverage split."""
    spikes, splits = [], []
    for agent in sorted(agent_records):
        mine = agent_records[agent]
        agent_turn1 = [r for r in mine if r.turn == 1]
        spike = _agent_spike(agent, agent_turn1, _step(mine))
        if spike is not None:
            spikes.append(spike)
        splits.append(_split(agent, agent_turn1, len(agent_calls[agent]), shares.get(agent), options))
    return spikes, splits


def _distribution(
    turn1: Sequence[UsageRecord], spikes: Sequence[CachedSpike], top: int
) -> CachedDistribution:
    """The turn-1 cached-token distribution: the most frequent values, the buckets, the spikes."""
    values = Counter(r.cached_tokens for r in turn1)
    ranked = sorted(values.items(), key=lambda item: (-item[1], -item[0]))[:top]
    return CachedDistribution(
        requests=len(turn1),
        zero_hit_requests=values.get(0, 0),
        top_values=tuple(ValueCount(v, c, c / len(turn1)) for v, c in ranked),
        buckets=cached_token_buckets(r.cached_tokens for r in turn1),
        spikes=tuple(spikes),
    )


def call_usage_json(report: CallUsageReport) -> dict[str, object]:
    """The report as JSON-ready data: what `warmer hitrate --calls --json` prints and `GET /v1/usage`
    answers, key for key."""
    return asdict(report)
