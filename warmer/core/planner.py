"""Level-triggered planning: compare what should be warm with what is, and say what to do next.

`plan(desired, observed, now, config)` is pure and idempotent in spirit: feed it the same world twice and it
asks for the same things, so a missed event or a daemon restart only delays a fix by one tick. The executor
(a service) carries out the actions (`warmer.core.plan_actions`) in order and reports results back as
warm-state events (`warmer.core.warmstate`). Readiness and routing are pure answers over the same data
(`warmer.core.readiness`). Each box is planned from its own slice of the world (`PlanIndex`), so
`plan_boxes` can re-plan one box, or the boxes of one agent after a pre-call ask, without a pass over the
fleet.

Order of work per box: restart warm-up of the current epoch first (no prefix warm before it is done), then
prefixes of agents with pre-call asks, then active campaigns, then other active agents, then keepalive
touches, then probes. A per-box warm budget (concurrent requests, uncached tokens per second as a token
bucket: `warmer.core.warm_budget`) is never exceeded by a plan, and each (box, prefix) gets at most one
warm in flight.

Size: the planner's inputs, the per-box index and the per-box plan read together (each rule of the plan is
a short function); actions, the warm budget and readiness have modules of their own.
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from warmer.core.hosted import keep_warm_decision
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
from warmer.core.warm_budget import TokenBucket, WarmBudget, refill
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
    # the boxes placement could give agents to when this was built (None: not tracked). A box outside
    # it has nothing assigned *yet* (it was restarting), which is not the same as needing nothing.
    placed: frozenset[str] | None = None
    # agent -> calls per minute (campaigns, pre-call asks): what keeping warm on a hosted box pays
    calls_per_minute: Mapping[str, float] = field(default_factory=dict)


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
    # per box, where it differs (several replicas: since this replica took the box's lease)
    trusted_after_by_box: Mapping[str, float] = field(default_factory=dict)

    def trusted_since(self, box_id: str) -> float:
        return self.trusted_after_by_box.get(box_id, self.trusted_after)


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
    touch: bool = True  # False: on a hosted box the calls alone keep it warm, keepalive touches only cost


def hosted_touch(desired: Desired, agent_id: str, box_id: str, reason: WarmReason) -> bool | None:
    """For an agent on a hosted provider's box (`warmer.core.hosted`): True to warm its prefix and keep it
    warm, False to warm it without keepalive touches (its calls keep it warm), None to leave it cold
    (touches would cost more than the misses they save, or it is below the provider's floor). A pending
    pre-call ask is always warmed; engine boxes always True."""
    box = desired.boxes.get(box_id)
    profile = desired.profiles.get(box.model) if box is not None else None
    if profile is None or profile.provider is None or reason is WarmReason.PRECALL:
        return True
    decision = keep_warm_decision(
        profile.provider,
        prefix_tokens=desired.agents[agent_id].tokens,
        calls_per_minute=desired.calls_per_minute.get(agent_id, 0.0),
        touch_seconds=min(profile.keepalive_seconds, 0.99 * profile.provider.lifetime_seconds),
    )
    if decision.keep:
        return True
    return False if decision.verdict == "calls_keep_it_warm" else None


def wanted_by_box(desired: Desired, active: Mapping[str, WarmReason]) -> dict[str, dict[str, WantedPrefix]]:
    """Box -> prefix hash -> what is wanted there: the assignment of the active agents."""
    wanted: dict[str, dict[str, WantedPrefix]] = {}
    for agent_id, reason in active.items():
        prefix = desired.agents[agent_id]
        for box_id in desired.assignment.get(agent_id, ()):
            touch = hosted_touch(desired, agent_id, box_id, reason)
            if touch is None:
                continue
            per_box = wanted.setdefault(box_id, {})
            want = per_box.get(prefix.hash)
            if want is None:
                per_box[prefix.hash] = WantedPrefix(prefix, reason, [agent_id], touch)
            else:
                want.touch = want.touch or touch
                want.agent_ids.append(agent_id)
                if _REASON_RANK[reason] < _REASON_RANK[want.reason]:
                    want.reason = reason
    return wanted


# -------------------------------------------------------------------------------------------------- plan


def plan(desired: Desired, observed: Observed, now: float, config: PlannerConfig) -> Plan:
    """Everything worth doing now, highest priority first, within each box's warm budget."""
    index = _index(desired, observed, now, config, for_edits=False)
    return plan_boxes(desired, observed, now, config, desired.boxes, index)


@dataclass(slots=True)
class PlanIndex:
    """Desired and observed sliced per box, so one box's actions — or the boxes of one agent — can be
    planned alone (`plan_boxes`) without a pass over the fleet. Valid for the `now` it was built at; keep
    it current with `set_box` / `refresh_agents` as records and agents change."""

    wants: dict[str, dict[str, WantedPrefix]]  # box -> prefix hash -> what is wanted there
    records: dict[str, list[WarmRecord]]  # box -> its records (every epoch; only the current one counts)
    busy: dict[str, set[str]]  # box -> prefix hashes with a warm/probe in flight
    assigned: dict[str, set[str]]  # box -> agents whose keep-warm assignment has it (active or not)
    groups: dict[str, tuple[str, ...]]  # the keep-warm assignment as indexed

    def set_box(self, box_id: str, records: Sequence[WarmRecord], busy: Collection[str]) -> None:
        """The box's records and warms in flight as they are now."""
        self.records[box_id] = list(records)
        self.busy[box_id] = set(busy)

    def refresh_agents(
        self, desired: Desired, now: float, config: PlannerConfig, agent_ids: Collection[str]
    ) -> set[str]:
        """Re-derive what is wanted on the boxes of these agents, before and after their change (a new
        assignment, prefix, activity, campaign or pre-call ask); returns the boxes to plan again."""
        boxes: set[str] = set()
        for agent_id in agent_ids:
            for box_id in self.groups.pop(agent_id, ()):
                self.assigned.get(box_id, set()).discard(agent_id)
                boxes.add(box_id)
            group = desired.assignment.get(agent_id, ())
            if group:
                self.groups[agent_id] = tuple(group)
            for box_id in group:
                self.assigned.setdefault(box_id, set()).add(agent_id)
                boxes.add(box_id)
        for box_id in boxes:
            sharing = _only(desired, self.assigned.get(box_id, set()))
            self.wants[box_id] = wanted_by_box(sharing, active_agents(sharing, now, config)).get(box_id, {})
        return boxes


def _only(desired: Desired, agent_ids: Collection[str]) -> Desired:
    """The desired world restricted to some agents (what their boxes need depends on them alone)."""
    return replace(
        desired,
        agents={a: desired.agents[a] for a in agent_ids if a in desired.agents},
        assignment={a: desired.assignment[a] for a in agent_ids if a in desired.assignment},
        campaigns=tuple(c for c in desired.campaigns if c.agent_id in agent_ids),
        precall=frozenset(a for a in desired.precall if a in agent_ids),
        last_activity={a: desired.last_activity[a] for a in agent_ids if a in desired.last_activity},
    )


def _wants_by_box(desired: Desired, active: Mapping[str, WarmReason]) -> dict[str, dict[str, WantedPrefix]]:
    """`wanted_by_box` for a whole fleet, faster: one `WantedPrefix` per agent, shared by every box of its
    group, and a merged copy where agents share a prefix on a box (so a shared one is never changed).
    Plans only read wants."""
    wanted: dict[str, dict[str, WantedPrefix]] = {}
    agents, assignment = desired.agents, desired.assignment
    for agent_id, reason in active.items():
        group = assignment.get(agent_id)
        if not group:
            continue
        touch = hosted_touch(desired, agent_id, group[0], reason)  # a group is one model's boxes
        if touch is None:
            continue
        prefix = agents[agent_id]
        mine = WantedPrefix(prefix, reason, [agent_id], touch)
        for box_id in group:
            per_box = wanted.get(box_id)
            if per_box is None:
                wanted[box_id] = {prefix.hash: mine}
                continue
            want = per_box.get(prefix.hash)
            if want is None:
                per_box[prefix.hash] = mine
            else:
                better = reason if _REASON_RANK[reason] < _REASON_RANK[want.reason] else want.reason
                merged = [*want.agent_ids, agent_id]
                per_box[prefix.hash] = WantedPrefix(want.prefix, better, merged, want.touch or touch)
    return wanted


def index_plan(desired: Desired, observed: Observed, now: float, config: PlannerConfig) -> PlanIndex:
    """One pass over the fleet: what is wanted, held and in flight on each box."""
    return _index(desired, observed, now, config, for_edits=True)


def _index(
    desired: Desired, observed: Observed, now: float, config: PlannerConfig, *, for_edits: bool
) -> PlanIndex:
    """`for_edits`: also who is assigned where, which only `refresh_agents` reads (a one-off full plan
    skips it: 40,800 memberships at fleet scale)."""
    records: dict[str, list[WarmRecord]] = {}
    for record in observed.warm.values():
        box_records = records.get(record.box_id)
        if box_records is None:
            records[record.box_id] = [record]
        else:
            box_records.append(record)
    busy: dict[str, set[str]] = {}
    for in_flight_box, in_flight_prefix in observed.in_flight:
        busy.setdefault(in_flight_box, set()).add(in_flight_prefix)
    assigned: dict[str, set[str]] = {}
    groups: dict[str, tuple[str, ...]] = {}
    if for_edits:
        for agent_id, group in desired.assignment.items():
            for box_id in group:
                assigned.setdefault(box_id, set()).add(agent_id)
        groups = {a: tuple(g) for a, g in desired.assignment.items() if g}
    wants = _wants_by_box(desired, active_agents(desired, now, config))
    return PlanIndex(wants=wants, records=records, busy=busy, assigned=assigned, groups=groups)


def plan_boxes(
    desired: Desired,
    observed: Observed,
    now: float,
    config: PlannerConfig,
    box_ids: Collection[str],
    index: PlanIndex,
) -> Plan:
    """`plan` for these boxes only, in the same order and with the same actions `plan` gives them; the
    buckets are `observed.buckets` with these boxes' charged."""
    actions: list[Action] = []
    buckets: dict[str, TokenBucket] = dict(observed.buckets)
    for box_id in sorted(box_ids):
        box = desired.boxes.get(box_id)
        seen = observed.boxes.get(box_id)
        profile = desired.profiles.get(box.model) if box is not None else None
        if seen is None or not seen.healthy or seen.epoch is None or profile is None:
            continue
        if seen.draining and seen.warmup is not WarmupStatus.DONE:
            continue  # restarted mid-rollout: its warm-up waits for the rollout to finish (a new epoch)
        if seen.warmup is WarmupStatus.NOT_STARTED or (
            seen.warmup is WarmupStatus.FAILED
            and now >= (seen.warmup_finished_at or 0.0) + config.restart_warmup_retry_seconds
        ):
            actions.append(RunRestartWarmup(box_id, seen.epoch))
            continue
        if seen.warmup is not WarmupStatus.DONE:
            continue
        budget = config.budget_for(box_id)
        view = _BoxView(
            box_id, seen.epoch, profile, index.records.get(box_id, []), index.busy.get(box_id, set())
        )
        wants = index.wants.get(box_id, {})
        box_actions, bucket = _plan_box(
            view, wants, observed, refill(buckets.get(box_id), budget, now), budget, now, config
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


# A warm, keepalive touch or probe worth sending, built into an action only once the budget takes it
# (most are deferred): (rank, due time, prefix hash, kind, want, mark stale first)
_Candidate = tuple[int, float, str, "_Kind", WantedPrefix, bool]


class _Kind(enum.Enum):
    WARM = "warm"
    TOUCH = "touch"
    UNTRUSTED = "untrusted"
    SUSPECT = "suspect"


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
    bookkeeping = _bookkeeping(
        view, current, wants, observed, now, config
    )  # no engine traffic: never budgeted
    candidates = _candidates(view, current, wants, observed, now, config)
    chosen, bucket = _choose(view, sorted(candidates), bucket, budget)
    return bookkeeping + chosen, bucket


def _bookkeeping(
    view: _BoxView,
    current: Mapping[str, WarmRecord],
    wants: Mapping[str, WantedPrefix],
    observed: Observed,
    now: float,
    config: PlannerConfig,
) -> list[Action]:
    box_id, epoch, busy = view.box_id, view.epoch, view.busy
    actions: list[Action] = []
    for prefix_hash in sorted(current):
        held = current[prefix_hash]
        if held.state is WarmState.WARMING:
            if prefix_hash not in busy and held.updated_at < observed.trusted_since(box_id):
                # an earlier daemon's (or lease holder's) warm: no task of this process will ever finish it
                actions.append(AbandonWarm(box_id, epoch, prefix_hash, "left warming by an earlier daemon"))
            elif prefix_hash not in busy and now - held.updated_at >= config.warming_timeout_seconds:
                actions.append(AbandonWarm(box_id, epoch, prefix_hash, "warm in flight was lost"))
        elif prefix_hash not in wants and held.state in (WarmState.WARM, WarmState.STALE):
            why = "not kept warm here: idle or moved"
            if view.profile.provider is not None:
                why += ", or too few calls for keepalive touches to cost less than the misses they save"
            actions.append(Retire(box_id, epoch, prefix_hash, why))
    return actions


def _candidates(
    view: _BoxView,
    current: Mapping[str, WarmRecord],
    wants: Mapping[str, WantedPrefix],
    observed: Observed,
    now: float,
    config: PlannerConfig,
) -> list[_Candidate]:
    box_id, busy = view.box_id, view.busy
    base = config.keepalive_overrides.get(box_id, view.profile.keepalive_seconds)
    not_due_before = base * (1.0 - config.keepalive_jitter)  # the jittered interval is never shorter
    suspect = box_id in observed.suspect_boxes
    candidates: list[_Candidate] = []
    for prefix_hash, want in wants.items():
        if prefix_hash in busy:
            continue  # coalescing: one warm per (box, prefix) at a time
        record = current.get(prefix_hash)
        state = record.state if record is not None else WarmState.COLD
        if (
            record is None
            or state in (WarmState.COLD, WarmState.EVICTED)
            or (state is WarmState.FAILED and now >= retry_at(record, config.retry))
        ):
            candidates.append((_REASON_RANK[want.reason], 0.0, prefix_hash, _Kind.WARM, want, False))
            continue
        if state not in (WarmState.WARM, WarmState.STALE):
            continue  # warming (handled above) or failed within its backoff
        verified = record.verified_at
        due_check = state is WarmState.STALE or (verified is not None and now >= verified + not_due_before)
        if want.touch and due_check:  # no touches for a hosted prefix its own calls keep warm: they only cost
            due = keepalive_due_at(record, view.profile, config)
            if state is WarmState.STALE or (due is not None and now >= due):
                touch = (_REASON_RANK[WarmReason.KEEPALIVE], due or 0.0, prefix_hash, _Kind.TOUCH, want, True)
                candidates.append(touch if state is WarmState.WARM else (*touch[:5], False))
                continue
        checked = verified if verified is not None else -math.inf
        if checked < observed.trusted_since(view.box_id):
            candidates.append((_PROBE_RANK, checked, prefix_hash, _Kind.UNTRUSTED, want, False))
        elif suspect and now - checked >= config.probe_min_interval_seconds:
            candidates.append((_PROBE_RANK, checked, prefix_hash, _Kind.SUSPECT, want, False))
    return candidates


def _choose(
    view: _BoxView, candidates: Sequence[_Candidate], bucket: TokenBucket, budget: WarmBudget
) -> tuple[list[Action], TokenBucket]:
    """Highest priority first while request slots and the token bucket allow (`try_spend`'s rule)."""
    box_id, epoch = view.box_id, view.epoch
    chosen: list[Action] = []
    slots = budget.max_concurrent - len(view.busy)
    tokens, burst = bucket.tokens, budget.burst_tokens
    for _, _, prefix_hash, kind, want, stale in candidates:
        if stale:
            chosen.append(MarkStale(box_id, epoch, prefix_hash))  # recorded even when the touch is deferred
        if slots <= 0:
            continue
        requests = view.profile.warm_requests_per_prefix if kind is _Kind.WARM else 1
        cost = want.prefix.tokens * requests
        if not (cost <= tokens or tokens >= burst):
            continue
        tokens -= cost
        slots -= 1
        chosen.append(_action(view, kind, want, prefix_hash, requests))
    return chosen, bucket if tokens == bucket.tokens else replace(bucket, tokens=tokens)


def _action(
    view: _BoxView, kind: _Kind, want: WantedPrefix, prefix_hash: str, requests: int
) -> WarmPrefix | ProbePrefix:
    agents = tuple(sorted(want.agent_ids))
    tokens = want.prefix.tokens
    if kind is _Kind.WARM:
        return WarmPrefix(view.box_id, view.epoch, prefix_hash, tokens, requests, want.reason, agents)
    if kind is _Kind.TOUCH:
        return WarmPrefix(view.box_id, view.epoch, prefix_hash, tokens, 1, WarmReason.KEEPALIVE, agents)
    reason = ProbeReason.UNTRUSTED if kind is _Kind.UNTRUSTED else ProbeReason.SUSPECT
    return ProbePrefix(view.box_id, view.epoch, prefix_hash, tokens, reason, agents)
