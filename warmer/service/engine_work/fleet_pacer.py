"""The waiting side of fleet pacing: engine work awaits its turn here (`warmer.core.fleet_pacing` decides it).

Every restart warm-up, warm and probe the action runner starts goes through `admitted(...)`: the piece of
work waits (as a task, holding nothing) until the fleet budget admits it, runs, and gives its place back.
When only the bucket's refill can let the next one in, one timer sleeps on the daemon's clock until then.
A cancelled wait (the box left, the daemon stops) leaves the queue; nothing else is ever dropped.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Protocol

from warmer.core.fleet_pacing import FleetAdmission, FleetBudget, Ticket, WorkKind, fleet_rate
from warmer.ports import Clock

_MIN_SLEEP_SECONDS = 0.001  # a refill due "now" within float rounding still waits a little


class PacingObserver(Protocol):
    def engine_work_paced(
        self, queued: Mapping[str, int], running: int, tokens_per_second: float, tokens_available: float
    ) -> None:
        """After every admission: waiting work per kind, work running, the fleet rate and the bucket."""
        ...


class FleetPacer:
    """One fleet budget for the engine work of this daemon (`admitted`). `box_limit`: a box's warm
    concurrency; `declared`: the boxes' declared prefill rates now (for a derived budget)."""

    def __init__(
        self,
        *,
        clock: Clock,
        budget: FleetBudget,
        box_limit: Callable[[str], int],
        per_box_fallback: float,
        declared: Callable[[], Iterable[float | None]],
        observer: PacingObserver | None = None,
    ) -> None:
        self._clock = clock
        self._budget = budget
        self._fallback = per_box_fallback
        self._declared = declared
        self._observer = observer
        self.admission = FleetAdmission(budget, self._rate(), box_limit)
        self._gates: dict[str, asyncio.Future[None]] = {}
        self._queued: Counter[str] = Counter({kind.value: 0 for kind in WorkKind})
        self._keys = itertools.count()
        self._timer: asyncio.Task[None] | None = None
        self._timer_at = 0.0

    def _rate(self) -> float:
        return fleet_rate(self._budget, self._declared(), self._fallback)

    def refresh_rate(self) -> None:
        """Re-derive the rate from the fleet as it is now (boxes join and leave); a configured one stays."""
        if self._budget.tokens_per_second is None:
            self.admission.set_rate(self._rate(), self._clock.monotonic())
            self._pump()

    def queued(self) -> Mapping[str, int]:
        return dict(self._queued)

    @asynccontextmanager
    async def admitted(
        self, kind: WorkKind, box_id: str, *, value: float, cost_tokens: float, urgent: bool = False
    ) -> AsyncIterator[None]:
        """Wait for the fleet budget to admit this piece of work, run the block, give the place back."""
        key = f"{kind.value}:{box_id}:{next(self._keys)}"
        ticket = Ticket(key, kind, box_id, value, cost_tokens, self._clock.monotonic(), urgent)
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._gates[key] = gate
        self._queued[kind.value] += 1
        self.admission.enqueue(ticket)
        self._pump()
        try:
            await gate
        except BaseException:
            if key in self._gates:  # still waiting: leave the queue
                del self._gates[key]
                self._queued[kind.value] -= 1
                self.admission.withdraw(key)
            else:  # admitted, then cancelled before it could start
                self.admission.release(key)
            self._pump()
            raise
        try:
            yield
        finally:
            self.admission.release(key)
            self._pump()

    def charge(self, tokens: float) -> None:
        """Engine work already admitted sends `tokens` more than its ticket said (`FleetAdmission.charge`)."""
        now = self._clock.monotonic()
        self.admission.charge(tokens, now)
        self._arm(now)

    def _pump(self) -> None:
        now = self._clock.monotonic()
        for ticket in self.admission.admit(now):
            gate = self._gates.pop(ticket.key)
            self._queued[ticket.kind.value] -= 1
            if not gate.done():
                gate.set_result(None)
        self._arm(now)
        if self._observer is not None:
            self._observer.engine_work_paced(
                self.queued(), len(self.admission.running), self.admission.rate, self.admission.tokens(now)
            )

    def _arm(self, now: float) -> None:
        """One timer for when refill alone lets the blocked head in (kept if it fires soon enough)."""
        at = self.admission.next_check_at(now)
        if at is None:
            return
        if self._timer is not None and not self._timer.done():
            if self._timer_at <= at:
                return
            self._timer.cancel()
        self._timer_at = at
        self._timer = asyncio.ensure_future(self._wake(max(_MIN_SLEEP_SECONDS, at - now)))

    async def _wake(self, seconds: float) -> None:
        await self._clock.sleep(seconds)
        self._timer = None
        self._pump()

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            await asyncio.gather(self._timer, return_exceptions=True)
