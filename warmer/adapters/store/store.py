"""`SqlStore`: the StorePort over SQLAlchemy, on embedded SQLite or PostgreSQL (psycopg 3).

The ORM work is synchronous and runs in a worker thread, one short transaction per call: no async driver
to install, and the event loop never waits on disk or the network. The threads are the store's own
(`STORE_THREADS`, fewer than the connection pool holds), not the event loop's default executor, where
tokenizing prompts and other blocking work queue; and lease heartbeats have a lane of their own
(`lane=True`), so a replica under load never lets its leases lapse behind its own store work. Writes that
must not race (upserts, idempotency keys) lean on the database's own constraints, so several daemon
replicas on one PostgreSQL stay correct.

Fencing (several replicas): once `fence_box_writes(replica_id)` is called, every write of a box's own rows
(its epoch, warm records, restart warm-up phases) first checks, in its transaction, that `box_leases` names
this replica as the box's holder with a lease the database clock has not seen expire, and holds that row
FOR SHARE until commit: a replica paused past its lease (a stopped process, a long GC) cannot write over
its successor's work, and a takeover waits for a write already checked. A refused write is `LeaseLost`.

Size: the StorePort over SQL is one class with one method per port call (about twenty), each one short
transaction through the same plumbing at the bottom; apart, the methods would lose the one rule they share.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import Engine, delete, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session

from warmer.adapters.store.engine import WRITE_OPTION, create_store_engine
from warmer.adapters.store.history import observations, token_history_query
from warmer.adapters.store.tables import (
    AgentRow,
    Base,
    BoxEpochRow,
    BoxLeaseRow,
    BoxRow,
    CampaignRow,
    EventRow,
    PrefixVersionRow,
    RestartPhaseRow,
    WarmRecordRow,
    WebhookEventRow,
)
from warmer.core.errors import LeaseLost, StoreError, StoreUnavailable
from warmer.core.event_kinds import EventKind
from warmer.core.model import (
    BoxSpec,
    Campaign,
    LoggedEvent,
    PhaseName,
    PhaseRecord,
    Prefix,
    WarmRecord,
    WarmState,
    prefix_hash,
)
from warmer.core.tokenizer_drift import TokenCountObservation

T = TypeVar("T")

# Worker threads of one store (below SQLAlchemy's default pool of 5 + 10 overflow connections, so a
# transaction never waits for a connection), and the lease heartbeats' own thread beside them.
STORE_THREADS = 8

# Event kinds this store appends by itself, next to whatever the services log.


class SqlStore:
    """Durable warm state in one SQL database. Build with `SqlStore.from_url`; `close()` when done."""

    def __init__(self, engine: Engine, *, now: Callable[[], float] = time.time) -> None:
        self._engine = engine
        self._writer = engine.execution_options(**{WRITE_OPTION: True})
        self._dialect = engine.dialect.name
        if self._dialect not in ("sqlite", "postgresql"):
            raise StoreError(f"database url: unsupported backend {self._dialect!r} (sqlite or postgresql)")
        self._now = now  # only for rows whose port call carries no time (sync_boxes)
        self._fence: str | None = None  # the replica whose lease every box-scoped write must hold
        self._threads = ThreadPoolExecutor(STORE_THREADS, thread_name_prefix="warmer-store")
        self._lane = ThreadPoolExecutor(1, thread_name_prefix="warmer-store-leases")

    @classmethod
    def from_url(cls, url: str, *, now: Callable[[], float] = time.time) -> SqlStore:
        """A store over `url` (`sqlite:///path` or `postgresql+psycopg://...`). Does not migrate:
        call `upgrade_database(url)` first."""
        return cls(create_store_engine(url), now=now)

    @property
    def dialect(self) -> str:
        return self._dialect

    def fence_box_writes(self, replica_id: str) -> None:
        """From now on, a box's own rows are written only while `replica_id` holds the box's lease."""
        if not replica_id:
            raise StoreError("replica_id: must not be empty")
        self._fence = replica_id

    def db_now(self, session: Session) -> float:
        """The database's clock on PostgreSQL (every replica measures leases by one clock); this process's
        on SQLite (one replica)."""
        if self._dialect == "postgresql":
            return float(session.execute(text("SELECT extract(epoch from clock_timestamp())")).scalar_one())
        return self._now()

    def _check_fence(self, session: Session, box_id: str) -> None:
        """Refuse the transaction's write of `box_id`'s rows unless this replica holds its live lease."""
        if self._fence is None:
            return
        held = select(BoxLeaseRow.box_id).where(
            BoxLeaseRow.box_id == box_id,
            BoxLeaseRow.owner == self._fence,
            BoxLeaseRow.expires_at > self.db_now(session),
        )
        if self._dialect == "postgresql":
            held = held.with_for_update(read=True)  # FOR SHARE: a takeover waits for this commit
        if session.execute(held).first() is None:
            raise LeaseLost(f"box {box_id!r}: replica {self._fence!r} no longer holds its lease; not written")

    def _fenced_out(self, session: Session, box_ids: Collection[str]) -> frozenset[str]:
        """`_check_fence` for many boxes in one query: those this replica may not write now."""
        if self._fence is None:
            return frozenset()
        held = select(BoxLeaseRow.box_id).where(
            BoxLeaseRow.box_id.in_(sorted(box_ids)),
            BoxLeaseRow.owner == self._fence,
            BoxLeaseRow.expires_at > self.db_now(session),
        )
        if self._dialect == "postgresql":
            held = held.with_for_update(read=True)  # FOR SHARE: a takeover waits for this commit
        return frozenset(box_ids) - set(session.scalars(held))

    async def close(self) -> None:
        """Close the pool's connections. The store stays usable (a later call connects again, as SQLAlchemy
        allows), so its threads stay too: idle, they end with the store."""
        await self._in_thread(self._engine.dispose)

    # -- boxes and epochs ---------------------------------------------------------------------------

    async def sync_boxes(self, boxes: Sequence[BoxSpec]) -> None:
        """Make the boxes table equal the configured fleet; a removed box takes its epochs, warm records
        and phases with it (its history stays in the event log)."""
        seen: set[str] = set()
        for index, box in enumerate(boxes):
            if box.id in seen:
                raise StoreError(f"boxes[{index}].id: duplicate box id {box.id!r}")
            seen.add(box.id)
        now = self._now()

        def work(session: Session) -> None:
            existing = {box_id: url for box_id, url in session.execute(select(BoxRow.id, BoxRow.base_url))}
            for box in boxes:
                self._upsert(
                    session,
                    BoxRow,
                    {
                        "id": box.id,
                        "base_url": box.base_url,
                        "engine": str(box.engine),
                        "model": box.model,
                        "slots": box.slots,
                        "group": box.group,
                        "cache_capacity_tokens": box.cache_capacity_tokens,
                        "updated_at": now,
                    },
                    keys=["id"],
                )
                if box.id not in existing:
                    # the one row of this fact, whatever added the box (config, deploy event, discovery)
                    detail = {"base_url": box.base_url, "engine": str(box.engine), "model": box.model,
                              "slots": box.slots, "group": box.group}  # fmt: skip
                    session.add(EventRow(at=now, kind=EventKind.BOX_ADDED, box_id=box.id, detail=detail))
            removed = sorted(set(existing) - seen)
            if removed:
                session.execute(delete(BoxRow).where(BoxRow.id.in_(removed)))
                session.add_all(
                    EventRow(
                        at=now,
                        kind=EventKind.BOX_REMOVED,
                        box_id=box_id,
                        detail={"base_url": existing[box_id]},
                    )
                    for box_id in removed
                )

        await self._run(work, write=True)

    async def record_epoch(self, box_id: str, epoch: str, at: float) -> bool:
        if not epoch:
            raise StoreError(f"epoch: must not be empty (box {box_id!r})")

        def work(session: Session) -> bool:
            self._check_fence(session, box_id)
            box = session.get(BoxRow, box_id, with_for_update=True)
            if box is None:
                raise StoreError(f"box_id: unknown box {box_id!r}; sync_boxes before recording its epoch")
            self._upsert(
                session,
                BoxEpochRow,
                {"box_id": box_id, "epoch": epoch, "first_seen_at": at, "last_seen_at": at},
                keys=["box_id", "epoch"],
                update=["last_seen_at"],
            )
            return _move_epoch(session, box, epoch, at)

        return await self._run(work, write=True)

    async def record_epochs(
        self, seen: Sequence[tuple[str, str, float]], *, drop_others: bool = False
    ) -> frozenset[str]:
        """`record_epoch` for many boxes (box id, epoch, when seen) in one transaction: a pass that polled
        the whole fleet writes once, not once per box. A box whose lease this replica no longer holds is
        skipped, not written (returned: the holder writes it); an unknown box or an empty epoch writes
        nothing. `drop_others`: new processes, so each written box's records of every other epoch go too
        (`drop_other_epochs`), in the same transaction."""
        for box_id, epoch, _ in seen:
            if not epoch:
                raise StoreError(f"epoch: must not be empty (box {box_id!r})")
        latest = {box_id: (epoch, at) for box_id, epoch, at in seen}  # one row per box: the last seen
        if not latest:
            return frozenset()

        def work(session: Session) -> frozenset[str]:
            refused = self._fenced_out(session, latest)
            ids = sorted(set(latest) - refused)
            boxes = {
                row.id: row
                for row in session.scalars(select(BoxRow).where(BoxRow.id.in_(ids)).with_for_update())
            }
            unknown = sorted(set(ids) - set(boxes))
            if unknown:
                raise StoreError(f"box_id: unknown boxes {unknown}; sync_boxes before recording their epochs")
            if ids:
                self._upsert_many(
                    session,
                    BoxEpochRow,
                    [
                        {
                            "box_id": b,
                            "epoch": latest[b][0],
                            "first_seen_at": latest[b][1],
                            "last_seen_at": latest[b][1],
                        }
                        for b in ids
                    ],
                    keys=["box_id", "epoch"],
                    update=["last_seen_at"],
                )
            for box_id in ids:
                _move_epoch(session, boxes[box_id], *latest[box_id])
            if drop_others:
                _drop_other_epochs(session, {b: latest[b][0] for b in ids}, self._now())
            return refused

        return await self._run(work, write=True)

    async def current_epoch(self, box_id: str) -> str | None:
        return await self._run(
            lambda session: session.scalar(select(BoxRow.current_epoch).where(BoxRow.id == box_id)),
            write=False,
        )

    # -- agents and prefixes ------------------------------------------------------------------------

    async def record_prefix(
        self, agent_id: str, spec_hash: str, prefix: Prefix, *, engine_version: str, at: float
    ) -> None:
        """Remember the agent's spec version and the prefix it produced; recording the same version
        again changes nothing."""
        if not agent_id:
            raise StoreError("agent_id: must not be empty")
        id_hash = prefix.hash
        text_hash = prefix_hash(prefix.text)  # drift key: the text, not the ids (see PrefixVersionRow)

        def work(session: Session) -> None:
            self._upsert(
                session,
                AgentRow,
                {"id": agent_id, "spec_hash": spec_hash, "updated_at": at},
                keys=["id"],
            )
            values = {
                "agent_id": agent_id,
                "spec_hash": spec_hash,
                "prefix_hash": id_hash,
                "prefix_tokens": prefix.token_count,
                "model": prefix.model,
                "engine_version": engine_version,
                "created_at": at,
                "text_hash": text_hash,
            }
            inserted = self._insert_if_absent(
                session, PrefixVersionRow, values, keys=["agent_id", "prefix_hash", "model", "engine_version"]
            )
            if inserted:
                session.add(
                    EventRow(
                        at=at,
                        kind=EventKind.PREFIX_VERSION,
                        agent_id=agent_id,
                        prefix_hash=id_hash,
                        detail={
                            "spec_hash": spec_hash,
                            "prefix_tokens": prefix.token_count,
                            "model": prefix.model,
                            "engine_version": engine_version,
                        },
                    )
                )

        await self._run(work, write=True)

    async def prefix_token_history(self, model: str, text_hash: str) -> list[TokenCountObservation]:
        """Every recorded token count of one prefix text for one model, oldest first (one per agent,
        engine version and token-id hash: agents sharing a prefix each contribute their rows)."""

        def work(session: Session) -> list[TokenCountObservation]:
            return observations(model, text_hash, session.execute(token_history_query(model, text_hash)))

        return await self._run(work, write=False)

    # -- warm records -------------------------------------------------------------------------------

    async def get_warm(self, box_id: str, epoch: str, prefix_hash: str) -> WarmRecord | None:
        def work(session: Session) -> WarmRecord | None:
            row = session.get(WarmRecordRow, (box_id, epoch, prefix_hash))
            return None if row is None else _warm_from_row(row)

        return await self._run(work, write=False)

    async def list_warm(self, *, box_id: str | None = None, epoch: str | None = None) -> list[WarmRecord]:
        def work(session: Session) -> list[WarmRecord]:
            query = select(WarmRecordRow).order_by(
                WarmRecordRow.box_id, WarmRecordRow.epoch, WarmRecordRow.prefix_hash
            )
            if box_id is not None:
                query = query.where(WarmRecordRow.box_id == box_id)
            if epoch is not None:
                query = query.where(WarmRecordRow.epoch == epoch)
            return [_warm_from_row(row) for row in session.scalars(query)]

        return await self._run(work, write=False)

    async def put_warm(self, record: WarmRecord, *, reason: str, previous: WarmState | None) -> None:
        """Write the record and append its transition event in one transaction: both or neither."""

        def work(session: Session) -> None:
            self._check_fence(session, record.box_id)
            self._upsert(
                session,
                WarmRecordRow,
                {
                    "box_id": record.box_id,
                    "epoch": record.epoch,
                    "prefix_hash": record.prefix_hash,
                    "state": str(record.state),
                    "prefix_tokens": record.prefix_tokens,
                    "verified_cached_tokens": record.verified_cached_tokens,
                    "attempts": record.attempts,
                    "last_error": record.last_error,
                    "updated_at": record.updated_at,
                    "warmed_at": record.warmed_at,
                    "verified_at": record.verified_at,
                },
                keys=["box_id", "epoch", "prefix_hash"],
            )
            session.add(
                EventRow(
                    at=record.updated_at,
                    kind=EventKind.WARM_TRANSITION,
                    box_id=record.box_id,
                    epoch=record.epoch,
                    prefix_hash=record.prefix_hash,
                    detail={
                        "from": None if previous is None else str(previous),
                        "to": str(record.state),
                        "reason": reason,
                        "attempts": record.attempts,
                        "verified_cached_tokens": record.verified_cached_tokens,
                        "error": record.last_error,
                    },
                )
            )

        await self._run(work, write=True)

    async def drop_other_epochs(self, box_id: str, keep_epoch: str) -> int:
        def work(session: Session) -> int:
            self._check_fence(session, box_id)
            return _drop_other_epochs(session, {box_id: keep_epoch}, self._now()).get(box_id, 0)

        return await self._run(work, write=True)

    # -- restart warm-up phases ---------------------------------------------------------------------

    async def put_phase(self, record: PhaseRecord) -> None:
        """Insert or update one phase of one epoch (a phase is written when it starts and when it ends)."""

        def work(session: Session) -> None:
            self._check_fence(session, record.box_id)
            self._upsert(session, RestartPhaseRow, _phase_row(record), keys=["box_id", "epoch", "phase"])

        await self._run(work, write=True)

    async def put_phases_and_events(
        self, phases: Sequence[PhaseRecord], events: Sequence[LoggedEvent]
    ) -> frozenset[str]:
        """`put_phase` and `append_event` for many boxes in one transaction (a pass that saw many boxes
        become ready writes once). A phase of a box whose lease this replica no longer holds is skipped
        (returned: the holder writes it); events are written as `append_event` writes them."""
        details = [_json_detail(event.detail) for event in events]

        def work(session: Session) -> frozenset[str]:
            refused = self._fenced_out(session, {record.box_id for record in phases})
            for record in phases:
                if record.box_id not in refused:
                    row = _phase_row(record)
                    self._upsert(session, RestartPhaseRow, row, keys=["box_id", "epoch", "phase"])
            session.add_all(_event_row(event, detail) for event, detail in zip(events, details, strict=True))
            return refused

        if not phases and not events:
            return frozenset()
        return await self._run(work, write=True)

    async def list_phases(self, box_id: str, epoch: str) -> list[PhaseRecord]:
        return (await self.phases_of({box_id: epoch}))[box_id]

    async def phases_of(self, epochs: Mapping[str, str]) -> dict[str, list[PhaseRecord]]:
        """One query for every box asked (a fleet view or a restart wave reads hundreds of boxes), in
        start order within each box."""
        if not epochs:
            return {}
        wanted = dict(epochs)

        def work(session: Session) -> dict[str, list[PhaseRecord]]:
            found: dict[str, list[PhaseRecord]] = {box_id: [] for box_id in wanted}
            rows = session.scalars(select(RestartPhaseRow).where(RestartPhaseRow.box_id.in_(list(wanted))))
            for row in rows:
                if wanted[row.box_id] == row.epoch:
                    found[row.box_id].append(_phase_from_row(row))
            order = {name: index for index, name in enumerate(PhaseName)}
            for records in found.values():
                records.sort(key=lambda rec: (rec.started_at, order[rec.phase]))
            return found

        return await self._run(work, write=False)

    # -- campaigns ----------------------------------------------------------------------------------

    async def put_campaign(self, campaign: Campaign) -> None:
        if not campaign.id:
            raise StoreError("campaign.id: must not be empty")
        if campaign.ends_at < campaign.starts_at:
            raise StoreError(f"campaign.ends_at: {campaign.ends_at} is before starts_at {campaign.starts_at}")
        await self._run(
            lambda session: self._upsert(
                session,
                CampaignRow,
                {
                    "id": campaign.id,
                    "agent_id": campaign.agent_id,
                    "starts_at": campaign.starts_at,
                    "ends_at": campaign.ends_at,
                    "expected_calls": campaign.expected_calls,
                },
                keys=["id"],
            ),
            write=True,
        )

    async def delete_campaign(self, campaign_id: str) -> bool:
        def work(session: Session) -> bool:
            result = session.execute(delete(CampaignRow).where(CampaignRow.id == campaign_id))
            return int(getattr(result, "rowcount", 0)) > 0

        return await self._run(work, write=True)

    async def list_campaigns(self) -> list[Campaign]:
        def work(session: Session) -> list[Campaign]:
            rows = session.scalars(select(CampaignRow).order_by(CampaignRow.starts_at, CampaignRow.id))
            return [
                Campaign(
                    id=row.id,
                    agent_id=row.agent_id,
                    starts_at=row.starts_at,
                    ends_at=row.ends_at,
                    expected_calls=row.expected_calls,
                )
                for row in rows
            ]

        return await self._run(work, write=False)

    # -- webhooks and the event log -----------------------------------------------------------------

    async def remember_webhook(self, event_id: str, kind: str, body_sha256: str, at: float) -> bool:
        """True the first time `event_id` is seen. The primary key decides, so two replicas (or two
        concurrent deliveries) racing on one id get exactly one True."""
        if not event_id:
            raise StoreError("event_id: must not be empty")

        def attempt() -> bool:
            try:
                with self._translated_errors(), self._session(write=True) as session:
                    session.add(
                        WebhookEventRow(event_id=event_id, kind=kind, body_sha256=body_sha256, received_at=at)
                    )
                    session.flush()
            except StoreError as exc:
                if isinstance(exc.__cause__, IntegrityError):
                    return False
                raise
            return True

        return await self._in_thread(attempt)

    async def append_event(self, event: LoggedEvent) -> None:
        detail = _json_detail(event.detail)
        await self._run(
            lambda session: session.add(_event_row(event, detail)),
            write=True,
        )

    async def events(self, *, box_id: str | None = None, limit: int = 100) -> list[LoggedEvent]:
        """Newest first (by insertion order, which wall clocks on several replicas cannot spoil)."""
        if limit < 1:
            raise StoreError(f"limit: must be >= 1, got {limit}")

        def work(session: Session) -> list[LoggedEvent]:
            query = select(EventRow).order_by(EventRow.id.desc()).limit(limit)
            if box_id is not None:
                query = query.where(EventRow.box_id == box_id)
            return [
                LoggedEvent(
                    at=row.at,
                    kind=row.kind,
                    box_id=row.box_id,
                    agent_id=row.agent_id,
                    epoch=row.epoch,
                    prefix_hash=row.prefix_hash,
                    detail=dict(row.detail or {}),
                )
                for row in session.scalars(query)
            ]

        return await self._run(work, write=False)

    async def ping(self) -> None:
        await self._run(lambda session: session.execute(text("SELECT 1")).scalar_one(), write=False)

    # -- plumbing -----------------------------------------------------------------------------------

    async def _run(self, work: Callable[[Session], T], *, write: bool, lane: bool = False) -> T:
        """`work` in one transaction on a store thread; `lane`: on the lease heartbeats' own thread."""

        def in_thread() -> T:
            with self._translated_errors(), self._session(write=write) as session:
                return work(session)

        return await self._in_thread(in_thread, lane=lane)

    async def _in_thread(self, call: Callable[[], T], *, lane: bool = False) -> T:
        """`call` on one of the store's threads, with the caller's context (as `asyncio.to_thread`)."""
        threads = self._lane if lane else self._threads
        bound = functools.partial(contextvars.copy_context().run, call)
        return await asyncio.get_running_loop().run_in_executor(threads, bound)

    @contextmanager
    def _session(self, *, write: bool) -> Iterator[Session]:
        """One transaction: committed when the block returns, rolled back when it raises."""
        bind = self._writer if write else self._engine
        with Session(bind, expire_on_commit=False) as session, session.begin():
            yield session

    @contextmanager
    def _translated_errors(self) -> Iterator[None]:
        """Database failures become core errors, so services handle them without importing SQLAlchemy."""
        try:
            yield
        except IntegrityError as exc:
            raise StoreError(f"rejected by the database: {exc.orig}") from exc
        except (OperationalError, PoolTimeoutError) as exc:
            raise StoreUnavailable(f"database unavailable: {exc}") from exc
        except DBAPIError as exc:
            if exc.connection_invalidated:
                raise StoreUnavailable(f"database connection lost: {exc}") from exc
            raise

    def _upsert(
        self,
        session: Session,
        entity: type[Base],
        values: dict[str, Any],
        *,
        keys: list[str],
        update: list[str] | None = None,
    ) -> None:
        """INSERT ... ON CONFLICT DO UPDATE: one atomic statement on both backends (a read-then-write
        would race between replicas). `update` defaults to every non-key column."""
        columns = update if update is not None else [name for name in values if name not in keys]
        self._upsert_many(session, entity, [values], keys=keys, update=columns)

    def _upsert_many(
        self,
        session: Session,
        entity: type[Base],
        rows: Sequence[dict[str, Any]],
        *,
        keys: list[str],
        update: list[str],
    ) -> None:
        """`_upsert` of many rows in one statement (a multi-row INSERT ... ON CONFLICT DO UPDATE)."""
        if self._dialect == "sqlite":
            lite = sqlite.insert(entity).values(list(rows))
            session.execute(
                lite.on_conflict_do_update(
                    index_elements=keys, set_={name: lite.excluded[name] for name in update}
                )
            )
        else:
            pg = postgresql.insert(entity).values(list(rows))
            session.execute(
                pg.on_conflict_do_update(
                    index_elements=keys, set_={name: pg.excluded[name] for name in update}
                )
            )

    def _insert_if_absent(
        self, session: Session, entity: type[Base], values: dict[str, Any], *, keys: list[str]
    ) -> bool:
        """INSERT ... ON CONFLICT DO NOTHING; True when the row is new (RETURNING, as rowcount of an
        ORM-level insert is not reliable across drivers)."""
        key_column = getattr(entity, keys[0])
        if self._dialect == "sqlite":
            statement = sqlite.insert(entity).values(values).on_conflict_do_nothing(index_elements=keys)
            result = session.execute(statement.returning(key_column))
        else:
            pg_statement = (
                postgresql.insert(entity).values(values).on_conflict_do_nothing(index_elements=keys)
            )
            result = session.execute(pg_statement.returning(key_column))
        return result.first() is not None


def _warm_from_row(row: WarmRecordRow) -> WarmRecord:
    return WarmRecord(
        box_id=row.box_id,
        epoch=row.epoch,
        prefix_hash=row.prefix_hash,
        state=WarmState(row.state),
        prefix_tokens=row.prefix_tokens,
        verified_cached_tokens=row.verified_cached_tokens,
        attempts=row.attempts,
        last_error=row.last_error,
        updated_at=row.updated_at,
        warmed_at=row.warmed_at,
        verified_at=row.verified_at,
    )


def _move_epoch(session: Session, box: BoxRow, epoch: str, at: float) -> bool:
    """Make `epoch` the box's current one, logging the change; False when it already was."""
    if box.current_epoch == epoch:
        return False
    session.add(
        EventRow(
            at=at,
            kind=EventKind.EPOCH_CHANGED,
            box_id=box.id,
            epoch=epoch,
            detail={"previous": box.current_epoch},
        )
    )
    box.current_epoch = epoch
    return True


def _drop_other_epochs(session: Session, keep: Mapping[str, str], at: float) -> dict[str, int]:
    """Delete each box's warm records of every epoch but the one kept, one `WARM_DROPPED` event per box
    that had any; box id -> records dropped (boxes with none are left out)."""
    doomed: dict[str, set[str]] = {}
    found = session.execute(
        select(WarmRecordRow.box_id, WarmRecordRow.epoch)
        .where(WarmRecordRow.box_id.in_(list(keep)))
        .distinct()
    )
    for box_id, epoch in found:
        if epoch != keep[box_id]:
            doomed.setdefault(box_id, set()).add(epoch)
    dropped: dict[str, int] = {}
    for box_id, epochs in sorted(doomed.items()):
        result = session.execute(
            delete(WarmRecordRow).where(WarmRecordRow.box_id == box_id, WarmRecordRow.epoch != keep[box_id])
        )
        dropped[box_id] = int(getattr(result, "rowcount", 0))
        session.add(
            EventRow(
                at=at,
                kind=EventKind.WARM_DROPPED,
                box_id=box_id,
                epoch=keep[box_id],
                detail={"records": dropped[box_id], "epochs": sorted(epochs)},
            )
        )
    return dropped


def _event_row(event: LoggedEvent, detail: dict[str, Any]) -> EventRow:
    """A logged event as its row, `detail` already made JSON-safe."""
    return EventRow(
        at=event.at,
        kind=event.kind,
        box_id=event.box_id,
        agent_id=event.agent_id,
        epoch=event.epoch,
        prefix_hash=event.prefix_hash,
        detail=detail,
    )


def _phase_row(record: PhaseRecord) -> dict[str, Any]:
    return {
        "box_id": record.box_id,
        "epoch": record.epoch,
        "phase": str(record.phase),
        "started_at": record.started_at,
        "finished_at": record.finished_at,
        "engine_seconds": record.engine_seconds,
        "requests": record.requests,
        "ok": record.ok,
        "error": record.error,
    }


def _phase_from_row(row: RestartPhaseRow) -> PhaseRecord:
    return PhaseRecord(
        box_id=row.box_id,
        epoch=row.epoch,
        phase=PhaseName(row.phase),
        started_at=row.started_at,
        finished_at=row.finished_at,
        engine_seconds=row.engine_seconds,
        requests=row.requests,
        ok=row.ok,
        error=row.error,
    )


def _json_detail(detail: dict[str, object]) -> dict[str, Any]:
    """Reject what JSON cannot hold before it reaches the database, naming the field."""
    try:
        loaded: dict[str, Any] = json.loads(json.dumps(detail))
    except (TypeError, ValueError) as exc:
        raise StoreError(f"detail: not JSON-serializable ({exc})") from exc
    return loaded
