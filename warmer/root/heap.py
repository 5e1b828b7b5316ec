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

import gc


def freeze_startup_heap() -> int:
    """Collect, then freeze every object alive now; returns how many objects are frozen in all."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
