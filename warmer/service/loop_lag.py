"""How long the event loop was held by other work: the pre-call asks' tail, measured from inside.

Every pre-call ask, health poll and reconcile pass shares one event loop; a callback that runs for 100 ms
delays every ask that arrives meanwhile by up to 100 ms, however cheap the ask itself is. The `loop-lag`
root task sleeps `period_seconds` at a time and reports how much later than asked it woke: the time the
loop was busy elsewhere when the timer fell due (the `warmer_event_loop_lag_seconds` histogram). Its own
cost is one wake-up per period."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from warmer.ports import Clock

DEFAULT_PERIOD_SECONDS = 0.1


async def sample_loop_lag(
    clock: Clock, period_seconds: float, observe: Callable[[float], None], stopping: asyncio.Event
) -> None:
    """Until `stopping`: sleep `period_seconds`, then `observe(seconds woken late)`."""
    if period_seconds <= 0:
        raise ValueError("period_seconds must be > 0")
    while not stopping.is_set():
        asked = clock.monotonic() + period_seconds
        await clock.sleep(period_seconds)
        observe(max(0.0, clock.monotonic() - asked))
