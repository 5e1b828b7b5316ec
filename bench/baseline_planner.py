"""The plan-building functions as they were before the per-box index and lazy actions: the baseline
`bench.plan_scale` measures `warmer.core.planner.plan` against (and checks it gives the same actions).
Kept verbatim, apart from importing the public types and the unchanged helpers from the current module.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass

from warmer.core.model import ModelProfile, WarmRecord, WarmState
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
from warmer.core.planner import (
    Desired,
    Observed,
    PlannerConfig,
    PrefixRef,
    WarmupStatus,
    active_agents,
)
from warmer.core.warm_budget import TokenBucket, WarmBudget, refill, try_spend
from warmer.core.warmstate import retry_at

_REASON_RANK = {
    WarmReason.PRECALL: 1,
    WarmReason.CAMPAIGN: 2,
    WarmReason.ASSIGNED: 3,
    WarmReason.KEEPALIVE: 4,
}
_PROBE_RANK = 5


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


@dataclass(slots=True)
class _Want:
    """One (box, prefix) we want kept warm, merged over the agents that share it."""

    prefix: PrefixRef
    reason: WarmReason
    agent_ids: list[str]


def _wanted_by_box(desired: Desired, active: Mapping[str, WarmReason]) -> dict[str, dict[str, _Want]]:
    wanted: dict[str, dict[str, _Want]] = {}
    for agent_id, reason in active.items():
        prefix = desired.agents[agent_id]
        for box_id in desired.assignment.get(agent_id, ()):
            per_box = wanted.setdefault(box_id, {})
            want = per_box.get(prefix.hash)
            if want is None:
                per_box[prefix.hash] = _Want(prefix, reason, [agent_id])
            else:
                want.agent_ids.append(agent_id)
                if _REASON_RANK[reason] < _REASON_RANK[want.reason]:
                    want.reason = reason
    return wanted


def baseline_plan(desired: Desired, observed: Observed, now: float, config: PlannerConfig) -> Plan:
    """Everything worth doing now, highest priority first, within each box's warm budget."""
    actions: list[Action] = []
    buckets: dict[str, TokenBucket] = dict(observed.buckets)
    wanted = _wanted_by_box(desired, active_agents(desired, now, config))
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


def _plan_box(
    view: _BoxView,
    wants: Mapping[str, _Want],
    observed: Observed,
    bucket: TokenBucket,
    budget: WarmBudget,
    now: float,
    config: PlannerConfig,
) -> tuple[list[Action], TokenBucket]:
    box_id, epoch, profile, busy = view.box_id, view.epoch, view.profile, view.busy
    current = {r.prefix_hash: r for r in view.records if r.epoch == epoch}
    bookkeeping: list[Action] = []  # no engine traffic: never budgeted
    for prefix_hash in sorted(current):
        held = current[prefix_hash]
        if held.state is WarmState.WARMING:
            if prefix_hash not in busy and held.updated_at < observed.trusted_after:
                # an earlier daemon's warm: no task of this process will ever finish it
                bookkeeping.append(
                    AbandonWarm(box_id, epoch, prefix_hash, "left warming by an earlier daemon")
                )
            elif prefix_hash not in busy and now - held.updated_at >= config.warming_timeout_seconds:
                bookkeeping.append(AbandonWarm(box_id, epoch, prefix_hash, "warm in flight was lost"))
        elif prefix_hash not in wants and held.state in (WarmState.WARM, WarmState.STALE):
            bookkeeping.append(Retire(box_id, epoch, prefix_hash, "not kept warm here: idle or moved"))
    # candidates: (rank, due time, prefix hash, action, mark-stale-first)
    candidates: list[tuple[int, float, str, WarmPrefix | ProbePrefix, MarkStale | None]] = []
    for prefix_hash, want in wants.items():
        if prefix_hash in busy:
            continue  # coalescing: one warm per (box, prefix) at a time
        record = current.get(prefix_hash)
        agents = tuple(sorted(want.agent_ids))
        tokens = want.prefix.tokens
        state = record.state if record is not None else WarmState.COLD
        if (
            record is None
            or state in (WarmState.COLD, WarmState.EVICTED)
            or (state is WarmState.FAILED and now >= retry_at(record, config.retry))
        ):
            warm = WarmPrefix(
                box_id, epoch, prefix_hash, tokens, profile.warm_requests_per_prefix, want.reason, agents
            )
            candidates.append((_REASON_RANK[want.reason], 0.0, prefix_hash, warm, None))
            continue
        if state not in (WarmState.WARM, WarmState.STALE):
            continue  # warming (handled above) or failed within its backoff
        due = keepalive_due_at(record, profile, config)
        if state is WarmState.STALE or (due is not None and now >= due):
            stale = MarkStale(box_id, epoch, prefix_hash) if state is WarmState.WARM else None
            touch = WarmPrefix(box_id, epoch, prefix_hash, tokens, 1, WarmReason.KEEPALIVE, agents)
            candidates.append((_REASON_RANK[WarmReason.KEEPALIVE], due or 0.0, prefix_hash, touch, stale))
            continue
        verified = record.verified_at if record.verified_at is not None else -math.inf
        if verified < observed.trusted_after:
            probe = ProbePrefix(box_id, epoch, prefix_hash, tokens, ProbeReason.UNTRUSTED, agents)
            candidates.append((_PROBE_RANK, verified, prefix_hash, probe, None))
        elif box_id in observed.suspect_boxes and now - verified >= config.probe_min_interval_seconds:
            probe = ProbePrefix(box_id, epoch, prefix_hash, tokens, ProbeReason.SUSPECT, agents)
            candidates.append((_PROBE_RANK, verified, prefix_hash, probe, None))

    chosen: list[Action] = []
    slots = budget.max_concurrent - len(busy)
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
    return bookkeeping + chosen, bucket
