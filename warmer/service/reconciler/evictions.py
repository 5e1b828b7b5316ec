"""What the reconciler does with what a box's KV cache events say
(`warmer.service.engine_signals.cache_events`).

* A warmed prefix evicted: its record goes WARM/STALE -> EVICTED at once (`ProbeCold` with the tokens the
  engine still holds), so the next pass re-warms it: the re-warm follows the removal, not a timer.
* A keepalive touch is always sent, whatever the events say: engines evict least recently used first, so a
  resident prefix nobody touches drifts to the front of the eviction order and is the next to go. What the
  events add is the horizon (`horizons`): how long other prefixes' unused blocks last before eviction, which
  the planner uses to schedule the touch just inside it (`Observed.keepalive_horizons`); and a cheaper
  touch: where they say every block is held, the touch is one probe (a request like any other, so it
  refreshes the blocks, and its own cached tokens verify the hit) instead of a warm and then a probe.
* The box restarted (the sequence went backwards): the box is looked at now (`recheck`), so the new epoch
  and its restart warm-up start without waiting for the next health poll.
* The stream lost track: every WARM prefix of the box comes due for its keepalive touch now, which is sent
  (the events no longer vouch for it) and verifies it; its "full" report re-teaches the blocks.
* After a warm or probe verified a prefix, the watcher follows it (`verified`).

Listener calls are synchronous; the work they start runs in tasks owned here (`close` ends them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog

from warmer.core.errors import LeaseLost
from warmer.core.model import BoxSpec, Prefix, WarmRecord, WarmState
from warmer.core.plan_actions import ProbePrefix, WarmPrefix, WarmReason
from warmer.core.planner import WarmKey
from warmer.core.residency import PrefixResidency, PrefixState
from warmer.core.warmstate import (
    IllegalTransition,
    KeepaliveDue,
    ProbeCold,
    RetryBackoff,
    WarmEvent,
    transition,
)
from warmer.ports import Clock
from warmer.service.engine_signals.cache_events import CacheEventWatcher, ResetReason


class RecordBook(Protocol):
    """The reconciler's warm records (its `WarmBook`)."""

    records: dict[WarmKey, WarmRecord]

    async def write(self, updated: WarmRecord, *, reason: str, previous: WarmState | None) -> None: ...

    def release_pin(self, key: WarmKey) -> None: ...


class EvictionReactions:
    """The reconciler's `ResidencyListener`, and what its action runner asks of the events."""

    def __init__(
        self,
        *,
        book: RecordBook,
        epoch_of: Callable[[str], str | None],
        recheck: Callable[[str], Awaitable[None]],
        poke: Callable[[], None],
        clock: Clock,
        retry: RetryBackoff,
    ) -> None:
        self._book = book
        self._epoch_of = epoch_of
        self._recheck = recheck
        self._poke = poke
        self._clock = clock
        self._retry = retry
        self._watcher: CacheEventWatcher | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._log = structlog.stdlib.get_logger(__name__)

    def epoch_of(self, box_id: str) -> str | None:
        """The box's current epoch (its engine process's identity), as the reconciler last saw it."""
        return self._epoch_of(box_id)

    def attach(self, watcher: CacheEventWatcher) -> None:
        """The watcher whose events these are (it is built with these reactions as its listener)."""
        self._watcher = watcher

    # -- ResidencyListener

    def prefix_evicted(self, box_id: str, prefix_hash: str, resident_tokens: int) -> None:
        event = ProbeCold(resident_tokens)
        why = f"kv event: evicted, the engine holds {resident_tokens} of its tokens"
        self._spawn(self._evict(box_id, prefix_hash, event, why), f"kv-evicted:{box_id}")

    def prefix_resident(self, box_id: str, prefix_hash: str) -> None:
        """Nothing to do: a warm is verified by its own probe, and a due keepalive asks `still_resident`."""

    def box_reset(self, box_id: str, reason: ResetReason) -> None:
        if reason is ResetReason.RESTARTED:
            self._spawn(self._recheck(box_id), f"kv-restarted:{box_id}")
        else:
            self._spawn(self._touch_all(box_id), f"kv-lost:{box_id}")

    # -- asked by the action runner

    def verified(self, box: BoxSpec, prefix: Prefix | None) -> None:
        """A warm or probe verified the prefix on the box: follow it there, if the box's events are read."""
        watcher = self._watcher
        if prefix is not None and watcher is not None and watcher.follows(box.id):
            self._spawn(self._watch(watcher, box, prefix), f"kv-watch:{box.id}")

    def still_resident(self, box_id: str, prefix_hash: str) -> PrefixResidency | None:
        """The events' word that the box holds every full block of the prefix (None: they do not say so)."""
        watcher = self._watcher
        state = None if watcher is None else watcher.state(box_id, prefix_hash)
        return state if state is not None and state.state is PrefixState.RESIDENT else None

    def touch_by_probe(self, action: WarmPrefix | ProbePrefix) -> bool:
        """A keepalive touch of a prefix the events say the box holds: one probe does (see the module)."""
        return (
            isinstance(action, WarmPrefix)
            and action.reason is WarmReason.KEEPALIVE
            and self.still_resident(action.box_id, action.prefix_hash) is not None
        )

    def horizons(self) -> dict[str, float]:
        """Per box whose events are read: the measured eviction horizon in seconds, where known yet."""
        return {} if self._watcher is None else self._watcher.horizons()

    async def wait_idle(self) -> None:
        """Until the work started so far is done (tests step with this)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- the work

    def _spawn(self, work: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(work)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _evict(self, box_id: str, prefix_hash: str, event: WarmEvent, why: str) -> None:
        await self._apply(box_id, prefix_hash, event, why, poke=True)

    async def _watch(self, watcher: CacheEventWatcher, box: BoxSpec, prefix: Prefix) -> None:
        await watcher.watch(box, prefix)

    async def _apply(
        self,
        box_id: str,
        prefix_hash: str,
        event: WarmEvent,
        why: str,
        *,
        poke: bool,
        epoch: str | None = None,
    ) -> bool:
        epoch = epoch or self._epoch_of(box_id)
        if epoch is None:
            return False
        key = (box_id, epoch, prefix_hash)
        record = self._book.records.get(key)
        if record is None or record.state not in (WarmState.WARM, WarmState.STALE):
            return False  # not believed warm here (warming, cold, failed): nothing the event changes
        try:
            updated = transition(record, event, self._clock.now(), self._retry)
        except IllegalTransition as exc:
            self._log.warning("kv event: transition no longer applies", box=box_id, error=str(exc))
            return False
        try:
            await self._book.write(updated, reason=why, previous=record.state)
        except LeaseLost:  # several replicas follow the box's events; its lease holder records them
            self._log.debug("kv event left to the box's lease holder", box=box_id, prefix=prefix_hash)
            return False
        if updated.state is WarmState.EVICTED:
            self._book.release_pin(key)
        if poke:
            self._poke()
        return True

    async def _touch_all(self, box_id: str) -> None:
        epoch = self._epoch_of(box_id)
        keys = [
            k
            for k, r in self._book.records.items()
            if k[0] == box_id and k[1] == epoch and r.state is WarmState.WARM  # STALE ones are due already
        ]
        touched = False
        for key in keys:
            touched |= await self._apply(
                box_id, key[2], KeepaliveDue(), "kv events lost: verify by keepalive touch", poke=False
            )
        if touched:
            self._poke()
