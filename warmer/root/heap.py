"""The garbage collector of a `warmer serve` process, whose one event loop answers the dialer's asks.

A full collection (generation 2) walks every object the process tracks and holds the loop for all of it:
at 1,000 agents on 125 boxes that is ~250,000 objects, nine in ten of them made at start-up and alive
for good (modules, classes and functions, the settings, the agents' specs, the web app), and each full
collection held the loop 200-450 ms, the longest stalls the pre-call asks met (BENCHMARKS.md, "Pre-call
answers with many agents"). Once the daemon is built, `freeze_startup_heap` collects once and moves
what survives to the permanent generation (`gc.freeze`): later collections walk only what the daemon
made since. Frozen objects are still freed when their last reference goes; only a reference cycle among
them would never be collected, and start-up's objects live as long as the process.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable


def freeze_startup_heap() -> int:
    """Collect, then freeze every object alive now; returns how many objects are frozen in all."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


async def freeze_when_fleet_ready(
    all_ready: Callable[[], bool], pass_done: Callable[[], Awaitable[None]], stopping: asyncio.Event
) -> None:
    """The `heap` root task of a `warmer serve` process: after the first pass that finds every box ready,
    collect and freeze again, then wait for the stop. By then the daemon has built what it keeps for as
    long as the fleet is unchanged (each agent's prefix, the placement, a metric series per box and
    agent: ~60,000 objects at 1,000 agents, whose full collections held the loop 40-110 ms); later full
    collections walk only what changes. Once: garbage the daemon makes later is collected as usual. What
    is frozen and later becomes garbage is still freed by reference counting; only such garbage caught in
    a reference cycle stays (an engine-work task alive at that moment, say): bounded by what was alive
    then, never growing, since nothing is frozen again."""
    while not stopping.is_set():
        if all_ready():
            freeze_startup_heap()
            break
        waiter = asyncio.ensure_future(pass_done())
        stop_waiter = asyncio.ensure_future(stopping.wait())
        try:
            await asyncio.wait({waiter, stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            stop_waiter.cancel()
    await stopping.wait()
