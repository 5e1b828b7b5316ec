"""Composition of the KV cache event path: the ZMQ source, the watcher, the reconciler's reactions.

Built only when a configured box names `kv_events`; the watcher reads the reconciler's fleet on every pass,
so a box that leaves it stops being followed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

from warmer.adapters.engines.vllm_kv_events import ZmqKvEventSource, block_hasher_for
from warmer.core.model import BoxSpec
from warmer.ports import Clock, EnginePort
from warmer.root.supervisor import RootTask
from warmer.service.engine_signals.cache_events import CacheEventWatcher
from warmer.service.reconciler.evictions import EvictionReactions


def follows_events(boxes: Sequence[BoxSpec]) -> bool:
    return any(box.kv_events is not None for box in boxes)


def cache_event_task(
    *,
    fleet: Callable[[], Mapping[str, BoxSpec]],
    reactions: EvictionReactions,
    engine: EnginePort,
    clock: Clock,
) -> RootTask:
    """The root task following every box's event stream until the daemon stops."""

    async def run(stopping: asyncio.Event) -> None:
        source = ZmqKvEventSource()
        watcher = CacheEventWatcher(
            port=source,
            listener=reactions,
            fleet=lambda: tuple(fleet().values()),
            tokenize=engine.tokenize,
            clock=clock,
            epoch_of=reactions.epoch_of,
            layout_of=engine.cache_layout,
            hasher_of=block_hasher_for,
        )
        reactions.attach(watcher)
        try:
            await watcher.run(stopping)
        finally:
            await reactions.close()
            source.close()

    return run
