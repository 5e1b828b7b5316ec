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
from warmer.core.kv_event_stream import EventBatch, SequenceCursor, SeqVerdict, replay_covers
from warmer.core.model import BoxSpec, CacheLayout, Prefix
from warmer.core.residency import BlockHasher, BoxResidency, MirrorOverflow, PrefixResidency, PrefixState
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
    """One data-parallel rank's stream of a box (rank 0 without data parallelism)."""

    box: BoxSpec
    residency: BoxResidency
    rank: int = 0
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
        layout_of: Callable[[BoxSpec], Awaitable[CacheLayout]] | None = None,
        hasher_of: Callable[[BoxSpec], BlockHasher | None] = lambda _box: None,
    ) -> None:
        """`tokenize`: the engine's own token ids for a prefix sent as text (`EnginePort.tokenize`);
        `epoch_of`: the box's current engine identity (its epoch), None while not known; `layout_of`: the
        server's cache layout: its data-parallel ranks (each publishes its own stream; unset: one) and
        block size; `hasher_of`: the box's block hasher where its hashes are reproducible."""
        self._epoch_of = epoch_of
        self._layout_of = layout_of
        self._hasher_of = hasher_of
        self._layouts: dict[str, CacheLayout] = {}  # box id -> layout last read
        self._port = port
        self._listener = listener
        self._fleet = fleet
        self._tokenize = tokenize
        self._clock = clock
        self._config = config or CacheEventsConfig()
        self._follows: dict[tuple[str, int], _Follow] = {}  # (box id, data-parallel rank)
        self._log = structlog.stdlib.get_logger(__name__)

    def _layout(self, box_id: str) -> CacheLayout:
        return self._layouts.get(box_id) or CacheLayout()

    def _of(self, box_id: str) -> list[_Follow]:
        return [f for (b, _), f in sorted(self._follows.items()) if b == box_id]

    # -- what the reconciler asks

    def follows(self, box_id: str) -> bool:
        """Whether the box's evictions are seen (it has an event stream being read)."""
        return bool(self._of(box_id))

    async def watch(self, box: BoxSpec, prefix: Prefix) -> PrefixResidency | None:
        """Follow a warmed prefix on a box, on every rank (None: the box has no event stream); blocks
        already stored count at once. A prefix sent as text is tokenized by the engine, as its warm was."""
        follows = self._of(box.id)
        if not follows:
            return None
        token_ids = list(prefix.token_ids) if prefix.token_ids is not None else None
        if token_ids is None:
            try:
                token_ids = await self._tokenize(box, prefix.text)
            except WarmerError as exc:
                self._log.warning("kv event: cannot tokenize prefix to watch it", box=box.id, error=str(exc))
                return None
        if self._of(box.id) != follows:
            return None  # the box left (or its streams were reopened) while the engine tokenized
        for follow in follows:
            self._report(box.id, follow.residency.watch(prefix.hash, token_ids))
        return self.state(box.id, prefix.hash)

    def forget(self, box_id: str, prefix_hash: str) -> None:
        for follow in self._of(box_id):
            follow.residency.forget(prefix_hash)

    def state(self, box_id: str, prefix_hash: str) -> PrefixResidency | None:
        """The prefix on the box: RESIDENT only when every rank holds it, EVICTED when one lost it."""
        views = [f.residency.state(prefix_hash) for f in self._of(box_id)]
        known = [v for v in views if v is not None]
        if not known or len(known) < len(views):
            return None
        if len(known) == 1:
            return known[0]
        states = {v.state for v in known}
        state = (
            PrefixState.EVICTED
            if PrefixState.EVICTED in states
            else PrefixState.RESIDENT
            if states == {PrefixState.RESIDENT}
            else PrefixState.UNKNOWN
        )
        return PrefixResidency(
            prefix_hash,
            state,
            min(v.resident_tokens for v in known),
            min(v.tracked_tokens for v in known),
            max(v.block_tokens for v in known),
        )

    def horizons(self) -> dict[str, float]:
        """Per followed box, how long an unused block lasts there before eviction (its shortest-lived
        rank's), where measured yet."""
        out: dict[str, float] = {}
        for (box_id, _), follow in self._follows.items():
            seconds = follow.residency.horizon.seconds()
            if seconds is not None:
                out[box_id] = min(seconds, out.get(box_id, seconds))
        return out

    # -- the root task

    async def run(self, stopping: asyncio.Event) -> None:
        """Follow the fleet's streams until asked to stop; boxes added or removed are picked up."""

        async def follow_fleet() -> None:
            await self.sync_fleet(self._fleet())

        try:
            await every_period(follow_fleet, self._clock, self._config.fleet_poll_seconds, stopping)
        finally:
            await self.close()

    async def sync_fleet(self, boxes: Sequence[BoxSpec]) -> None:
        """Read each box's data-parallel ranks, then follow what publishes (`sync_boxes`)."""
        await self._read_layouts(boxes)
        self.sync_boxes(boxes)

    async def _read_layouts(self, boxes: Sequence[BoxSpec]) -> None:
        """Each box's layout (data-parallel ranks, block size), as its server says (unchanged when it does
        not answer now)."""
        if self._layout_of is None:
            return
        for box in boxes:
            if box.kv_events is None:
                continue
            try:
                self._layouts[box.id] = await self._layout_of(box)
            except WarmerError as exc:
                self._log.debug("kv event: layout not read", box=box.id, error=str(exc))

    def sync_boxes(self, boxes: Sequence[BoxSpec]) -> None:
        """Start following boxes that publish events (one stream per data-parallel rank), stop following
        the others."""
        wanted = {
            (box.id, rank): box
            for box in boxes
            if box.kv_events is not None
            for rank in range(self._layout(box.id).data_parallel_ranks)
        }
        for key in list(self._follows):
            if key not in wanted or wanted[key] != self._follows[key].box:
                self._stop(key)
        for key, box in wanted.items():
            if key not in self._follows:
                residency = BoxResidency(
                    max_blocks=self._config.max_blocks,
                    hasher=self._hasher_of(box),
                    block_size_hint=self._layout(box.id).page_tokens,
                )
                follow = self._follows[key] = _Follow(box, residency, rank=key[1])
                name = f"kv-events:{box.id}" if key[1] == 0 else f"kv-events:{box.id}:rank{key[1]}"
                follow.task = asyncio.create_task(self._follow(follow), name=name)

    async def close(self) -> None:
        tasks = [f.task for f in self._follows.values() if f.task is not None]
        for key in list(self._follows):
            self._stop(key)
        await asyncio.gather(*tasks, return_exceptions=True)

    def _stop(self, key: tuple[str, int]) -> None:
        follow = self._follows.pop(key)
        if follow.task is not None:
            follow.task.cancel()

    # -- one box

    async def _follow(self, follow: _Follow) -> None:
        box_id = follow.box.id
        with structlog.contextvars.bound_contextvars(box=box_id):
            while True:
                stream: CacheEventStream | None = None
                try:
                    stream = self._port.subscribe(follow.box, follow.rank)
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
