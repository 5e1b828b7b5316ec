"""The dialer's pre-call ask: which box should this call use, and is the agent's prefix warm there?

The reconciler does the warming (`ensure_warm`: marks the agent as having a pre-call ask, starts the warm
at once or joins the one in flight for that (box, prefix), and waits up to a bound), so a burst of asks for
one cold agent sends one warm per box, not one per ask. This service adds what the dialer needs on top:

- the box is picked among the agent's ready routes by weight (ramp weights included), with weighted
  rendezvous hashing on the call id, so retries of one call land on the same box and a new box that is
  still ramping gets only its slice;
- the caller's wait is bounded by an operator maximum;
- asks are counted per agent (observed call volume), which placement reads like campaign volume to give a
  busy agent a wider group.
It depends on `PrewarmBackend`, a narrow Protocol, not on the reconciler class: unit tests fake it.
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from warmer.core.errors import WarmerError
from warmer.core.model import BoxSpec, WarmState
from warmer.core.readiness import Route
from warmer.ports import Clock
from warmer.service.dialer.call_spread import CallLedger, CallVolumeMeter, pick_least_loaded
from warmer.service.reconciler import Reconciler, UnknownAgent
from warmer.service.reconciler.side_requests import SideSlot, UnknownSideBox

DEFAULT_MAX_WAIT_SECONDS = 10.0


class PrewarmState(enum.StrEnum):
    """The agent's prefix on the chosen box, as the dialer sees it."""

    WARM = "warm"  # verified warm (when `ready`, the box is in the agent's route)
    WARMING = "warming"  # a warm is in flight
    COLD = "cold"  # nothing warm yet (a warm was asked for)
    FAILED = "failed"  # the last warm failed; the reconciler retries after a backoff


class PrewarmInvalid(WarmerError):
    """A field of the ask is wrong; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class UnknownPrewarmAgent(WarmerError):
    """The ask names an agent this daemon does not define (HTTP 404)."""

    def __init__(self, agent_id: str) -> None:
        super().__init__(f"unknown agent {agent_id!r}")
        self.agent_id = agent_id


class UnknownSideRequestBox(WarmerError):
    """A side-slot ask names a box that is not in the fleet (HTTP 404)."""

    def __init__(self, box_id: str) -> None:
        super().__init__(f"unknown box {box_id!r}")
        self.box_id = box_id


class PrewarmUnavailable(WarmerError):
    """No box can take the agent's call now (none in its group is up and warmed up, its prefix is not
    computed yet): HTTP 503 with this reason."""


class EnsureAnswer(Protocol):
    """What the reconciler's `ensure_warm` answers (fields read here, nothing else)."""

    @property
    def box_id(self) -> str | None: ...

    @property
    def state(self) -> WarmState | None: ...

    @property
    def routed(self) -> bool: ...

    @property
    def prefix_hash(self) -> str | None: ...

    @property
    def detail(self) -> str: ...

    @property
    def routes(self) -> Sequence[Route]:
        """When routed: the routes the box was chosen from (empty: ask `routes_for`)."""
        ...

    @property
    def slot(self) -> int | None: ...  # not routed yet: the slot reserved for the prefix's warm there


class PrewarmBackend(Protocol):
    """The reconciler, as the pre-call ask needs it."""

    def knows(self, agent_id: str) -> bool: ...

    async def ensure_warm(self, agent_id: str, wait_seconds: float) -> EnsureAnswer:
        """Warm the agent's prefix if needed (coalesced per (box, prefix)) and wait up to `wait_seconds`."""
        ...

    def routes_for(self, agent_id: str) -> Sequence[Route]:
        """The agent's ready boxes with ramp weights, in spill order."""
        ...

    def box(self, box_id: str) -> BoxSpec | None:
        """A box the daemon may call now (None: it left the fleet)."""
        ...

    def slot(self, agent_id: str, box_id: str) -> int | None:
        """The engine slot holding the agent's prefix on the box, where slots are pinned (llama.cpp)."""
        ...

    async def recheck(self, box_id: str) -> None:
        """Look at the box's health and epoch now, before answering (a retried call met trouble there)."""
        ...

    def sent(self, agent_id: str, box_id: str, slot: int) -> None:
        """A call for the agent goes to this slot of the box: its turns will land there for a while."""
        ...

    async def side_slot(self, box_id: str, wait_seconds: float) -> SideSlot:
        """The slot a request that is no agent's call should name on the box (noted as lent), waiting up to
        `wait_seconds` while every slot is protected."""
        ...


@dataclass(frozen=True, slots=True)
class PrewarmAsk:
    agent_id: str
    call_id: str | None = None
    expected_calls: int | None = None  # calls about to be placed for this agent (volume hint); None = 1
    wait_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class PrewarmAnswer:
    agent: str
    box_id: str
    base_url: str
    prefix_hash: str | None
    state: PrewarmState
    ready: bool  # the box is in the agent's route: its prefix is verified warm there
    waited_ms: int
    detail: str = ""
    # llama.cpp boxes: the slot holding the prefix. A call that sends it as `id_slot` waits for that slot
    # when it is busy instead of evicting another agent's prompt from the other one.
    slot: int | None = None

    def as_json(self) -> dict[str, object]:
        return {
            "agent": self.agent,
            "box_id": self.box_id,
            "base_url": self.base_url,
            "prefix_hash": self.prefix_hash,
            "state": self.state.value,
            "ready": self.ready,
            "waited_ms": self.waited_ms,
            "detail": self.detail,
            "slot": self.slot,
        }


def _state_of(answer: EnsureAnswer) -> PrewarmState:
    if answer.routed:
        return PrewarmState.WARM
    if answer.state is WarmState.WARMING:
        return PrewarmState.WARMING
    if answer.state in (WarmState.WARM, WarmState.STALE):
        return PrewarmState.WARM
    if answer.state is WarmState.FAILED:
        return PrewarmState.FAILED
    return PrewarmState.COLD


class PrewarmService:
    """`prewarm(ask)`: the box for the call, the prefix's warm state there, after at most a bounded wait."""

    def __init__(
        self,
        backend: PrewarmBackend,
        clock: Clock,
        *,
        max_wait_seconds: float = DEFAULT_MAX_WAIT_SECONDS,
        meter: CallVolumeMeter | None = None,
        ledger: CallLedger | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if max_wait_seconds < 0:
            raise ValueError("max_wait_seconds must be >= 0")
        self._backend = backend
        self._clock = clock
        self.max_wait_seconds = max_wait_seconds
        self.meter = meter or CallVolumeMeter(clock)
        self.ledger = ledger or CallLedger(clock)
        self._rng = rng or random.Random()

    def observed_demand(self) -> Mapping[str, float]:
        """Agent -> calls per minute seen in pre-call asks (feeds placement next to campaign volume)."""
        return self.meter.calls_per_minute()

    async def prewarm(self, ask: PrewarmAsk) -> PrewarmAnswer:
        if not ask.agent_id:
            raise PrewarmInvalid("agent", "required")
        if ask.wait_seconds < 0 or not math.isfinite(ask.wait_seconds):
            raise PrewarmInvalid("wait_ms", "must be a finite number >= 0")
        if ask.expected_calls is not None and ask.expected_calls < 0:
            raise PrewarmInvalid("expected_calls", "must be >= 0")
        if not self._backend.knows(ask.agent_id):
            raise UnknownPrewarmAgent(ask.agent_id)
        retried = self.ledger.box_of(ask.call_id) if ask.call_id is not None else None
        if retried is not None:
            await self._backend.recheck(retried)  # the caller is back for a call it was already given
        else:
            self.meter.add(ask.agent_id, 1 if ask.expected_calls is None else ask.expected_calls)
        wait = min(ask.wait_seconds, self.max_wait_seconds)
        started = self._clock.monotonic()
        answer = await self._backend.ensure_warm(ask.agent_id, wait)
        waited_ms = max(0, round((self._clock.monotonic() - started) * 1000))
        box_id = answer.box_id
        specs: dict[str, BoxSpec | None] = {}  # each box looked up once per ask

        def spec(box_id: str) -> BoxSpec | None:
            if box_id not in specs:
                specs[box_id] = self._backend.box(box_id)
            return specs[box_id]

        if answer.routed:
            routes = answer.routes or self._backend.routes_for(ask.agent_id)
            if routes:

                def slots(box_id: str) -> int:
                    box = spec(box_id)
                    return box.slots if box is not None else 1

                box_id = pick_least_loaded(routes, ask.call_id, self.ledger, slots, self._rng).box_id
        if box_id is None:
            raise PrewarmUnavailable(answer.detail or "no box can serve the agent now")
        box = spec(box_id)
        if box is None:  # the fleet changed under the answer
            raise PrewarmUnavailable(f"box {box_id!r} left the fleet")
        self.ledger.hand(box_id, ask.call_id)
        slot = self._backend.slot(ask.agent_id, box_id) if answer.routed else answer.slot
        if slot is not None:
            self._backend.sent(ask.agent_id, box_id, slot)
        return PrewarmAnswer(
            agent=ask.agent_id,
            box_id=box_id,
            base_url=box.base_url,
            prefix_hash=answer.prefix_hash,
            state=_state_of(answer),
            ready=answer.routed,
            waited_ms=waited_ms,
            detail=answer.detail,
            slot=slot,
        )

    async def side_slot(self, box_id: str, wait_seconds: float = 0.0) -> SideSlotAnswer:
        """The slot a side request should name on `box_id` (`warmer.service.reconciler.side_requests`),
        waiting up to `wait_seconds` (capped like a pre-call ask's) while every slot is protected."""
        if wait_seconds < 0 or not math.isfinite(wait_seconds):
            raise PrewarmInvalid("wait_ms", "must be a finite number >= 0")
        box = self._backend.box(box_id)
        if box is None:
            raise UnknownSideRequestBox(box_id)
        try:
            lent = await self._backend.side_slot(box_id, min(wait_seconds, self.max_wait_seconds))
        except UnknownSideBox:
            raise UnknownSideRequestBox(box_id) from None
        return SideSlotAnswer(box_id, box.base_url, lent.slot, lent.evicts, lent.detail)


@dataclass(frozen=True, slots=True)
class SideSlotAnswer:
    """Where to send a side request (no agent's call: a summary, a classifier) on a box."""

    box_id: str
    base_url: str
    slot: int | None  # send it as `id_slot`; None: send it without a slot
    evicts: str | None  # the agent whose prefix it overwrites there (warmer re-checks it), if any
    detail: str

    def as_json(self) -> dict[str, object]:
        return {
            "box_id": self.box_id,
            "base_url": self.base_url,
            "slot": self.slot,
            "evicts": self.evicts,
            "detail": self.detail,
        }


class ReconcilerBackend:
    """`PrewarmBackend` over the reconciler."""

    def __init__(self, reconciler: Reconciler) -> None:
        self._reconciler = reconciler

    def knows(self, agent_id: str) -> bool:
        return self._reconciler.knows(agent_id)

    async def ensure_warm(self, agent_id: str, wait_seconds: float) -> EnsureAnswer:
        try:
            return await self._reconciler.ensure_warm(agent_id, wait_seconds)
        except UnknownAgent:
            raise UnknownPrewarmAgent(agent_id) from None

    def routes_for(self, agent_id: str) -> Sequence[Route]:
        return self._reconciler.agent_routes(agent_id)

    def box(self, box_id: str) -> BoxSpec | None:
        return self._reconciler.box(box_id)

    def slot(self, agent_id: str, box_id: str) -> int | None:
        return self._reconciler.prefix_slot(agent_id, box_id)

    async def recheck(self, box_id: str) -> None:
        await self._reconciler.recheck_box(box_id)

    def sent(self, agent_id: str, box_id: str, slot: int) -> None:
        self._reconciler.note_call(agent_id, box_id, slot)

    async def side_slot(self, box_id: str, wait_seconds: float) -> SideSlot:
        return await self._reconciler.side_slot(box_id, wait_seconds)
