"""The SQL store against real databases: every StorePort method, on SQLite and on PostgreSQL.

Each test runs twice (the `database_url` fixture in tests/conftest.py): once on a SQLite file, once on a
throwaway database on the real PostgreSQL server.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy import event as sa_event
from sqlalchemy.engine import make_url

from warmer.adapters.store import SqlStore, sqlite_url_for, upgrade_database
from warmer.core.errors import StoreError, StoreUnavailable
from warmer.core.event_kinds import EventKind
from warmer.core.model import (
    BoxSpec,
    Campaign,
    EngineKind,
    LoggedEvent,
    PhaseName,
    PhaseRecord,
    Prefix,
    WarmRecord,
    WarmState,
)
from warmer.ports import StorePort

pytestmark = pytest.mark.integration

BOX_A = BoxSpec(id="a", base_url="http://127.0.0.1:9001", engine=EngineKind.LLAMACPP, model="tiny", slots=2)
BOX_B = BoxSpec(
    id="b",
    base_url="http://127.0.0.1:9002",
    engine=EngineKind.VLLM,
    model="dense",
    slots=4,
    group="rack-1",
    cache_capacity_tokens=100_000,
)
PREFIX = Prefix(text="You are a helpful agent. " * 10, token_count=60, model="tiny")


@pytest.fixture
def migrated_url(database_url: str) -> str:
    upgrade_database(database_url)
    return database_url


@pytest.fixture
def store(migrated_url: str) -> Iterator[SqlStore]:
    opened = SqlStore.from_url(migrated_url, now=lambda: 1_000.0)
    yield opened
    asyncio.run(opened.close())


def warm(state: WarmState, *, epoch: str = "e1", at: float = 10.0, **fields: object) -> WarmRecord:
    return WarmRecord(
        box_id="a",
        epoch=epoch,
        prefix_hash=PREFIX.hash,
        state=state,
        prefix_tokens=PREFIX.token_count,
        updated_at=at,
        **fields,  # type: ignore[arg-type]
    )


async def kinds(store: SqlStore, *, box_id: str | None = None) -> list[str]:
    return [event.kind for event in await store.events(box_id=box_id, limit=1000)]


def test_sql_store_satisfies_the_port(store: SqlStore) -> None:
    async def scenario() -> None:
        port: StorePort = store  # mypy checks the structural match; the call checks it is alive
        await port.ping()

    asyncio.run(scenario())


# -- boxes ------------------------------------------------------------------------------------------------


def test_sync_boxes_adds_updates_and_removes_with_cascade(store: SqlStore) -> None:
    async def scenario() -> None:
        await store.sync_boxes([BOX_A, BOX_B])
        await store.record_epoch("a", "e1", at=5.0)
        await store.record_epoch("b", "eb", at=5.0)
        await store.put_warm(warm(WarmState.WARM), reason="verified", previous=WarmState.WARMING)
        await store.put_phase(PhaseRecord(box_id="b", epoch="eb", phase=PhaseName.SAMPLED, started_at=6.0))

        # B moves and A changes its URL: A's epoch and warm state survive an edit of its row.
        moved_a = BoxSpec(id="a", base_url="http://127.0.0.1:9101", engine=EngineKind.LLAMACPP, model="tiny")
        await store.sync_boxes([moved_a])

        assert await store.current_epoch("a") == "e1"
        assert await store.get_warm("a", "e1", PREFIX.hash) is not None
        assert await store.current_epoch("b") is None
        assert await store.list_phases("b", "eb") == []
        assert (await kinds(store, box_id="b"))[0] == EventKind.BOX_REMOVED
        assert (await kinds(store)).count(EventKind.BOX_ADDED) == 2

        await store.sync_boxes([moved_a, BOX_B])  # B comes back: new, with no state from before
        assert await store.current_epoch("b") is None
        assert await store.record_epoch("b", "eb", at=7.0) is True

    asyncio.run(scenario())


def test_sync_boxes_rejects_duplicate_ids_and_changes_nothing(store: SqlStore) -> None:
    async def scenario() -> None:
        await store.sync_boxes([BOX_A])
        duplicate = BoxSpec(id="b", base_url="http://x", engine=EngineKind.SGLANG, model="m")
        with pytest.raises(StoreError, match=r"boxes\[2\]\.id"):
            await store.sync_boxes([BOX_B, BOX_A, duplicate])
        # BOX_B was not added: recording its epoch still fails.
        with pytest.raises(StoreError, match="box_id"):
            await store.record_epoch("b", "e", at=1.0)

    asyncio.run(scenario())


# -- epochs -----------------------------------------------------------------------------------------------


def test_record_epoch_reports_changes_only(store: SqlStore) -> None:
    async def scenario() -> None:
        await store.sync_boxes([BOX_A])
        assert await store.current_epoch("a") is None
        assert await store.record_epoch("a", "e1", at=1.0) is True  # first sighting is a change
        assert await store.record_epoch("a", "e1", at=2.0) is False
        assert await store.current_epoch("a") == "e1"
        assert await store.record_epoch("a", "e2", at=3.0) is True  # the engine restarted
        assert await store.current_epoch("a") == "e2"
        assert await store.record_epoch("a", "e2", at=4.0) is False

        changes = [e for e in await store.events(box_id="a") if e.kind == EventKind.EPOCH_CHANGED]
        assert [(e.epoch, e.detail["previous"], e.at) for e in changes] == [
            ("e2", "e1", 3.0),
            ("e1", None, 1.0),
        ]

    asyncio.run(scenario())


def test_record_epochs_writes_a_whole_fleet_in_one_transaction(store: SqlStore, migrated_url: str) -> None:
    fleet = [
        BoxSpec(id=f"f{i:03d}", base_url=f"http://127.0.0.1:{10000 + i}", engine=EngineKind.VLLM, model="m")
        for i in range(300)
    ]
    commits: list[object] = []

    async def scenario() -> None:
        await store.sync_boxes(fleet)
        await store.record_epoch("f000", "old", at=1.0)
        sa_event.listen(store._engine, "commit", commits.append)  # the store's own engine: its commits
        refused = await store.record_epochs([(b.id, "e1", 2.0) for b in fleet])
        assert refused == frozenset()
        assert len(commits) == 1
        assert await store.current_epoch("f000") == "e1"
        assert await store.current_epoch("f299") == "e1"
        changes = [e for e in await store.events(limit=1000) if e.kind == EventKind.EPOCH_CHANGED]
        assert len(changes) == 301  # "old" once, then every box's first sighting of e1
        assert {e.detail["previous"] for e in changes if e.box_id == "f000" and e.epoch == "e1"} == {"old"}
        # Seen again: last_seen_at moves, first_seen_at stays, no change is logged.
        await store.record_epochs([(b.id, "e1", 9.0) for b in fleet])
        again = [e for e in await store.events(limit=1000) if e.kind == EventKind.EPOCH_CHANGED]
        assert len(again) == 301

    asyncio.run(scenario())
    engine = create_engine(migrated_url)
    with engine.connect() as connection:
        seen = connection.execute(
            text("SELECT first_seen_at, last_seen_at FROM box_epochs WHERE epoch = 'e1' AND box_id = 'f123'")
        ).one()
    engine.dispose()
    assert tuple(seen) == (2.0, 9.0)


def test_record_epochs_refuses_an_unknown_box_or_an_empty_epoch_and_writes_nothing(store: SqlStore) -> None:
    async def scenario() -> None:
        await store.sync_boxes([BOX_A])
        with pytest.raises(StoreError, match=r"box_id: unknown boxes \['ghost'\]"):
            await store.record_epochs([("a", "e1", 1.0), ("ghost", "e1", 1.0)])
        with pytest.raises(StoreError, match="epoch"):
            await store.record_epochs([("a", "", 1.0)])
        assert await store.current_epoch("a") is None
        assert await store.record_epochs([]) == frozenset()

    asyncio.run(scenario())


def test_phases_and_events_of_many_boxes_are_written_in_one_transaction(store: SqlStore) -> None:
    fleet = [
        BoxSpec(id=f"r{i:03d}", base_url=f"http://127.0.0.1:{11000 + i}", engine=EngineKind.VLLM, model="m")
        for i in range(120)
    ]
    commits: list[object] = []

    async def scenario() -> None:
        await store.sync_boxes(fleet)
        await store.record_epochs([(b.id, "e1", 1.0) for b in fleet])
        sa_event.listen(store._engine, "commit", commits.append)  # the store's own engine: its commits
        phases = [
            PhaseRecord(b.id, "e1", PhaseName.PREFIXES, started_at=2.0, finished_at=3.0, ok=True)
            for b in fleet
        ]
        events = [LoggedEvent(at=3.0, kind=EventKind.BOX_READY, box_id=b.id, epoch="e1") for b in fleet]
        assert await store.put_phases_and_events(phases, events) == frozenset()
        assert len(commits) == 1
        assert await store.list_phases("r077", "e1") == [phases[77]]
        ready = [e for e in await store.events(limit=1000) if e.kind == EventKind.BOX_READY]
        assert sorted(e.box_id for e in ready) == [b.id for b in fleet]
        bad = LoggedEvent(at=4.0, kind=EventKind.BOX_READY, box_id="r000", detail={"x": object()})
        sampled = PhaseRecord("r001", "e1", PhaseName.SAMPLED, started_at=4.0)
        with pytest.raises(StoreError, match="detail"):  # what JSON cannot hold: nothing of the batch lands
            await store.put_phases_and_events([sampled], [bad])
        assert [p.phase for p in await store.list_phases("r001", "e1")] == [PhaseName.PREFIXES]
        assert await store.put_phases_and_events([], []) == frozenset()

    asyncio.run(scenario())


def test_record_epoch_rejects_unknown_box_and_empty_epoch(store: SqlStore) -> None:
    async def scenario() -> None:
        await store.sync_boxes([BOX_A])
        with pytest.raises(StoreError, match="box_id: unknown box 'ghost'"):
            await store.record_epoch("ghost", "e1", at=1.0)
        with pytest.raises(StoreError, match="epoch"):
            await store.record_epoch("a", "", at=1.0)
        assert await store.current_epoch("a") is None

    asyncio.run(scenario())


def test_concurrent_record_epoch_reports_one_change(store: SqlStore) -> None:
    """Several pollers (or replicas) seeing the same restart: exactly one of them owns the change."""

    async def scenario() -> None:
        await store.sync_boxes([BOX_A])
        results = await asyncio.gather(*(store.record_epoch("a", "fresh", at=float(i)) for i in range(12)))
        assert results.count(True) == 1
        assert await store.current_epoch("a") == "fresh"
        assert (await kinds(store, box_id="a")).count(EventKind.EPOCH_CHANGED) == 1

    asyncio.run(scenario())


# -- prefixes ---------------------------------------------------------------------------------------------


def test_record_prefix_is_idempotent_per_version(store: SqlStore) -> None:
    async def scenario() -> None:
        await store.record_prefix("agent-1", "spec-v1", PREFIX, engine_version="b1", at=1.0)
        await store.record_prefix("agent-1", "spec-v1", PREFIX, engine_version="b1", at=2.0)
        # A byte-identical prefix of another agent is its own history row, not a conflict.
        await store.record_prefix("agent-2", "spec-x", PREFIX, engine_version="b1", at=3.0)
        # The same agent on a new engine build is a new version.
        await store.record_prefix("agent-1", "spec-v1", PREFIX, engine_version="b2", at=4.0)

        versions = [e for e in await store.events(limit=1000) if e.kind == EventKind.PREFIX_VERSION]
        assert [(e.agent_id, e.detail["engine_version"]) for e in versions] == [
            ("agent-1", "b2"),
            ("agent-2", "b1"),
            ("agent-1", "b1"),
        ]
        assert {e.prefix_hash for e in versions} == {PREFIX.hash}
        assert versions[0].detail["prefix_tokens"] == PREFIX.token_count

    asyncio.run(scenario())


# -- warm records -----------------------------------------------------------------------------------------


def test_put_warm_round_trips_and_filters(store: SqlStore) -> None:
    async def scenario() -> None:
        await store.sync_boxes([BOX_A, BOX_B])
        await store.record_epoch("a", "e1", at=1.0)
        await store.record_epoch("a", "e2", at=2.0)
        await store.record_epoch("b", "eb", at=2.0)
        assert await store.get_warm("a", "e1", PREFIX.hash) is None

        record = warm(
            WarmState.WARM,
            at=12.5,
            verified_cached_tokens=59,
            attempts=2,
            last_error="timeout once",
            warmed_at=12.0,
            verified_at=12.5,
        )
        await store.put_warm(record, reason="engine reported the hit", previous=WarmState.WARMING)
        other_epoch = warm(WarmState.COLD, epoch="e2")
        await store.put_warm(other_epoch, reason="new epoch", previous=None)
        on_b = WarmRecord(
            box_id="b", epoch="eb", prefix_hash="ff" * 16, state=WarmState.FAILED, prefix_tokens=9
        )
        await store.put_warm(on_b, reason="engine error", previous=WarmState.WARMING)

        assert await store.get_warm("a", "e1", PREFIX.hash) == record
        assert await store.list_warm(box_id="a") == [record, other_epoch]
        assert await store.list_warm(box_id="a", epoch="e2") == [other_epoch]
        assert await store.list_warm(epoch="eb") == [on_b]
        assert len(await store.list_warm()) == 3

        updated = warm(WarmState.STALE, at=300.0, verified_cached_tokens=59, attempts=2, warmed_at=12.0)
        await store.put_warm(updated, reason="keepalive due", previous=WarmState.WARM)
        assert await store.get_warm("a", "e1", PREFIX.hash) == updated

    asyncio.run(scenario())


def test_put_warm_appends_one_transition_event_each(store: SqlStore) -> None:
    async def scenario() -> None:
        await store.sync_boxes([BOX_A])
        await store.record_epoch("a", "e1", at=1.0)
        path = [
            (None, WarmState.COLD),
            (WarmState.COLD, WarmState.WARMING),
            (WarmState.WARMING, WarmState.WARM),
        ]
        for step, (previous, state) in enumerate(path):
            await store.put_warm(warm(state, at=10.0 + step), reason=f"step {step}", previous=previous)

        transitions = [e for e in await store.events(box_id="a") if e.kind == EventKind.WARM_TRANSITION]
        assert [(e.detail["from"], e.detail["to"], e.detail["reason"], e.at) for e in transitions] == [
            ("warming", "warm", "step 2", 12.0),
            ("cold", "warming", "step 1", 11.0),
            (None, "cold", "step 0", 10.0),
        ]
        assert all(e.epoch == "e1" and e.prefix_hash == PREFIX.hash for e in transitions)

    asyncio.run(scenario())


def test_put_warm_is_atomic_with_its_event(store: SqlStore, migrated_url: str) -> None:
    """If the event cannot be written, the record is not written either (and the reverse)."""

    async def scenario() -> None:
        await store.sync_boxes([BOX_A])
        await store.record_epoch("a", "e1", at=1.0)
        await store.put_warm(warm(WarmState.WARMING), reason="start", previous=WarmState.COLD)

        # Fault injection inside the database: a trigger that refuses every new event row.
        refuse_events(migrated_url)
        with pytest.raises(StoreError):
            await store.put_warm(warm(WarmState.WARM, at=20.0), reason="verified", previous=WarmState.WARMING)
        current = await store.get_warm("a", "e1", PREFIX.hash)
        assert current is not None
        assert current.state is WarmState.WARMING  # the record write was rolled back with the event

        # The reverse: a record the database refuses (no such epoch) leaves no event behind.
        allow_events(migrated_url)
        before = await store.events(limit=1000)
        with pytest.raises(StoreError):
            await store.put_warm(warm(WarmState.WARM, epoch="never-seen"), reason="x", previous=None)
        assert await store.events(limit=1000) == before

    asyncio.run(scenario())


def refuse_events(url: str) -> None:
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            if connection.dialect.name == "sqlite":
                connection.exec_driver_sql(
                    "CREATE TRIGGER refuse_events BEFORE INSERT ON events "
                    "BEGIN SELECT RAISE(ABORT, 'events refused by test'); END"
                )
            else:
                connection.exec_driver_sql(
                    "CREATE FUNCTION refuse_events() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                    "RAISE EXCEPTION 'events refused by test' USING ERRCODE = 'check_violation'; END $$"
                )
                connection.exec_driver_sql(
                    "CREATE TRIGGER refuse_events BEFORE INSERT ON events "
                    "FOR EACH ROW EXECUTE FUNCTION refuse_events()"
                )
    finally:
        engine.dispose()


def allow_events(url: str) -> None:
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            if connection.dialect.name == "sqlite":
                connection.exec_driver_sql("DROP TRIGGER refuse_events")
            else:
                connection.exec_driver_sql("DROP TRIGGER refuse_events ON events")
    finally:
        engine.dispose()


def test_drop_other_epochs_keeps_the_current_one(store: SqlStore) -> None:
    async def scenario() -> None:
        await store.sync_boxes([BOX_A, BOX_B])
        for epoch in ("e1", "e2", "e3"):
            await store.record_epoch("a", epoch, at=1.0)
            await store.put_warm(warm(WarmState.WARM, epoch=epoch), reason="r", previous=None)
        await store.record_epoch("b", "e1", at=1.0)
        on_b = WarmRecord(
            box_id="b", epoch="e1", prefix_hash=PREFIX.hash, state=WarmState.WARM, prefix_tokens=1
        )
        await store.put_warm(on_b, reason="r", previous=None)
        await store.put_phase(PhaseRecord(box_id="a", epoch="e1", phase=PhaseName.BURST, started_at=1.0))

        assert await store.drop_other_epochs("a", "e3") == 2
        assert [r.epoch for r in await store.list_warm(box_id="a")] == ["e3"]
        assert await store.list_warm(box_id="b") == [
            on_b
        ]  # other boxes untouched, even in an "old" epoch name
        assert len(await store.list_phases("a", "e1")) == 1  # phases are history and stay
        dropped = (await store.events(box_id="a"))[0]
        assert dropped.kind == EventKind.WARM_DROPPED
        assert dropped.detail == {"records": 2, "epochs": ["e1", "e2"]}
        assert await store.drop_other_epochs("a", "e3") == 0

    asyncio.run(scenario())


# -- restart phases ---------------------------------------------------------------------------------------


def test_phases_upsert_and_list_in_run_order(store: SqlStore) -> None:
    async def scenario() -> None:
        await store.sync_boxes([BOX_A])
        await store.record_epoch("a", "e1", at=1.0)
        await store.record_epoch("a", "e2", at=1.0)
        started = PhaseRecord(box_id="a", epoch="e1", phase=PhaseName.SAMPLED, started_at=10.0)
        await store.put_phase(started)
        assert await store.list_phases("a", "e1") == [started]

        finished = PhaseRecord(
            box_id="a",
            epoch="e1",
            phase=PhaseName.SAMPLED,
            started_at=10.0,
            finished_at=10.5,
            engine_seconds=0.4,
            requests=1,
            ok=True,
        )
        burst = PhaseRecord(
            box_id="a", epoch="e1", phase=PhaseName.BURST, started_at=11.0, requests=7, ok=False, error="503"
        )
        constrained = PhaseRecord(box_id="a", epoch="e1", phase=PhaseName.CONSTRAINED, started_at=10.5)
        for record in (burst, finished, constrained):
            await store.put_phase(record)
        await store.put_phase(PhaseRecord(box_id="a", epoch="e2", phase=PhaseName.SAMPLED, started_at=99.0))

        assert await store.list_phases("a", "e1") == [finished, constrained, burst]
        with pytest.raises(StoreError):  # a phase for an epoch the store never saw
            await store.put_phase(
                PhaseRecord(box_id="a", epoch="nope", phase=PhaseName.BURST, started_at=1.0)
            )

    asyncio.run(scenario())


# -- campaigns --------------------------------------------------------------------------------------------


def test_campaigns_put_update_list_delete(store: SqlStore) -> None:
    async def scenario() -> None:
        later = Campaign(id="c2", agent_id="agent-2", starts_at=200.0, ends_at=300.0, expected_calls=50)
        sooner = Campaign(id="c1", agent_id="agent-1", starts_at=100.0, ends_at=400.0)
        await store.put_campaign(later)
        await store.put_campaign(sooner)
        assert await store.list_campaigns() == [sooner, later]

        moved = Campaign(id="c2", agent_id="agent-2", starts_at=50.0, ends_at=60.0, expected_calls=5)
        await store.put_campaign(moved)
        assert await store.list_campaigns() == [moved, sooner]

        assert await store.delete_campaign("c2") is True
        assert await store.delete_campaign("c2") is False
        assert await store.list_campaigns() == [sooner]

    asyncio.run(scenario())


def test_campaign_with_a_backwards_window_is_refused(store: SqlStore) -> None:
    async def scenario() -> None:
        with pytest.raises(StoreError, match=r"campaign\.ends_at"):
            await store.put_campaign(Campaign(id="c", agent_id="a", starts_at=10.0, ends_at=5.0))
        assert await store.list_campaigns() == []

    asyncio.run(scenario())


# -- webhooks ---------------------------------------------------------------------------------------------


def test_remember_webhook_is_idempotent(store: SqlStore) -> None:
    async def scenario() -> None:
        assert await store.remember_webhook("evt-1", "deploy", "aa" * 32, at=1.0) is True
        assert await store.remember_webhook("evt-1", "deploy", "aa" * 32, at=2.0) is False
        assert await store.remember_webhook("evt-2", "deploy", "bb" * 32, at=3.0) is True

    asyncio.run(scenario())


def test_remember_webhook_under_concurrent_deliveries(store: SqlStore) -> None:
    """Redeliveries racing each other: exactly one wins per event id, nobody errors."""

    async def scenario() -> None:
        ids = [f"evt-{i % 3}" for i in range(24)]
        results = await asyncio.gather(*(store.remember_webhook(i, "deploy", "cc" * 32, at=1.0) for i in ids))
        firsts = sorted(event_id for event_id, first in zip(ids, results, strict=True) if first)
        assert firsts == ["evt-0", "evt-1", "evt-2"]

    asyncio.run(scenario())


def test_remember_webhook_from_two_stores_on_one_database(store: SqlStore, migrated_url: str) -> None:
    """Two daemon replicas (two engines, two pools) on one database still agree."""

    async def scenario() -> None:
        other = SqlStore.from_url(migrated_url)
        try:
            results = await asyncio.gather(
                *(s.remember_webhook("shared", "deploy", "dd" * 32, at=1.0) for s in (store, other) * 6)
            )
        finally:
            await other.close()
        assert results.count(True) == 1

    asyncio.run(scenario())


# -- event log --------------------------------------------------------------------------------------------


def test_events_newest_first_filtered_and_limited(store: SqlStore) -> None:
    async def scenario() -> None:
        logged = [
            LoggedEvent(at=5.0, kind="note", box_id="a", detail={"n": 0, "nested": {"ok": True}}),
            LoggedEvent(at=4.0, kind="note", box_id="b", agent_id="agent-1", detail={"n": 1}),
            LoggedEvent(at=6.0, kind="note", box_id="a", epoch="e1", prefix_hash="p", detail={"n": 2}),
        ]
        for event in logged:
            await store.append_event(event)
        # Insertion order, not the `at` clock, decides "newest".
        assert await store.events() == list(reversed(logged))
        assert await store.events(box_id="a") == [logged[2], logged[0]]
        assert await store.events(limit=1) == [logged[2]]
        assert await store.events(box_id="nobody") == []

    asyncio.run(scenario())


def test_events_reject_bad_input(store: SqlStore) -> None:
    async def scenario() -> None:
        with pytest.raises(StoreError, match="limit"):
            await store.events(limit=0)
        with pytest.raises(StoreError, match="detail"):
            await store.append_event(LoggedEvent(at=1.0, kind="bad", detail={"x": object()}))
        assert await store.events() == []

    asyncio.run(scenario())


# -- durability and availability --------------------------------------------------------------------------


def test_everything_survives_reopening_the_store(migrated_url: str) -> None:
    async def scenario() -> None:
        first = SqlStore.from_url(migrated_url)
        await first.sync_boxes([BOX_A, BOX_B])
        await first.record_epoch("a", "e1", at=1.0)
        record = warm(WarmState.WARM, verified_cached_tokens=60, verified_at=10.0)
        await first.put_warm(record, reason="verified", previous=WarmState.WARMING)
        phase = PhaseRecord(box_id="a", epoch="e1", phase=PhaseName.LONG_PREFILL, started_at=3.0, ok=True)
        await first.put_phase(phase)
        campaign = Campaign(id="c", agent_id="agent-1", starts_at=1.0, ends_at=2.0, expected_calls=3)
        await first.put_campaign(campaign)
        await first.remember_webhook("evt", "deploy", "ee" * 32, at=1.0)
        await first.record_prefix("agent-1", "spec", PREFIX, engine_version="b1", at=1.0)
        history = await first.events(limit=1000)
        await first.close()

        second = SqlStore.from_url(migrated_url)
        try:
            assert await second.current_epoch("a") == "e1"
            assert (
                await second.record_epoch("a", "e1", at=2.0) is False
            )  # the daemon restart is not a box restart
            assert await second.list_warm() == [record]
            assert await second.list_phases("a", "e1") == [phase]
            assert await second.list_campaigns() == [campaign]
            assert await second.remember_webhook("evt", "deploy", "ee" * 32, at=2.0) is False
            assert await second.events(limit=1000) == history
        finally:
            await second.close()

    asyncio.run(scenario())


def test_ping_reports_an_unreachable_database(migrated_url: str, tmp_path: Path) -> None:
    async def scenario() -> None:
        if make_url(migrated_url).get_backend_name() == "sqlite":
            unreachable = f"sqlite:///{tmp_path}"  # a directory is not a database file
        else:
            unreachable = make_url(migrated_url).set(database="warmer_no_such_db").render_as_string(False)
        broken = SqlStore.from_url(unreachable)
        try:
            with pytest.raises(StoreUnavailable):
                await broken.ping()
        finally:
            await broken.close()

    asyncio.run(scenario())


def test_sqlite_store_uses_wal_and_a_state_directory(tmp_path: Path) -> None:
    url = sqlite_url_for(tmp_path / "state" / "nested")
    assert url.endswith("/state/nested/warmer.db")
    upgrade_database(url)  # creates the missing state directory
    store = SqlStore.from_url(url)

    async def touch() -> None:
        await store.ping()
        await store.close()

    asyncio.run(touch())
    with sqlite3.connect(tmp_path / "state" / "nested" / "warmer.db") as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_foreign_keys_are_enforced_on_every_connection(store: SqlStore, migrated_url: str) -> None:
    """SQLite ships with foreign keys off; the store turns them on (cascade and refusal depend on it)."""

    async def scenario() -> None:
        await store.sync_boxes([BOX_A])
        with pytest.raises(StoreError):
            await store.put_phase(
                PhaseRecord(box_id="ghost", epoch="e", phase=PhaseName.BURST, started_at=1.0)
            )
        engine = create_engine(migrated_url)
        try:
            with engine.connect() as connection:
                assert connection.execute(text("SELECT count(*) FROM restart_phases")).scalar_one() == 0
        finally:
            engine.dispose()

    asyncio.run(scenario())
