"""Readiness and routing views: what `GET /v1/boxes`, `/v1/boxes/{id}/ready`, `/v1/routes` and
`warmer status` show.

Answers come from the reconciler's in-memory view (a snapshot, consistent within one answer) plus the
restart phases from the store. Readiness and routes are the planner's own pure answers (`box_ready`,
`routes`), so what the API says is exactly what the reconciler acts on. A warm record verified before this
daemon started is shown but does not count as warm until a probe renews it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from warmer.core.errors import WarmerError
from warmer.core.model import PhaseRecord, WarmRecord, WarmState
from warmer.core.readiness import Route, boxes_ready, ramp_weight
from warmer.ports import StorePort
from warmer.service.reconciler import Reconciler, Snapshot


class StatusUnavailable(WarmerError):
    """The API was built without box status (`ApiServices.status` unset): answer 503."""


@dataclass(frozen=True, slots=True)
class PhaseView:
    phase: str
    started_at: float
    finished_at: float | None
    wall_seconds: float | None
    engine_seconds: float | None
    requests: int
    ok: bool | None
    error: str | None


@dataclass(frozen=True, slots=True)
class PrefixView:
    prefix_hash: str
    agents: tuple[str, ...]  # agents on this box whose stable prefix this is
    state: str  # a WarmState value; "cold" when nothing was ever written
    trusted: bool  # False: verified before this daemon started, re-probe pending
    tokens: int
    verified_cached_tokens: int | None
    attempts: int
    warmed_at: float | None
    verified_at: float | None
    last_error: str | None


@dataclass(frozen=True, slots=True)
class TimeToReadyView:
    """Daemon overhead made visible: wall time from health up to ready next to the engine's own time.

    A resumed epoch (an earlier daemon ran its restart warm-up) has no time to ready or overhead this
    daemon could know: those are None and `reverify_seconds` says how long its re-verification took."""

    at: float
    time_to_ready_seconds: float | None
    engine_seconds: float | None
    warmup_engine_seconds: float | None
    prefix_engine_seconds: float | None
    overhead_fraction: float | None
    resumed: bool = False
    reverify_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class ReadyView:
    box_id: str
    ready: bool
    reasons: tuple[str, ...]
    since: float | None
    weight: float  # ramp weight now (0 when not ready)


@dataclass(frozen=True, slots=True)
class AdmitView:
    """The admission gate's answer for one box (`warmer.core.gate`): `admit` is what a readiness probe acts
    on; `ready` stays the truth, so a box let in while not ready says so, with the rule and the reason."""

    box_id: str
    admit: bool
    ready: bool
    reason: str
    release: str | None  # latched, held_too_long or share when let in while not ready
    reasons: tuple[str, ...]  # why not ready (empty when ready)


@dataclass(frozen=True, slots=True)
class BoxView:
    id: str
    base_url: str
    engine: str
    model: str
    slots: int
    healthy: bool
    health_error: str | None  # the last failed poll's detail, e.g. "GET /health answered 503: loading"
    epoch: str | None
    warmup: str  # restart warm-up of the current epoch: not_started, running, done, failed
    warmup_error: str | None
    ready: ReadyView
    phases: tuple[PhaseView, ...]
    prefixes: tuple[PrefixView, ...]
    time_to_ready: TimeToReadyView | None
    health_slow_polls: int = 0  # late health answers in a row it kept its routes through
    # several replicas: the replica holding the box's lease (it sends the box's warms and probes), null
    # while none does; `held_here`: this replica. Alone, lease_holder is null and held_here true.
    lease_holder: str | None = None
    held_here: bool = True
    # how the last health poll failed: refused, connect_timeout, unreachable, timeout, http_status,
    # unhealthy, epoch (null while healthy)
    health_error_kind: str | None = None


@dataclass(frozen=True, slots=True)
class AgentRoutes:
    agent_id: str
    prefix_hash: str | None
    prefix_tokens: int | None
    routes: tuple[Route, ...]  # spill order; only boxes where THIS agent's prefix is verified warm
    error: str | None = None  # why the agent has no prefix (e.g. its profile cannot render offline)


class StatusQueries(Protocol):
    """What the API and `warmer status` ask; `StatusService` answers, tests may fake it."""

    async def boxes(self) -> list[BoxView]: ...

    async def box(self, box_id: str) -> BoxView | None: ...

    async def ready(self, box_id: str) -> ReadyView | None: ...

    async def routes(self) -> list[AgentRoutes]: ...

    async def admit(self, box_id: str) -> AdmitView | None: ...


def admission_of(snapshot: Snapshot, box_id: str) -> AdmitView:
    """The box's own readiness, now; when it is not ready, the gate's answer from the last pass if it was
    given for the box's current epoch (the gate looks at the whole model, so it is computed once a pass,
    not once a probe), else held."""
    ready = readiness_of(snapshot, box_id)
    if ready.ready:
        return AdmitView(box_id, True, True, "ready", None, ())
    live = snapshot.live.get(box_id)
    epoch = live.epoch if live is not None else None
    given = snapshot.gate_answers.get(box_id)
    if given is not None and given[0] == epoch and given[1].released:
        answer = given[1]
        return AdmitView(box_id, True, False, answer.reason, answer.release, ready.reasons)
    return AdmitView(box_id, False, False, "held until ready", None, ready.reasons)


def readiness_of(snapshot: Snapshot, box_id: str) -> ReadyView:
    return readiness_all(snapshot, (box_id,))[box_id]


def readiness_all(snapshot: Snapshot, box_ids: Iterable[str]) -> dict[str, ReadyView]:
    """`readiness_of` for many boxes, the fleet-wide part of readiness computed once (`boxes_ready`)."""
    ids = list(box_ids)
    if snapshot.desired is None:
        return {
            box_id: ReadyView(box_id, False, ("starting: no reconcile pass yet",), None, 0.0)
            for box_id in ids
        }
    answers = boxes_ready(ids, snapshot.desired, snapshot.observed, snapshot.now, snapshot.config)
    views = {}
    for box_id, answer in answers.items():
        since = answer.since
        weight = ramp_weight(since, snapshot.now, snapshot.config) if since is not None else 0.0
        views[box_id] = ReadyView(
            box_id, answer.ready, answer.reasons, since, weight if answer.ready else 0.0
        )
    return views


def _phase_view(record: PhaseRecord) -> PhaseView:
    wall = None if record.finished_at is None else record.finished_at - record.started_at
    return PhaseView(
        phase=record.phase.value,
        started_at=record.started_at,
        finished_at=record.finished_at,
        wall_seconds=wall,
        engine_seconds=record.engine_seconds,
        requests=record.requests,
        ok=record.ok,
        error=record.error,
    )


@dataclass(frozen=True, slots=True)
class _BoxIndex:
    """The snapshot's assignment and records by box, built once per answer: a fleet view reads each box's
    own share instead of scanning every agent and record of the fleet for each box."""

    agents_by_hash: dict[str, dict[str, list[str]]]  # box -> prefix hash -> agents assigned there
    tokens_by_hash: dict[str, int]  # prefix hash -> its token count
    records: dict[str, dict[str, WarmRecord]]  # box -> prefix hash -> record of the box's current epoch

    @classmethod
    def of(cls, snapshot: Snapshot, box_ids: Collection[str]) -> _BoxIndex:
        agents_by_hash: dict[str, dict[str, list[str]]] = {}
        tokens_by_hash: dict[str, int] = {}
        wanted = set(box_ids)
        if snapshot.desired is not None:
            for agent_id, group in snapshot.desired.assignment.items():
                ref = snapshot.desired.agents.get(agent_id)
                if ref is None:
                    continue
                for box_id in group:
                    if box_id in wanted:
                        agents_by_hash.setdefault(box_id, {}).setdefault(ref.hash, []).append(agent_id)
                        tokens_by_hash[ref.hash] = ref.tokens
        records: dict[str, dict[str, WarmRecord]] = {}
        for (box_id, epoch, prefix_hash), record in snapshot.records.items():
            live = snapshot.live.get(box_id)
            if box_id in wanted and live is not None and live.epoch == epoch:
                records.setdefault(box_id, {})[prefix_hash] = record
        return cls(agents_by_hash, tokens_by_hash, records)


def _prefix_views(snapshot: Snapshot, index: _BoxIndex, box_id: str) -> tuple[PrefixView, ...]:
    agents_by_hash = index.agents_by_hash.get(box_id, {})
    records = index.records.get(box_id, {})
    views = []
    for prefix_hash in sorted(set(agents_by_hash) | set(records)):
        record = records.get(prefix_hash)
        trusted = record is None or (box_id, record.epoch, prefix_hash) in snapshot.observed.warm
        views.append(
            PrefixView(
                prefix_hash=prefix_hash,
                agents=tuple(sorted(agents_by_hash.get(prefix_hash, ()))),
                state=(record.state if record is not None else WarmState.COLD).value,
                trusted=trusted,
                tokens=record.prefix_tokens
                if record is not None
                else index.tokens_by_hash.get(prefix_hash, 0),
                verified_cached_tokens=record.verified_cached_tokens if record is not None else None,
                attempts=record.attempts if record is not None else 0,
                warmed_at=record.warmed_at if record is not None else None,
                verified_at=record.verified_at if record is not None else None,
                last_error=record.last_error if record is not None else None,
            )
        )
    return tuple(views)


class StatusService:
    """Builds the views from a reconciler snapshot and the store's restart phases."""

    def __init__(self, reconciler: Reconciler, store: StorePort) -> None:
        self._reconciler = reconciler
        self._store = store

    async def boxes(self) -> list[BoxView]:
        snapshot = self._reconciler.snapshot()
        return await self._box_views(snapshot, sorted(snapshot.boxes))

    async def box(self, box_id: str) -> BoxView | None:
        snapshot = self._reconciler.snapshot()
        if box_id not in snapshot.boxes:
            return None
        return (await self._box_views(snapshot, [box_id]))[0]

    async def ready(self, box_id: str) -> ReadyView | None:
        snapshot = self._reconciler.snapshot()
        if box_id not in snapshot.boxes:
            return None
        return readiness_of(snapshot, box_id)

    async def admit(self, box_id: str) -> AdmitView | None:
        snapshot = self._reconciler.snapshot()
        if box_id not in snapshot.boxes:
            return None
        return admission_of(snapshot, box_id)

    async def routes(self) -> list[AgentRoutes]:
        snapshot = self._reconciler.snapshot()
        found = snapshot.routes()
        answer = []
        for agent_id in sorted(set(snapshot.prefixes) | set(snapshot.prefix_errors)):
            computed = snapshot.prefixes.get(agent_id)
            answer.append(
                AgentRoutes(
                    agent_id=agent_id,
                    prefix_hash=computed.prefix.hash if computed is not None else None,
                    prefix_tokens=computed.prefix.token_count if computed is not None else None,
                    routes=found.get(agent_id, ()),
                    error=snapshot.prefix_errors.get(agent_id),
                )
            )
        return answer

    async def _box_views(self, snapshot: Snapshot, box_ids: Sequence[str]) -> list[BoxView]:
        """The boxes' views: their phases in one store read, readiness and prefixes from one index."""
        epochs = {b: epoch for b in box_ids if (epoch := snapshot.live[b].epoch) is not None}
        phases = await self._store.phases_of(epochs) if epochs else {}
        ready = readiness_all(snapshot, box_ids)
        index = _BoxIndex.of(snapshot, box_ids)
        return [
            _box_view(snapshot, box_id, phases.get(box_id, []), ready[box_id], index) for box_id in box_ids
        ]


def _box_view(
    snapshot: Snapshot, box_id: str, phases: Sequence[PhaseRecord], ready: ReadyView, index: _BoxIndex
) -> BoxView:
    spec = snapshot.boxes[box_id]
    live = snapshot.live[box_id]
    report = live.ready_report
    ttr = None
    if report is not None and report.resumed:
        ttr = TimeToReadyView(
            at=report.at,
            time_to_ready_seconds=None,
            engine_seconds=None,
            warmup_engine_seconds=None,
            prefix_engine_seconds=None,
            overhead_fraction=None,
            resumed=True,
            reverify_seconds=report.reverify_seconds,
        )
    elif report is not None:
        ttr = TimeToReadyView(
            at=report.at,
            time_to_ready_seconds=report.time_to_ready_seconds,
            engine_seconds=report.engine_seconds,
            warmup_engine_seconds=report.warmup_engine_seconds,
            prefix_engine_seconds=report.prefix_engine_seconds,
            overhead_fraction=report.overhead_fraction,
        )
    return BoxView(
        id=box_id,
        base_url=spec.base_url,
        engine=spec.engine.value,
        model=spec.model,
        slots=spec.slots,
        healthy=live.healthy,
        health_error=live.health_error,
        health_error_kind=None if live.health_error_kind is None else str(live.health_error_kind),
        epoch=live.epoch,
        warmup=live.warmup.value,
        warmup_error=live.warmup_error,
        ready=ready,
        phases=tuple(_phase_view(p) for p in phases),
        prefixes=_prefix_views(snapshot, index, box_id),
        time_to_ready=ttr,
        health_slow_polls=live.slow_polls,
        lease_holder=snapshot.holders.get(box_id),
        held_here=snapshot.replica_id is None or snapshot.holders.get(box_id) == snapshot.replica_id,
    )
