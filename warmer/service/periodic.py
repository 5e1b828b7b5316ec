"""One root-task shape: do a step, then sleep on the daemon's clock until the period ends or the daemon stops.

The sleep goes through the `Clock` port (a fake clock drives it in tests), and a stop ends the sleep at once
instead of after the period."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from warmer.ports import Clock


async def every_period(
    step: Callable[[], Awaitable[object]], clock: Clock, period_seconds: float, stopping: asyncio.Event
) -> None:
    """Run `step` now and once per `period_seconds` until `stopping` is set."""
    stop_waiter = asyncio.ensure_future(stopping.wait())
    try:
        while not stopping.is_set():
            await step()
            timer = asyncio.ensure_future(clock.sleep(period_seconds))
            try:
                await asyncio.wait({timer, stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                timer.cancel()
    finally:
        stop_waiter.cancel()
