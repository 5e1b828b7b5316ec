"""Level-triggered planning: compare what should be warm with what is, and say what to do next.

`plan(desired, observed, now, config)` is pure and idempotent in spirit: feed it the same world twice and it
asks for the same things, so a missed event or a daemon restart only delays a fix by one tick. The executor
(a service) carries out the actions (`warmer.core.plan_actions`) in order and reports results back as
warm-state events (`warmer.core.warmstate`). Readiness and routing are pure answers over the same data
(`warmer.core.readiness`).

Order of work per box: restart warm-up of the current epoch first (no prefix warm before it is done), then
prefixes of agents with pre-call asks, then active campaigns, then other active agents, then keepalive
touches, then probes. A per-box warm budget (concurrent requests, uncached tokens per second as a token
bucket: `warmer.core.warm_budget`) is never exceeded by a plan, and each (box, prefix) gets at most one
warm in flight.
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from warmer.core.model import BoxSpec, Campaign, ModelProfile, WarmRecord, WarmState
from warmer.core.plan_actions import (
    AbandonWarm,
    Action,
    MarkStale,
    Plan,
    ProbePrefix,
    ProbeReason,
    Retire,
    RunRestartWarmup,
    WarmPrefix,
    WarmReason,
)
from warmer.core.warm_budget import TokenBucket, WarmBudget, refill, try_spend
from warmer.core.warmstate import RetryBackoff, retry_at

# ----------------------------------------------------------------------------------------------- inputs


@dataclass(frozen=True, slots=True)
class PrefixRef:
    """An agent's current stable prefix, as far as planning cares: identity and size."""

    hash: str
    tokens: int


class WarmupStatus(enum.StrEnum):
    """Restart warm-up of one box in its current epoch."""

    NOT_STARTED = "not_started"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class BoxObservation:
    """What the engine and the store say about one box right now."""

    healthy: bool
    epoch: str | None  # None: not known yet (never answered)
    warmup: WarmupStatus = WarmupStatus.NOT_STARTED  # for `epoch`
    warmup_finished_at: float | None = None  # when warm-up of `epoch` ended (done or failed)
    draining: bool = False  # a rollout will restart it: it serves only what is not warm elsewhere yet


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    budget: WarmBudget = field(default_factory=WarmBudget)
    budget_overrides: Mapping[str, WarmBudget] = field(default_factory=dict)  # box id -> budget
    keepalive_overrides: Mapping[str, float] = field(default_factory=dict)  # box id -> seconds
    keepalive_jitter: float = 0.1  # touch between (1 - jitter) and 1 times the keepalive interval
    campaign_lead_seconds: float = 300.0
    retire_idle_after_seconds: float | None = 3600.0  # None: keep every assigned agent warm forever
    retry: RetryBackoff = field(default_factory=RetryBackoff)
    restart_warmup_retry_seconds: float = 30.0
    warming_timeout_seconds: float = 300.0  # a `warming` row with nothing in flight this old is abandoned
    probe_min_interval_seconds: float = 60.0  # probe a suspect (box, prefix) at most this often
    ramp_seconds: float = 60.0
    ramp_initial_weight: float = 0.1

    def __post_init__(self) -> None:
        if not 0.0 <= self.keepalive_jitter < 1.0:
            raise ValueError("keepalive_jitter must be in [0, 1)")
        if self.ramp_seconds < 0:
            raise ValueError("ramp_seconds must be >= 0")
        if not 0.0 < self.ramp_initial_weight <= 1.0:
            raise ValueError("ramp_initial_weight must be in (0, 1]")
        for box_id, seconds in self.keepalive_overrides.items():
            if seconds <= 0:
                raise ValueError(f"keepalive_overrides[{box_id!r}] must be > 0")

    def budget_for(self, box_id: str) -> WarmBudget:
        return self.budget_overrides.get(box_id, self.budget)


WarmKey = tuple[str, str, str]  # (box id, epoch, prefix hash)


@dataclass(frozen=True, slots=True)
class Desired:
    """What should be true.

    `assignment` is the keep-warm assignment (`placement.handover(...).keep_warm`): the boxes each agent's
    prefix must be warm on; `routing` (default: the same) is what traffic may use
    (`handover(...).routing`). `last_activity` is agent -> last traffic time; the service seeds it with the
    time it first saw an agent so a new agent is warmed before its first call.
    """

    boxes: Mapping[str, BoxSpec]
    profiles: Mapping[str, ModelProfile]  # model name -> profile
    agents: Mapping[str, PrefixRef]  # agent id -> current prefix
    assignment: Mapping[str, tuple[str, ...]]
    routing: Mapping[str, tuple[str, ...]] | None = None
    campaigns: Sequence[Campaign] = ()
    precall: frozenset[str] = frozenset()  # agents with a pending pre-call ask
    last_activity: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Observed:
    """What is true, as far as we know."""

    boxes: Mapping[str, BoxObservation]
    warm: Mapping[WarmKey, WarmRecord] = field(default_factory=dict)
    in_flight: frozenset[tuple[str, str]] = frozenset()  # (box id, prefix hash) warms/probes being sent
    buckets: Mapping[str, TokenBucket] = field(default_factory=dict)  # missing = full
    suspect_boxes: frozenset[str] = frozenset()  # hit rate says something was evicted: probe warm prefixes
    trusted_after: float = 0.0  # records verified before this (e.g. the daemon's start) get re-probed
    # ... and a `warming` row last written before it is an earlier daemon's, abandoned at once


# ----------------------------------------------------------------------------------------------- helpers


def jitter_unit(box_id: str, prefix_hash: str) -> float:
    """A stable number in [0, 1) per (box, prefix): spreads keepalives without randomness in tests."""
    digest = hashlib.blake2b(f"{box_id}\0{prefix_hash}".encode(), digest_size=8, person=b"warmer-jitter")
    return int.from_bytes(digest.digest(), "little") / 2.0**64


def keepalive_interval(box_id: str, prefix_hash: str, profile: ModelProfile, config: PlannerConfig) -> float:
    base = config.keepalive_overrides.get(box_id, profile.keepalive_seconds)
    return base * (1.0 - config.keepalive_jitter * jitter_unit(box_id, prefix_hash))


def keepalive_due_at(record: WarmRecord, profile: ModelProfile, config: PlannerConfig) -> float | None:
    """When the prefix should be touched again: last verification + a jittered interval just under the
    profile's keepalive (never later than it). None when the record was never verified."""
    if record.verified_at is None:
        return None
    return record.verified_at + keepalive_interval(record.box_id, record.prefix_hash, profile, config)


def campaign_active(campaign: Campaign, now: float, lead_seconds: float) -> bool:
    return campaign.starts_at - lead_seconds <= now < campaign.ends_at


def active_agents(desired: Desired, now: float, config: PlannerConfig) -> dict[str, WarmReason]:
    """Agents whose prefixes we keep warm, with the most urgent reason for each."""
    active: dict[str, WarmReason] = {}
    idle_after = config.retire_idle_after_seconds
    for agent_id, seen in desired.last_activity.items():
        if idle_after is None or now - seen <= idle_after:
            active[agent_id] = WarmReason.ASSIGNED
    if idle_after is None:
        for agent_id in desired.agents:
            active[agent_id] = WarmReason.ASSIGNED
    for campaign in desired.campaigns:
        if campaign_active(campaign, now, config.campaign_lead_seconds):
            active[campaign.agent_id] = WarmReason.CAMPAIGN
    for agent_id in desired.precall:
        active[agent_id] = WarmReason.PRECALL
    return {agent_id: why for agent_id, why in active.items() if agent_id in desired.agents}


_REASON_RANK = {
    WarmReason.PRECALL: 1,
    WarmReason.CAMPAIGN: 2,
    WarmReason.ASSIGNED: 3,
    WarmReason.KEEPALIVE: 4,
}
_PROBE_RANK = 5


@dataclass(slots=True)
class WantedPrefix:
    """One (box, prefix) we want kept warm, merged over the agents that share it."""

    prefix: PrefixRef
    reason: WarmReason
    agent_ids: list[str]


def wanted_by_box(desired: Desired, active: Mapping[str, WarmReason]) -> dict[str, dict[str, WantedPrefix]]:
    """Box -> prefix hash -> what is wanted there: the assignment of the active agents."""
    wanted: dict[str, dict[str, WantedPrefix]] = {}
    for agent_id, reason in active.items():
        prefix = desired.agents[agent_id]
        for box_id in desired.assignment.get(agent_id, ()):
            per_box = wanted.setdefault(box_id, {})
            want = per_box.get(prefix.hash)
            if want is None:
                per_box[prefix.hash] = WantedPrefix(prefix, reason, [agent_id])
            else:
                want.agent_ids.append(agent_id)
                if _REASON_RANK[reason] < _REASON_RANK[want.reason]:
                    want.reason = reason
    return wanted


# -------------------------------------------------------------------------------------------------- plan


def plan(desired: Desired, observed: Observed, now: float, config: PlannerConfig) -> Plan:
    """Everything worth doing now, highest priority first, within each box's warm budget."""
    actions: list[Action] = []
    buckets: dict[str, TokenBucket] = dict(observed.buckets)
    wanted = wanted_by_box(desired, active_agents(desired, now, config))
    records_by_box: dict[str, list[WarmRecord]] = {}
    for record in observed.warm.values():
        records_by_box.setdefault(record.box_id, []).append(record)
    busy_by_box: dict[str, set[str]] = {}
    for in_flight_box, in_flight_prefix in observed.in_flight:
        busy_by_box.setdefault(in_flight_box, set()).add(in_flight_prefix)
    for box_id in sorted(desired.boxes):
        box = desired.boxes[box_id]
        seen = observed.boxes.get(box_id)
        profile = desired.profiles.get(box.model)
        if seen is None or not seen.healthy or seen.epoch is None or profile is None:
            continue
        epoch = seen.epoch
        if seen.draining and seen.warmup is not WarmupStatus.DONE:
            continue  # restarted mid-rollout: its warm-up waits for the rollout to finish (a new epoch)
        if seen.warmup is WarmupStatus.NOT_STARTED or (
            seen.warmup is WarmupStatus.FAILED
            and now >= (seen.warmup_finished_at or 0.0) + config.restart_warmup_retry_seconds
        ):
            actions.append(RunRestartWarmup(box_id, epoch))
            continue
        if seen.warmup is not WarmupStatus.DONE:
            continue
        budget = config.budget_for(box_id)
        bucket = refill(buckets.get(box_id), budget, now)
        box_actions, bucket = _plan_box(
            _BoxView(box_id, epoch, profile, records_by_box.get(box_id, []), busy_by_box.get(box_id, set())),
            wanted.get(box_id, {}),
            observed,
            bucket,
            budget,
            now,
            config,
        )
        buckets[box_id] = bucket
        actions.extend(box_actions)
    return Plan(actions=tuple(actions), buckets=buckets)


@dataclass(frozen=True, slots=True)
class _BoxView:
    """One healthy, warmed-up box's slice of the observed world (indexed once per plan)."""

    box_id: str
    epoch: str
    profile: ModelProfile
    records: list[WarmRecord]  # every epoch; only the current one counts
    busy: set[str]  # prefix hashes with a warm/probe in flight


_Candidate = tuple[int, float, str, WarmPrefix | ProbePrefix, MarkStale | None]
# (rank, due time, prefix hash, action, mark-stale-first): sorted on the first three


def _plan_box(
    view: _BoxView,
    wants: Mapping[str, WantedPrefix],
    observed: Observed,
    bucket: TokenBucket,
    budget: WarmBudget,
    now: float,
    config: PlannerConfig,
) -> tuple[list[Action], TokenBucket]:
    current = {r.prefix_hash: r for r in view.records if r.epoch == view.epoch}
    bookkeeping = _bookkeeping(view, current, wants, observed, now, config)
    candidates: list[_Candidate] = []
    for prefix_hash, want in wants.items():
        if prefix_hash in view.busy:
            continue  # coalescing: one warm per (box, prefix) at a time
        candidate = _candidate(view, prefix_hash, want, current.get(prefix_hash), observed, now, config)
        if candidate is not None:
            candidates.append(candidate)
    chosen, bucket = _choose(candidates, budget.max_concurrent - len(view.busy), bucket, budget)
    return bookkeeping + chosen, bucket


def _bookkeeping(
    view: _BoxView,
    current: Mapping[str, WarmRecord],
    wants: Mapping[str, WantedPrefix],
    observed: Observed,
    now: float,
    config: PlannerConfig,
) -> list[Action]:
    """Record changes with no engine traffic (never budgeted): lost warms given up, unwanted ones retired."""
    box_id, epoch, busy = view.box_id, view.epoch, view.busy
    actions: list[Action] = []
    for prefix_hash in sorted(current):
        held = current[prefix_hash]
        if held.state is WarmState.WARMING:
            if prefix_hash not in busy and held.updated_at < observed.trusted_after:
                # an earlier daemon's warm: no task of this process will ever finish it
                actions.append(AbandonWarm(box_id, epoch, prefix_hash, "left warming by an earlier daemon"))
            elif prefix_hash not in busy and now - held.updated_at >= config.warming_timeout_seconds:
                actions.append(AbandonWarm(box_id, epoch, prefix_hash, "warm in flight was lost"))
        elif prefix_hash not in wants and held.state in (WarmState.WARM, WarmState.STALE):
            actions.append(Retire(box_id, epoch, prefix_hash, "not kept warm here: idle or moved"))
    return actions


def _candidate(
    view: _BoxView,
    prefix_hash: str,
    want: WantedPrefix,
    record: WarmRecord | None,
    observed: Observed,
    now: float,
    config: PlannerConfig,
) -> _Candidate | None:
    """The engine work one wanted prefix needs now, if any: a warm, a keepalive touch, or a probe."""
    box_id, epoch = view.box_id, view.epoch
    agents = tuple(sorted(want.agent_ids))
    tokens = want.prefix.tokens
    state = record.state if record is not None else WarmState.COLD
    if (
        record is None
        or state in (WarmState.COLD, WarmState.EVICTED)
        or (state is WarmState.FAILED and now >= retry_at(record, config.retry))
    ):
        requests = view.profile.warm_requests_per_prefix
        warm = WarmPrefix(box_id, epoch, prefix_hash, tokens, requests, want.reason, agents)
        return (_REASON_RANK[want.reason], 0.0, prefix_hash, warm, None)
    if state not in (WarmState.WARM, WarmState.STALE):
        return None  # warming (bookkeeping's) or failed within its backoff
    due = keepalive_due_at(record, view.profile, config)
    if state is WarmState.STALE or (due is not None and now >= due):
        stale = MarkStale(box_id, epoch, prefix_hash) if state is WarmState.WARM else None
        touch = WarmPrefix(box_id, epoch, prefix_hash, tokens, 1, WarmReason.KEEPALIVE, agents)
        return (_REASON_RANK[WarmReason.KEEPALIVE], due or 0.0, prefix_hash, touch, stale)
    verified = record.verified_at if record.verified_at is not None else -math.inf
    if verified < observed.trusted_after:
        probe = ProbePrefix(box_id, epoch, prefix_hash, tokens, ProbeReason.UNTRUSTED, agents)
        return (_PROBE_RANK, verified, prefix_hash, probe, None)
    if box_id in observed.suspect_boxes and now - verified >= config.probe_min_interval_seconds:
        probe = ProbePrefix(box_id, epoch, prefix_hash, tokens, ProbeReason.SUSPECT, agents)
        return (_PROBE_RANK, verified, prefix_hash, probe, None)
    return None


def _choose(
    candidates: list[_Candidate], slots: int, bucket: TokenBucket, budget: WarmBudget
) -> tuple[list[Action], TokenBucket]:
    """Highest priority first, as many as the free slots and the token bucket allow."""
    chosen: list[Action] = []
    for _, _, _, action, stale in sorted(candidates, key=lambda c: c[:3]):
        if stale is not None:
            chosen.append(stale)  # a due keepalive is recorded even when the budget defers the touch
        if slots <= 0:
            continue
        cost = action.prefix_tokens * (action.requests if isinstance(action, WarmPrefix) else 1)
        spent = try_spend(bucket, cost, budget)
        if spent is None:
            continue
        bucket = spent
        slots -= 1
        chosen.append(action)
    return chosen, bucket
