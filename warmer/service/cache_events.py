"""Evictions and restarts as the engine reports them: follow each box's KV cache event stream.

For every box with `kv_events` configured, one task reads the stream (`CacheEventPort`), keeps the box's
residency (`warmer.core.residency.BoxResidency`) and tells a `ResidencyListener`:

* `prefix_evicted`: a watched prefix lost a block (re-warm it now instead of at its keepalive timer);
  `AllBlocksCleared` reports every watched prefix this way;
* `prefix_resident`: its blocks are all stored (again): the engine's own word that it is cached;
* `box_reset(RESTARTED)`: a new publisher process, an engine restart; the mirror is cleared (the new
  process starts empty; no per-prefix evictions follow: the restart path re-warms everything);
* `box_reset(LOST)`: events were missed and could not be replayed (no replay socket, its buffer moved on,
  an unreadable batch, a mirror past its bound): every prefix is UNKNOWN, so verify them by probe.

A new process is told from a gap by three signs, any one of which is enough: the sequence number went
backwards (each publisher numbers from 0); the engine's own identity changed (the box's epoch, e.g. vLLM's
`process_start_time_seconds`, as `epoch_of` reports it, compared with the one seen when the stream
started); or the replay answer disagrees with what was applied: a gap is replayed from the last batch
applied, not the one after it, and a publisher that is the same process answers that batch exactly as it
was received, while a new process (numbering again from 0, which may already have passed the old last
number when warmer missed its first batches) answers another batch there. A replay that no longer holds
the last batch cannot tell: the box is then LOST (residency unknown), never continued.

Sequence numbers: a gap is filled from the replay socket before the batch that revealed it is applied. The
first batch of a stream (warmer started, or the engine restarted) asks for a replay from 0, which also
recovers what ZeroMQ dropped before the subscription reached the publisher; a publisher that cannot
replay that far leaves the prefixes it announced UNKNOWN, never wrongly evicted. Listener calls are plain
synchronous calls: the listener schedules its work, the stream is never blocked by it.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from warmer.core.errors import NotSupported, WarmerError
from warmer.core.model import BoxSpec, Prefix
from warmer.core.residency import (
    BoxResidency,
    EventBatch,
    MirrorOverflow,
    PrefixResidency,
    PrefixState,
    SequenceCursor,
    SeqVerdict,
    replay_covers,
)
from warmer.ports import CacheEventPort, CacheEventStream, Clock
from warmer.service.periodic import every_period

EVENT_EVICTED = "kv event: warmed prefix evicted"
EVENT_RESIDENT = "kv event: warmed prefix resident"
EVENT_RESTARTED = "kv event: sequence reset, engine restarted"
EVENT_LOST = "kv event: events missed, residency unknown"


class ResetReason(enum.StrEnum):
    RESTARTED = "restarted"  # the sequence went backwards: a new engine process, an empty cache
    LOST = "lost"  # events missed beyond repair: residency unknown until blocks are stored again


class ResidencyListener(Protocol):
    """Told what a box's cache events say about the prefixes watched on it."""

    def prefix_evicted(self, box_id: str, prefix_hash: str, resident_tokens: int) -> None:
        """The engine dropped a block of the prefix: a hit now reaches `resident_tokens` at most."""
        ...

    def prefix_resident(self, box_id: str, prefix_hash: str) -> None: ...

    def box_reset(self, box_id: str, reason: ResetReason) -> None: ...


Tokenize = Callable[[BoxSpec, str], Awaitable[list[int]]]


@dataclass(frozen=True, slots=True)
class CacheEventsConfig:
    fleet_poll_seconds: float = 5.0  # how often the box list is read for boxes added or removed
    retry_seconds: float = 5.0  # after a stream failed, before it is opened again
    max_blocks: int = 2_000_000  # per box: more would mean removals were missed

    def __post_init__(self) -> None:
        if self.fleet_poll_seconds <= 0 or self.retry_seconds <= 0:
            raise ValueError("fleet_poll_seconds and retry_seconds must be > 0")
        if self.max_blocks < 1:
            raise ValueError("max_blocks must be >= 1")


@dataclass(slots=True)
class _Follow:
    box: BoxSpec
    residency: BoxResidency
    task: asyncio.Task[None] | None = None
    cursor: SequenceCursor = field(default_factory=SequenceCursor)
    last_batch: EventBatch | None = None  # the last one applied, as received (a replay must match it)
    epoch: str | None = None  # the engine's identity when this publisher's first batch was applied


class CacheEventWatcher:
    """Follows every box's event stream and keeps which watched prefixes each still holds."""

    def __init__(
        self,
        *,
        port: CacheEventPort,
        listener: ResidencyListener,
        fleet: Callable[[], Sequence[BoxSpec]],
        tokenize: Tokenize,
        clock: Clock,
        config: CacheEventsConfig | None = None,
        epoch_of: Callable[[str], str | None] = lambda _box_id: None,
    ) -> None:
        """`tokenize`: the engine's own token ids for a prefix sent as text (`EnginePort.tokenize`);
        `epoch_of`: the box's current engine identity (its epoch), None while not known."""
        self._epoch_of = epoch_of
        self._port = port
        self._listener = listener
        self._fleet = fleet
        self._tokenize = tokenize
        self._clock = clock
        self._config = config or CacheEventsConfig()
        self._follows: dict[str, _Follow] = {}
        self._log = structlog.stdlib.get_logger(__name__)

    # -- what the reconciler asks

    def follows(self, box_id: str) -> bool:
        """Whether the box's evictions are seen (it has an event stream being read)."""
        return box_id in self._follows

    async def watch(self, box: BoxSpec, prefix: Prefix) -> PrefixResidency | None:
        """Follow a warmed prefix on a box (None: the box has no event stream); blocks already stored
        count at once. A prefix sent as text is tokenized by the engine, as its warm request was."""
        follow = self._follows.get(box.id)
        if follow is None:
            return None
        token_ids = list(prefix.token_ids) if prefix.token_ids is not None else None
        if token_ids is None:
            try:
                token_ids = await self._tokenize(box, prefix.text)
            except WarmerError as exc:
                self._log.warning("kv event: cannot tokenize prefix to watch it", box=box.id, error=str(exc))
                return None
        if self._follows.get(box.id) is not follow:
            return None  # the box left (or its stream was reopened) while the engine tokenized
        self._report(box.id, follow.residency.watch(prefix.hash, token_ids))
        return follow.residency.state(prefix.hash)

    def forget(self, box_id: str, prefix_hash: str) -> None:
        follow = self._follows.get(box_id)
        if follow is not None:
            follow.residency.forget(prefix_hash)

    def state(self, box_id: str, prefix_hash: str) -> PrefixResidency | None:
        follow = self._follows.get(box_id)
        return None if follow is None else follow.residency.state(prefix_hash)

    def horizons(self) -> dict[str, float]:
        """Per followed box, how long an unused block lasts there before eviction, where measured yet."""
        measured = {box_id: f.residency.horizon.seconds() for box_id, f in self._follows.items()}
        return {box_id: seconds for box_id, seconds in measured.items() if seconds is not None}

    # -- the root task

    async def run(self, stopping: asyncio.Event) -> None:
        """Follow the fleet's streams until asked to stop; boxes added or removed are picked up."""

        async def follow_fleet() -> None:
            self.sync_boxes(self._fleet())

        try:
            await every_period(follow_fleet, self._clock, self._config.fleet_poll_seconds, stopping)
        finally:
            await self.close()

    def sync_boxes(self, boxes: Sequence[BoxSpec]) -> None:
        """Start following boxes that publish events, stop following the others."""
        wanted = {box.id: box for box in boxes if box.kv_events is not None}
        for box_id in list(self._follows):
            if box_id not in wanted or wanted[box_id] != self._follows[box_id].box:
                self._stop(box_id)
        for box_id, box in wanted.items():
            if box_id not in self._follows:
                follow = self._follows[box_id] = _Follow(
                    box, BoxResidency(max_blocks=self._config.max_blocks)
                )
                follow.task = asyncio.create_task(self._follow(follow), name=f"kv-events:{box_id}")

    async def close(self) -> None:
        tasks = [f.task for f in self._follows.values() if f.task is not None]
        for box_id in list(self._follows):
            self._stop(box_id)
        await asyncio.gather(*tasks, return_exceptions=True)

    def _stop(self, box_id: str) -> None:
        follow = self._follows.pop(box_id)
        if follow.task is not None:
            follow.task.cancel()

    # -- one box

    async def _follow(self, follow: _Follow) -> None:
        box_id = follow.box.id
        with structlog.contextvars.bound_contextvars(box=box_id):
            while True:
                stream: CacheEventStream | None = None
                try:
                    stream = self._port.subscribe(follow.box)
                    while True:
                        await self._take(follow, stream, await stream.receive())
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # any failure of one box's stream must not end the daemon
                    self._log.warning(
                        "kv event stream failed; reopening", box=box_id, error=f"{type(exc).__name__}: {exc}"
                    )
                    self._lost(follow, f"stream failed: {type(exc).__name__}: {exc}")
                    follow.cursor = SequenceCursor()
                    follow.last_batch = follow.epoch = None
                finally:
                    if stream is not None:
                        await stream.aclose()
                await self._clock.sleep(self._config.retry_seconds)

    async def _take(self, follow: _Follow, stream: CacheEventStream, batch: EventBatch) -> None:
        verdict = follow.cursor.classify(batch.seq)
        if verdict in (SeqVerdict.NEXT, SeqVerdict.GAP) and self._identity_changed(follow):
            verdict = SeqVerdict.RESET
        if verdict is SeqVerdict.NEXT:
            self._apply(follow, batch)
        elif verdict is SeqVerdict.GAP:
            await self._fill_gap(follow, stream, batch)
        else:
            if verdict is SeqVerdict.RESET:
                self._restarted(follow, batch)
            await self._catch_up(follow, stream, batch, 0)

    def _identity_changed(self, follow: _Follow) -> bool:
        now = self._epoch_of(follow.box.id)
        return follow.epoch is not None and now is not None and now != follow.epoch

    async def _fill_gap(self, follow: _Follow, stream: CacheEventStream, live: EventBatch) -> None:
        """Replay from the last batch applied: the same publisher answers it unchanged, a new one does not."""
        last, applied = follow.cursor.last, follow.last_batch
        if last is None or applied is None:  # not reached: a gap follows an applied batch
            raise RuntimeError("a gap with no batch applied before it")
        replayed = await self._replay(follow, stream, last)
        if replayed is None or not replay_covers(last, replayed):
            self._lost(follow, f"batches {last + 1}..{live.seq - 1} missed and not replayed")
            self._apply(follow, live)
            return
        if next((b for b in replayed if b.seq == last), None) != applied:
            self._restarted(follow, live)  # batch `last` is another process's: it numbered from 0 again
            await self._catch_up(follow, stream, live, 0)
            return
        for batch in replayed:
            if last < batch.seq < live.seq:
                self._apply(follow, batch)
        self._apply(follow, live)

    async def _catch_up(
        self, follow: _Follow, stream: CacheEventStream, live: EventBatch, start: int
    ) -> None:
        """A publisher's first batch: apply the batches from `start` to `live` (replayed), then `live`."""
        if live.seq > start:
            replayed = await self._replay(follow, stream, start)
            if replayed is not None and replay_covers(start, replayed):
                for batch in replayed:
                    if start <= batch.seq < live.seq:
                        self._apply(follow, batch)
            elif follow.residency.watched():
                # A fresh stream whose start is gone: whatever the missed batches said is not known.
                self._lost(follow, f"stream joined at batch {live.seq}, its start could not be replayed")
        self._apply(follow, live)

    async def _replay(self, follow: _Follow, stream: CacheEventStream, start: int) -> list[EventBatch] | None:
        try:
            return await stream.replay(start)
        except NotSupported:
            return None
        except WarmerError as exc:
            self._log.warning("kv event replay failed", box=follow.box.id, start=start, error=str(exc))
            return None

    def _apply(self, follow: _Follow, batch: EventBatch) -> None:
        if follow.cursor.last is None:
            follow.epoch = self._epoch_of(follow.box.id)
        follow.cursor.advance(batch.seq)
        follow.last_batch = batch
        try:
            changes = follow.residency.apply(batch.events, batch.ts)
        except MirrorOverflow as exc:
            self._lost(follow, str(exc))
            return
        self._report(follow.box.id, changes)

    def _report(self, box_id: str, changes: Sequence[PrefixResidency]) -> None:
        for change in changes:
            if change.state is PrefixState.EVICTED:
                self._log.info(
                    EVENT_EVICTED,
                    box=box_id,
                    prefix=change.prefix_hash,
                    resident_tokens=change.resident_tokens,
                    tracked_tokens=change.tracked_tokens,
                )
                self._listener.prefix_evicted(box_id, change.prefix_hash, change.resident_tokens)
            elif change.state is PrefixState.RESIDENT:
                self._log.info(
                    EVENT_RESIDENT, box=box_id, prefix=change.prefix_hash, tokens=change.tracked_tokens
                )
                self._listener.prefix_resident(box_id, change.prefix_hash)

    def _restarted(self, follow: _Follow, batch: EventBatch) -> None:
        self._log.warning(EVENT_RESTARTED, box=follow.box.id, last_seq=follow.cursor.last, seq=batch.seq)
        follow.residency.clear()  # the new process starts empty; the restart path re-warms everything
        follow.cursor = SequenceCursor()
        follow.last_batch = follow.epoch = None
        self._listener.box_reset(follow.box.id, ResetReason.RESTARTED)

    def _lost(self, follow: _Follow, why: str) -> None:
        self._log.warning(EVENT_LOST, box=follow.box.id, reason=why)
        follow.residency.lose_track()
        self._listener.box_reset(follow.box.id, ResetReason.LOST)
