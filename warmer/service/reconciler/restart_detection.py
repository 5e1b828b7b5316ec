"""How a restart is detected: each box's health and epoch, polled; a new epoch is a new process.

The health timer (every `health_poll_seconds`), and a pass for a box not polled that long (a lease just
gained, a box just added), ask the box's engine whether it is up and what its epoch is; so does `recheck`,
between polls, when a caller met trouble on a box. With several replicas only the box's lease holder polls
it; the others apply what the holder saw, from the store, and count the box not ready once that is older
than the bound (`health_sharing`, `warmer.core.observations`): a restart leaves readiness on every replica
within one poll interval plus one store read interval.

The epoch is the process identity the engine adapter derives (`EnginePort.epoch`: llama.cpp's per-process
media marker or a fingerprint with its decode counter, `RestartWatch` in `warmer.adapters.engines.base` for
engines that expose less), with a rollout tag appended after an undrain (`fleet_edits`), so a box back from
a rollout is a new epoch even when the engine's own identity did not change.

A changed epoch means the process restarted and holds nothing of the old one's cache: the box's records
and pins leave the view at once (so it leaves every route), the new epoch is written to the store (which
drops the old epochs' rows), its cache capacity is read again, and if an earlier daemon already ran this
epoch's restart warm-up (`warmer.service.engine_work.restart_warmup`), its progress is resumed from the store.

A healthy box's capacity is also read again every `capacity_poll_seconds`: where its cache is a shared token
pool, the share live calls hold grows and shrinks with load, and so does the room left for prefixes. The
prefix budget in force moves only past a band (`warmer.core.capacity.capacity_in_force`); a failed reading
keeps the figures in force.

The view changes first and the store writes queue behind it (`flush`): a restarted or failed box leaves
readiness even while the database is down; the writes reach the store as soon as it answers.

A box that refuses the connection, answers an error or shows a new epoch leaves at once. One that takes the
connection but answers too late (`EngineSlow`: busy prefilling, on a saturated host) keeps its routes for
`slow_polls_allowed` polls in a row: taking a busy box out shifts its calls onto the others, and they all
rush back onto it a poll later. A hung box still leaves within that many polls more.

Size: the poll, the view it changes and the store writes behind it are one ordering (view first, writes
queued); split, each half would need the other's internals.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import NamedTuple

import structlog

from warmer.core.capacity import PrefixBudgetPolicy, capacity_in_force
from warmer.core.errors import EngineDown, EngineSlow, HealthFailure, LeaseLost, StoreError, WarmerError
from warmer.core.event_kinds import EventKind
from warmer.core.model import BoxCapacity, BoxSpec, LoggedEvent, PhaseName, PhaseRecord
from warmer.core.observations import StoredObservation
from warmer.core.planner import WarmupStatus
from warmer.ports import Clock, EnginePort, StorePort
from warmer.service.paced import gather_paced
from warmer.service.reconciler.epoch_writes import EpochSeen, EventLater, NewEpoch, write_batch
from warmer.service.reconciler.health_sharing import HealthSharing, HolderPolls
from warmer.service.reconciler.records import WarmBook
from warmer.service.reconciler.types import BoxLive

# Seconds between the store writes of a box's epoch seen again by its polls (`BoxHealth._sighting_due`).
EPOCH_SIGHTING_SECONDS = 60.0


class Health(NamedTuple):
    """One box's answer to a poll."""

    healthy: bool
    epoch: str | None
    error: str | None  # why not healthy: the detail
    slow: bool  # not healthy only because it answered too late
    kind: HealthFailure | None = None  # how it failed: refused, timeout, an HTTP status...


class BoxHealth:
    """What the daemon knows of each box right now (`live`), what its cache holds (`capacity`), which
    boxes the hit-rate monitor suspects (`suspect`), and the store writes the view is ahead of."""

    def __init__(
        self,
        *,
        engine: EnginePort,
        store: StorePort,
        clock: Clock,
        log: structlog.stdlib.BoundLogger,
        book: WarmBook,
        box_ids: Iterable[str],
        epoch_tag: Callable[[str], str | None],
        concurrency: int,
        slow_polls_allowed: int = 1,
        owns: Callable[[str], bool] = lambda _box_id: True,
        capacity_poll_seconds: float = 0.0,
        prefix_budget: PrefixBudgetPolicy | None = None,
        sharing: HealthSharing | None = None,
        repoll_after_seconds: float = 0.0,
    ) -> None:
        self._engine = engine
        self._store = store
        self._clock = clock
        self._log = log
        self._book = book
        self._epoch_tag = epoch_tag
        self._concurrency = concurrency
        self._slow_polls_allowed = slow_polls_allowed
        self._owns = owns  # only a box's lease holder writes its rows (`replicas`)
        self.live: dict[str, BoxLive] = {box_id: BoxLive() for box_id in box_ids}
        # box id -> what its cache holds, as its engine reported it for its latest epoch (kept while the
        # box is down, so an outage does not reshuffle placement)
        self.capacity: dict[str, BoxCapacity] = {}
        self._capacity_poll_seconds = capacity_poll_seconds  # 0: read only for a new process
        self._prefix_budget = prefix_budget or PrefixBudgetPolicy()
        self._capacity_read_at: dict[str, float] = {}  # box id -> monotonic seconds of its last reading
        # box id -> the epoch its capacity figures in force were read in
        self._capacity_epoch: dict[str, str | None] = {}
        self.suspect: set[str] = set()  # boxes whose hit rate dropped (hit-rate monitor): probe them
        # Health and epoch writes the in-memory view is already ahead of, oldest first, one per key.
        self._unwritten: dict[tuple[object, ...], Callable[[], Awaitable[object]]] = {}
        # Several replicas: only a box's lease holder polls it, the others read what it saw.
        self._holder = HolderPolls(sharing, log)
        # A pass polls a box only when its last poll here is this old (the health timer polls them all):
        # one poll per box per health interval, not one more per pass. 0: every pass polls.
        self._repoll_after = repoll_after_seconds
        self._polled_at: dict[str, float] = {}  # box id -> monotonic seconds of its last poll here
        # box id -> the epoch a `recheck` here saw replaced on a box another replica polls: its holder's
        # observation from before that restart never takes the box back to the dead process
        self._superseded: dict[str, str] = {}
        # box id -> (epoch, monotonic seconds) of its last sighting queued for the store (`_sighting_due`)
        self._sighted: dict[str, tuple[str, float]] = {}
        self._settling: dict[str, BoxSpec] = {}  # new processes seen, their reading and writes to follow

    # ------------------------------------------------------------------------------------------- polling

    async def poll_all(self, boxes: Sequence[BoxSpec], now: float, *, every: bool = True) -> bool:
        """Poll the boxes this replica polls (`HolderPolls.polled_here`: all of them when it runs alone),
        concurrently and bounded, and apply each answer to the view (its store writes are queued: `flush`);
        take the others from their holders' stored observations (not ready when stale); share what
        changed; then read the capacity of the healthy boxes whose reading is due. `every=False` (a pass)
        skips boxes polled here within `repoll_after_seconds`. True when a box went up or down, restarted,
        or its capacity figures in force changed."""
        limit = asyncio.Semaphore(self._concurrency)
        here = [box for box in boxes if self._holder.polled_here(box.id)]
        others = [box for box in boxes if not self._holder.polled_here(box.id)]
        stored = await self._holder.read([box.id for box in others])
        if stored is None:  # the store does not answer: this replica's own polls are the current view
            here, others, stored = list(boxes), [], {}
        due = here if every else [box for box in here if self._poll_due(box.id)]

        async def poll(box: BoxSpec) -> Health:
            async with limit:
                return await self.poll(box)

        results = await gather_paced(poll, due)
        changed = False
        for box, health in zip(due, results, strict=True):
            changed = await self._apply_seen(box, health, now) or changed
        for box in others:
            self._polled_at.pop(box.id, None)  # its view is the holder's from now on
            changed = (
                await self._apply_seen(box, self._from_holder(box.id, stored.get(box.id)), now) or changed
            )
        await self._settle_new(limit)
        await self._holder.publish(self.live, self._polled_at.keys(), round_done=len(due) == len(here))
        return await self._follow_load(boxes, limit) or changed

    def _poll_due(self, box_id: str) -> bool:
        last = self._polled_at.get(box_id, -math.inf)
        return self._repoll_after <= 0 or self._clock.monotonic() - last >= self._repoll_after

    def _from_holder(self, box_id: str, stored: StoredObservation | None) -> Health:
        """A box another replica holds, as its holder last saw it; not ready when that is stale."""
        seen = self._holder.trusted(box_id, stored)
        if isinstance(seen, str):
            return Health(False, None, f"not polled here: {seen}", slow=False, kind=HealthFailure.STALE)
        if seen.epoch is not None and seen.epoch == self._superseded.get(box_id):
            why = f"not polled here: its holder still reports epoch {seen.epoch}, seen replaced here"
            return Health(False, None, why, slow=False, kind=HealthFailure.STALE)
        self._superseded.pop(box_id, None)  # the holder saw the restart too
        if seen.healthy:
            return Health(True, seen.epoch, None, slow=False)
        kind = HealthFailure(seen.failure) if seen.failure in set(HealthFailure) else HealthFailure.UNHEALTHY
        return Health(False, None, seen.error, slow=False, kind=kind)

    async def _apply_seen(self, box: BoxSpec, health: Health, now: float) -> bool:
        """Apply one answer; True when the box went up or down, or restarted."""
        before = self.live.get(box.id)
        was = (before.healthy, before.epoch) if before is not None else None
        await self.apply(box, health, now)
        after = self.live.get(box.id)
        return after is not None and was is not None and (after.healthy, after.epoch) != was

    async def poll(self, box: BoxSpec) -> Health:
        """One box's health and epoch, as its engine answers now."""
        self._polled_at[box.id] = self._clock.monotonic()
        try:
            if not await self._engine.health(box):
                return Health(False, None, "health check failed", slow=False, kind=HealthFailure.UNHEALTHY)
        except EngineSlow as exc:
            return Health(False, None, str(exc), slow=True, kind=HealthFailure.TIMEOUT)
        except EngineDown as exc:
            return Health(False, None, str(exc), slow=False, kind=exc.kind)
        except WarmerError as exc:
            return Health(False, None, str(exc), slow=False, kind=HealthFailure.UNHEALTHY)
        try:
            epoch = await self._engine.epoch(box)
        except EngineSlow as exc:
            return Health(False, None, str(exc), slow=True, kind=HealthFailure.TIMEOUT)
        except WarmerError as exc:
            return Health(False, None, str(exc), slow=False, kind=HealthFailure.EPOCH)
        tag = self._epoch_tag(box.id)
        return Health(True, epoch if tag is None else f"{epoch}~{tag}", None, slow=False)

    async def recheck(self, box: BoxSpec, lock: asyncio.Lock) -> bool:
        """Look at one box now, between polls; True when something changed (applied under `lock`, the
        fleet lock, and written if the store answers)."""
        health = await self.poll(box)
        live = self.live.get(box.id)
        foreign = not self._holder.polled_here(box.id)
        if (
            foreign
            and live is not None
            and live.epoch is not None
            and health.healthy
            and health.epoch != live.epoch
        ):
            self._superseded[box.id] = live.epoch  # a restart its holder has not seen yet
        if live is not None and health.healthy == live.healthy and health.epoch == live.epoch:
            return False
        async with lock:
            changed = await self._apply_seen(box, health, self._clock.now())
            await self._settle_new(asyncio.Semaphore(1))
            try:
                await self.flush()
            except StoreError as exc:  # the answer comes from the view; the next pass writes it
                self._log.warning("box health not stored yet", box=box.id, error=str(exc))
        return changed

    async def apply(self, box: BoxSpec, health: Health, now: float) -> None:
        """Change the in-memory view first, then queue its store writes: what the daemon sees of a box
        must take it out of readiness at once, whether or not the database answers."""
        live = self.live.get(box.id)
        if live is None:
            return  # removed from the fleet while it was being polled
        healthy, epoch, error, slow, kind = health
        if not healthy or epoch is None:
            if slow and live.healthy and live.slow_polls < self._slow_polls_allowed:
                live.slow_polls += 1
                self._log.warning(
                    "box slow to answer its health poll: kept in its routes",
                    box=box.id,
                    error=error,
                    kind=kind,
                    slow_polls=live.slow_polls,
                    allowed=self._slow_polls_allowed,
                )
                return
            live.slow_polls = 0
            kind = kind or HealthFailure.UNHEALTHY
            if kind is not HealthFailure.STALE:
                live.seen_up = False
            if live.healthy:
                self._log.warning("box unhealthy: out of every route", box=box.id, kind=kind, error=error)
                event = LoggedEvent(
                    at=now,
                    kind=EventKind.BOX_UNHEALTHY,
                    box_id=box.id,
                    epoch=live.epoch,
                    detail={"error": error, "kind": str(kind)},
                )
                if self._owns(box.id):
                    self._event_later(event)
            elif (kind, error) != (live.health_error_kind, live.health_error):
                # Never up yet, or down another way than at the last poll: an unreachable box is in the
                # log from its first poll, and each change of why (refused -> 503 -> timeout) is too.
                self._log.warning("box unhealthy", box=box.id, kind=kind, error=error)
            live.healthy, live.health_error, live.health_error_kind = False, error, kind
            return
        if epoch != live.epoch:
            self._new_epoch(box, epoch, live, now)
            return
        if self._owns(box.id):
            if self._sighting_due(box.id, epoch):
                self._write_later((box.id, "epoch", epoch), EpochSeen(self._store, box.id, epoch, now))
            if not live.healthy:
                self._event_later(LoggedEvent(at=now, kind=EventKind.BOX_HEALTHY, box_id=box.id, epoch=epoch))
        if not live.healthy and live.health_error is not None:
            self._log.info("box healthy again", box=box.id, was=live.health_error_kind)
        live.healthy, live.health_error, live.health_error_kind, live.slow_polls = True, None, None, 0
        live.seen_up = True

    def _new_epoch(self, box: BoxSpec, epoch: str, previous: BoxLive, now: float) -> None:
        """A restart: the new process starts cold (the view changes now: its records, keyed by epoch, no
        longer match); the old records dropped, its capacity read, its epoch stored and its warm-up resumed if
        begun follow for every new process of the round (`_settle_new`)."""
        fresh = BoxLive(
            healthy=True,
            epoch=epoch,
            healthy_since=now,
            healthy_since_mono=self._clock.monotonic(),
            seen_up=True,
        )
        self.live[box.id] = fresh
        self._log.info("box epoch", box=box.id, epoch=epoch, previous=previous.epoch)
        key = (box.id, "epoch", epoch)
        self._unwritten.pop(key, None)  # back to an epoch still queued: it is now the newest write
        self._settling[box.id] = box
        if self._owns(box.id):  # else another replica holds the box: its warm-up is read from its phases
            self._write_later(key, NewEpoch(self._store, box.id, epoch, now))
            self._sighted[box.id] = (epoch, self._clock.monotonic())

    async def _settle_new(self, limit: asyncio.Semaphore) -> None:
        """The new processes seen since the last call: their capacity read (concurrently, under `limit`),
        then for those held here their epochs written (one transaction) and their restart warm-ups resumed
        from the store (one read). A region restart is a few round trips, not a few per box."""
        settling, self._settling = self._settling, {}
        if not settling:
            return
        self._book.keep_only_epochs(
            {box_id: live.epoch for box_id in settling if (live := self.live.get(box_id)) and live.epoch}
        )

        async def read(box: BoxSpec) -> None:
            async with limit:
                await self._read_capacity(box, fresh=True)

        await gather_paced(read, settling.values())
        held = {
            box_id: live
            for box_id in settling
            if (live := self.live.get(box_id)) is not None and live.epoch is not None and self._owns(box_id)
        }
        if not held:
            return
        try:
            await self.flush()
            phases = await self._store.phases_of({box_id: live.epoch or "" for box_id, live in held.items()})
        except StoreError as exc:  # cold until a pass can read the store: never warm by default
            self._log.warning("box epochs not stored yet", boxes=sorted(held), error=str(exc))
            return
        for box_id, live in held.items():
            if self.live.get(box_id) is live:  # not replaced meanwhile
                _resume_warmup(live, phases.get(box_id, []))

    # ------------------------------------------------------------------------------------- store writes

    def _sighting_due(self, box_id: str, epoch: str) -> bool:
        """Whether a poll's sighting of the box's known epoch goes to the store: the first in this replica,
        else once per `EPOCH_SIGHTING_SECONDS`. A sighting only moves the epoch's last-seen time (history
        no decision reads) and re-asserts an epoch the store already holds; written at every poll it was a
        row per box per poll interval, the bulk of the database's writes at a few hundred boxes."""
        now = self._clock.monotonic()
        last = self._sighted.get(box_id)
        if last is not None and last[0] == epoch and now - last[1] < EPOCH_SIGHTING_SECONDS:
            return False
        self._sighted[box_id] = (epoch, now)
        return True

    def _write_later(self, key: tuple[object, ...], write: Callable[[], Awaitable[object]]) -> None:
        """Queue a store write behind the ones already waiting (one per `key`, (box id, what, ...): the
        first one queued)."""
        self._unwritten.setdefault(key, write)

    def _event_later(self, event: LoggedEvent) -> None:
        self._write_later((event.box_id, "event", event.kind, event.at), EventLater(self._store, event))

    async def flush(self) -> None:
        """Write what the view is ahead of, oldest first; each leaves the queue once written, so a
        StoreError (raised) keeps it and the rest for the next try. One the database refuses because
        another replica holds the box now (`LeaseLost`) leaves the queue: that replica writes the box."""
        while self._unwritten:
            key, write = next(iter(self._unwritten.items()))
            if isinstance(write, EpochSeen | NewEpoch | EventLater):  # with every other box's, at once
                await write_batch(self._unwritten, self._store, self._log)
                continue
            try:
                await write()
            except LeaseLost as exc:
                self._log.warning("box write dropped: lease held elsewhere", box=key[0], error=str(exc))
            del self._unwritten[key]

    # -------------------------------------------------------------------------------- the new process

    async def _read_capacity(self, box: BoxSpec, *, fresh: bool = False) -> bool:
        """Read the box's capacity and apply it; True when the figures in force changed. `fresh`: a new
        process, whose figures replace the old ones outright (its pool may differ; its cache is empty)."""
        read = await self._fetch_capacity(box)
        return False if read is None else self._apply_capacity(box, read, fresh=fresh)

    async def _fetch_capacity(self, box: BoxSpec) -> BoxCapacity | None:
        """What the box's cache holds beside its live calls, as its engine says now; None when the reading
        failed (the figures in force stay: a box too busy to answer has no more room than before)."""
        self._capacity_read_at[box.id] = self._clock.monotonic()
        try:
            return await self._engine.capacity(box)
        except WarmerError as exc:
            self._log.warning("box capacity unknown", box=box.id, error=str(exc))
            return None

    def _apply_capacity(self, box: BoxSpec, read: BoxCapacity, *, fresh: bool) -> bool:
        """The reading through the prefix budget's band (placement never gives a box more than this);
        each change is logged once. True when a figure placement uses changed."""
        before = self.capacity.get(box.id)
        after = capacity_in_force(None if fresh else before, read, self._prefix_budget)
        self.capacity[box.id] = after
        live = self.live.get(box.id)
        self._capacity_epoch[box.id] = None if live is None else live.epoch
        shape = (after.prefixes, after.pool_tokens, after.pinnable_slots, after.source)
        if (
            before is None
            or (before.prefixes, before.pool_tokens, before.pinnable_slots, before.source) != shape
        ):
            self._log.info(
                "box capacity",
                box=box.id,
                prefixes=after.prefixes,
                tokens=after.tokens,
                pool_tokens=after.pool_tokens,
                source=after.source,
            )
        old = None if before is None else before.tokens
        if after.pool_tokens is not None and after.tokens != old:
            self._log.info(
                "box prefix budget",
                box=box.id,
                old=old,
                new=after.tokens,
                pool=after.pool_tokens,
                used=after.used_share,
                configured=box.cache_capacity_tokens,  # set: it wins over these figures
            )
        return before is None or (before.prefixes, before.tokens) != (after.prefixes, after.tokens)

    async def _follow_load(self, boxes: Sequence[BoxSpec], limit: asyncio.Semaphore) -> bool:
        """Read the capacity of every healthy box whose last reading is `capacity_poll_seconds` old and
        can have moved since: a shared token pool (its free share follows load), or no figures read in its
        current epoch yet. A reading without a pool (llama.cpp's slots) is fixed for the process: read once
        per epoch, not every period on every replica. Concurrently under the poll's bound; True when any
        figures in force changed."""
        if self._capacity_poll_seconds <= 0:
            return False
        now = self._clock.monotonic()
        due = [
            box
            for box in boxes
            if (live := self.live.get(box.id)) is not None
            and live.healthy
            and (
                (held := self.capacity.get(box.id)) is None
                or held.pool_tokens is not None
                or self._capacity_epoch.get(box.id) != live.epoch
            )
            and now - self._capacity_read_at.get(box.id, -math.inf) >= self._capacity_poll_seconds
        ]

        async def read(box: BoxSpec) -> BoxCapacity | None:
            async with limit:
                return await self._fetch_capacity(box)

        readings = await gather_paced(read, due)
        changed = False
        for box, capacity in zip(due, readings, strict=True):
            if capacity is not None and box.id in self.live:
                changed = self._apply_capacity(box, capacity, fresh=False) or changed
        return changed

    # ------------------------------------------------------------------------------------- fleet edits

    def add_box(self, box_id: str) -> None:
        self.live[box_id] = BoxLive()

    def forget_box(self, box_id: str) -> None:
        """A box left the fleet: its epoch rows go with its box row, so a queued epoch write would now
        fail on every pass."""
        self.capacity.pop(box_id, None)
        self._capacity_read_at.pop(box_id, None)
        self._capacity_epoch.pop(box_id, None)
        self._polled_at.pop(box_id, None)
        self._superseded.pop(box_id, None)
        self._sighted.pop(box_id, None)
        self.live.pop(box_id, None)
        self._unwritten = {k: w for k, w in self._unwritten.items() if k[:2] != (box_id, "epoch")}

    def set_suspect(self, box_id: str, suspect: bool) -> None:
        if suspect:
            self.suspect.add(box_id)
        else:
            self.suspect.discard(box_id)

    def current_epochs(self) -> dict[str, str]:
        return {box_id: live.epoch for box_id, live in self.live.items() if live.epoch is not None}


def _resume_warmup(live: BoxLive, phases: Sequence[PhaseRecord]) -> None:
    """The restart warm-up of an epoch already seen (daemon restarted while the engine kept running)
    counts as done only when its PREFIXES phase was reached; a failed phase waits for its retry."""
    failed = [p for p in phases if p.ok is False]
    if failed:
        live.warmup = WarmupStatus.FAILED
        live.warmup_finished_at = max(p.finished_at or p.started_at for p in failed)
        live.warmup_error = failed[-1].error
    elif prefixes := [p for p in phases if p.phase is PhaseName.PREFIXES]:
        live.warmup = WarmupStatus.DONE
        live.warmup_finished_at = max(p.started_at for p in prefixes)
        live.resumed = True
        if all(p.finished_at is None for p in prefixes):
            # The previous daemon died mid-phase: this one finishes its row. A finished row is history
            # this daemon must not overwrite with the timings of its re-verification probes.
            live.prefixes_started_at = live.warmup_finished_at
