"""The reconciler's vocabulary: its configuration, what it asks of its collaborators (prefix source,
metrics observer) and the values it hands out (snapshots, readiness reports, pre-call answers).

On one page so callers that need just these types (the root, status, prewarm, tests, benchmarks) read
them without the loop; `warmer.service.reconciler` re-exports them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from warmer.core.agents import AgentSpec
from warmer.core.capacity import PrefixBudgetPolicy
from warmer.core.errors import HealthFailure, WarmerError
from warmer.core.fleet_pacing import FleetBudget
from warmer.core.gate import GateAnswer, GateConfig
from warmer.core.model import BoxSpec, ModelProfile, Prefix, WarmRecord, WarmState
from warmer.core.placement import PlacementConfig
from warmer.core.planner import Desired, Observed, PlannerConfig, WarmKey, WarmupStatus
from warmer.core.readiness import Route, routes
from warmer.core.tokenizer_drift import DEFAULT_DRIFT_THRESHOLD


class UnknownAgent(WarmerError):
    """A pre-call ask named an agent the config does not define."""

    def __init__(self, agent_id: str) -> None:
        super().__init__(f"agent_id: unknown agent {agent_id!r}")
        self.agent_id = agent_id


@dataclass(frozen=True, slots=True)
class ComputedPrefix:
    """An agent's stable prefix and what computed it (recorded as the prefix's engine version)."""

    prefix: Prefix
    engine_version: str


class PrefixSource(Protocol):
    """Computes an agent's stable prefix for its model (offline template+tokenizer, or the engine's)."""

    async def __call__(self, spec: AgentSpec, profile: ModelProfile) -> ComputedPrefix: ...


@dataclass(frozen=True, slots=True)
class BoxSeen:
    """One fleet box as the last health poll saw it, for the per-box health and info metrics."""

    box_id: str
    engine: str
    model: str
    group: str
    version: str  # the engine's own version where its capacity reading reports it, else ""
    healthy: bool
    failure: str | None  # how the last poll failed (a HealthFailure value); None while healthy


class ReconcileObserver(Protocol):
    """Where the reconciler reports what metrics count (the root implements it with Prometheus)."""

    def warm_finished(self, box_id: str, kind: str, reason: str, outcome: str, seconds: float) -> None:
        """`kind` is warm or probe; `outcome` verified, failed, cold, unknown (a probe that could not
        ask the engine), or contested (a warm whose slot was overwritten before its probe: warmed again)."""
        ...

    def warm_tokens(self, box_id: str, tokens: int) -> None:
        """Prompt tokens the daemon itself sent to the box in one warm or probe (prefix x requests)."""
        ...

    def phase_finished(self, box_id: str, phase: str, ok: bool, seconds: float) -> None: ...

    def box_ready(self, box_id: str, time_to_ready_seconds: float, engine_seconds: float) -> None: ...

    def fleet_state(self, boxes_ready: int, prefixes_warm: int) -> None: ...

    def box_states(self, ready: Mapping[str, bool], agent_warm: Mapping[tuple[str, str], bool]) -> None:
        """Every fleet box's readiness and every wanted (box, agent) warmth, after each pass: the full
        set, so a box or agent that left the fleet disappears from the report."""
        ...

    def gate_released(self, released: Mapping[str, str]) -> None:
        """Every fleet box the admission gate lets in although it is not ready, with the rule that let it in
        (`warmer.core.gate`: latched, held_too_long, share; the full set, after each pass)."""
        ...

    def tokenizer_drift(self, agent_id: str, model: str, change: float) -> None:
        """The agent's prefix text now tokenizes to `change` (relative, e.g. +0.08) more tokens than
        under the previous engine version."""
        ...

    def boxes_seen(self, boxes: Sequence[BoxSeen]) -> None:
        """Every fleet box's health and identity after each poll: the full set, so a box that left the
        fleet disappears from the report."""
        ...

    def pass_finished(self, kind: str, seconds: float) -> None:
        """One pass of the loop ended (`kind`: `full`, a reconcile pass, or `health`, the health timer's
        light poll), after `seconds` of wall time under the fleet lock: what grows with the fleet."""
        ...

    def engine_work_paced(
        self, queued: Mapping[str, int], running: int, tokens_per_second: float, tokens_available: float
    ) -> None:
        """The fleet pacer after each admission: engine work waiting per kind (restart_warmup, warm,
        probe), pieces running, the fleet budget's rate and what its bucket holds (negative: debt)."""
        ...


class NullObserver:
    """Reports nowhere (unit tests, one-off tools)."""

    def warm_finished(self, box_id: str, kind: str, reason: str, outcome: str, seconds: float) -> None:
        return None

    def warm_tokens(self, box_id: str, tokens: int) -> None:
        return None

    def phase_finished(self, box_id: str, phase: str, ok: bool, seconds: float) -> None:
        return None

    def box_ready(self, box_id: str, time_to_ready_seconds: float, engine_seconds: float) -> None:
        return None

    def fleet_state(self, boxes_ready: int, prefixes_warm: int) -> None:
        return None

    def box_states(self, ready: Mapping[str, bool], agent_warm: Mapping[tuple[str, str], bool]) -> None:
        return None

    def gate_released(self, released: Mapping[str, str]) -> None:
        return None

    def tokenizer_drift(self, agent_id: str, model: str, change: float) -> None:
        return None

    def boxes_seen(self, boxes: Sequence[BoxSeen]) -> None:
        return None

    def pass_finished(self, kind: str, seconds: float) -> None:
        return None

    def engine_work_paced(
        self, queued: Mapping[str, int], running: int, tokens_per_second: float, tokens_available: float
    ) -> None:
        return None


@dataclass(frozen=True, slots=True)
class ReconcilerConfig:
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    health_concurrency: int = 32  # boxes polled at once
    # health polls in a row a healthy box may answer too late and keep its routes (setting:
    # reconcile.health_slow_polls_allowed); a refused connection, an error or a new epoch acts at once
    health_slow_polls_allowed: int = 1
    # the health timer polls every box this often (setting: reconcile.health_poll_seconds); a pass polls
    # only the boxes not polled for this long (a lease just gained, a box just added): one poll per box per
    # interval. 0: every pass polls every box (a reconciler stepped by hand, without the timer)
    health_poll_seconds: float = 0.0
    # a pre-call ask keeps the agent at top priority this long (setting: dialer.precall_hold_seconds)
    precall_hold_seconds: float = 60.0
    # an ask for an agent without a box that can take its call borrows room this long, just in time
    # (setting: dialer.precall_lend_seconds; 0: such asks are answered cold)
    precall_lend_seconds: float = 60.0
    # ...and a prefix whose ready answer was given this recently never leaves for another agent's loan:
    # its call's first turn is on its way (setting: dialer.precall_protect_seconds)
    precall_protect_seconds: float = 10.0
    # a call sent to an engine slot keeps sending its turns there about this long: another prefix put in that
    # slot meanwhile is probed before an answer vouches for it (setting: dialer.call_hold_seconds)
    precall_call_hold_seconds: float = 60.0
    # a staged prompt becomes current at the latest this long after it was staged, warm or not (a new prompt
    # must not wait forever behind a box that cannot warm it; the route then shrinks to where it is warm)
    pending_prompt_timeout_seconds: float = 600.0
    # relative change in an unchanged prefix text's token count, across engine versions, that is raised
    # as tokenizer drift (seen in the field: +8% from a tokenizer regression)
    tokenizer_drift_threshold: float = DEFAULT_DRIFT_THRESHOLD
    # a healthy box's capacity is read again this often, so its prefix budget follows load (setting:
    # capacity.prefix_poll_seconds; 0 = only when a new process is seen), under this headroom and band
    capacity_poll_seconds: float = 15.0
    prefix_budget: PrefixBudgetPolicy = field(default_factory=PrefixBudgetPolicy)
    # the admission gate's bounds (setting: [gate]): `/v1/boxes/{id}/admit` never holds a fleet down
    gate: GateConfig = field(default_factory=GateConfig)
    # restart warm-ups, warms and probes admitted fleet-wide, most valuable first (setting: [reconcile]
    # fleet_warm_*; `warmer.core.fleet_pacing`)
    fleet_budget: FleetBudget = field(default_factory=FleetBudget)

    def __post_init__(self) -> None:
        if self.health_concurrency < 1:
            raise ValueError("health_concurrency must be >= 1")
        if self.health_slow_polls_allowed < 0:
            raise ValueError("health_slow_polls_allowed must be >= 0")
        if self.health_poll_seconds < 0:
            raise ValueError("health_poll_seconds must be >= 0")
        if not 0 < self.tokenizer_drift_threshold < 1:
            raise ValueError("tokenizer_drift_threshold must be between 0 and 1")
        if self.precall_hold_seconds <= 0:
            raise ValueError("precall_hold_seconds must be > 0")
        if self.precall_lend_seconds < 0:
            raise ValueError("precall_lend_seconds must be >= 0")
        if self.precall_protect_seconds < 0:
            raise ValueError("precall_protect_seconds must be >= 0")
        if self.precall_call_hold_seconds < 0:
            raise ValueError("precall_call_hold_seconds must be >= 0")
        if self.capacity_poll_seconds < 0:
            raise ValueError("capacity_poll_seconds must be >= 0")


@dataclass(frozen=True, slots=True)
class ReadyReport:
    """How one box's epoch got ready: daemon-measured wall time next to the engine's own time.

    A `resumed` report is a daemon restarted over an engine whose restart warm-up an earlier daemon ran:
    it did not see the epoch start, so its figures are only its own re-verification (`reverify_seconds`,
    from this daemon's first health check to ready) and say nothing about the epoch's time to ready.
    """

    box_id: str
    epoch: str
    at: float  # unix seconds when it became ready
    time_to_ready_seconds: float  # from health first seen up in this epoch (by this daemon) to ready
    warmup_engine_seconds: float  # restart warm-up, critical path
    prefix_engine_seconds: float  # prefix warms and verifications
    warmup_wall_seconds: float
    resumed: bool = False

    @property
    def reverify_seconds(self) -> float:
        """A resumed report's only honest wall time: this daemon's first health check to ready."""
        return self.time_to_ready_seconds

    @property
    def engine_seconds(self) -> float:
        return self.warmup_engine_seconds + self.prefix_engine_seconds

    @property
    def overhead_fraction(self) -> float:
        """Share of the time to ready not spent inside the engine (polls, HTTP, database, scheduling)."""
        if self.time_to_ready_seconds <= 0:
            return 0.0
        return max(0.0, 1.0 - self.engine_seconds / self.time_to_ready_seconds)


@dataclass(slots=True)
class BoxLive:
    """What the reconciler knows about one box right now (memory; the store has the durable part)."""

    healthy: bool = False
    epoch: str | None = None
    health_error: str | None = None
    health_error_kind: HealthFailure | None = None  # how the last poll failed (refused, timeout, ...)
    slow_polls: int = 0  # health polls in a row answered too late while it stayed in its routes
    # the last verdict that was not "stale" (its holder's report too old) said up: placement keeps the box
    seen_up: bool = False
    healthy_since: float | None = None  # unix seconds: health first seen up in this epoch
    healthy_since_mono: float | None = None
    warmup: WarmupStatus = WarmupStatus.NOT_STARTED
    warmup_finished_at: float | None = None
    warmup_error: str | None = None
    warmup_engine_seconds: float = 0.0
    warmup_wall_seconds: float = 0.0
    prefix_engine_seconds: float = 0.0
    prefix_requests: int = 0
    prefixes_started_at: float | None = None
    # an earlier daemon ran this epoch's restart warm-up (this one restarted over a running engine)
    resumed: bool = False
    ready_report: ReadyReport | None = None


@dataclass(frozen=True, slots=True)
class EnsureResult:
    """The answer to a pre-call ask: the box to use and its warm state for the agent's prefix."""

    agent_id: str
    box_id: str | None
    state: WarmState | None
    routed: bool  # the box is in the agent's route: verified warm there
    prefix_hash: str | None
    detail: str = ""
    routes: tuple[Route, ...] = ()  # when routed: every route the box was chosen from, in spill order
    # not routed yet, warming: the engine slot reserved for the prefix there (llama.cpp). A call that names
    # it (`id_slot`) queues behind the warm in that slot and finds the prefix, evicting nobody else's.
    slot: int | None = None


@dataclass(frozen=True, slots=True)
class PendingPrompt:
    """A new prompt spec staged for an agent. Its prefix is warmed on the agent's boxes while the old one
    keeps serving; it becomes current (routes switch) once verified warm on every box the agent is routed
    to, so a prompt change never leaves the agent without a warm route."""

    spec: AgentSpec
    staged_at: float
    computed: ComputedPrefix | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A consistent view for status/readiness/routes answers."""

    now: float
    boxes: Mapping[str, BoxSpec]
    live: Mapping[str, BoxLive]
    desired: Desired | None
    observed: Observed  # untrusted records left out: they do not count as warm until re-probed
    records: Mapping[WarmKey, WarmRecord]  # every record of the current epochs, trusted or not
    prefixes: Mapping[str, ComputedPrefix]
    prefix_errors: Mapping[str, str]
    config: PlannerConfig
    gate: GateConfig = field(default_factory=GateConfig)
    # the admission gate's answers of the last pass, per box, with the epoch each was given for
    gate_answers: Mapping[str, tuple[str | None, GateAnswer]] = field(default_factory=dict)
    # with several replicas: box -> the replica holding its lease (absent: none holds it now), and this one
    holders: Mapping[str, str] = field(default_factory=dict)
    replica_id: str | None = None  # None: this daemon alone holds every box

    def routes(self) -> dict[str, tuple[Route, ...]]:
        if self.desired is None:
            return {}
        return routes(self.desired, self.observed, self.now, self.config)
