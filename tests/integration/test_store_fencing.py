"""Fenced writes in the real databases: a replica the lease table no longer names as a box's live holder
cannot write that box's rows (epoch, warm records, restart phases), and nothing of a refused write lands.

Two stores on one database stand for two replicas (each with its own connections, as separate processes):
`stale` holds the box, pauses past its lease (as a stopped process or a long GC would), and `successor`
takes the box over; `stale`, waking up, still has a warm result to write.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from warmer.adapters.store import SqlStore, upgrade_database
from warmer.adapters.store.coordination import SqlCoordination
from warmer.core.errors import LeaseLost, StoreError
from warmer.core.leases import LeaseConfig
from warmer.core.model import BoxSpec, EngineKind, PhaseName, PhaseRecord, WarmRecord, WarmState

pytestmark = pytest.mark.integration

SHORT = LeaseConfig(lease_seconds=1.0, renew_seconds=0.5)  # expiry within a test
BOX = BoxSpec(id="b1", base_url="http://127.0.0.1:9100", engine=EngineKind.VLLM, model="tiny", slots=2)
OTHER = BoxSpec(id="b2", base_url="http://127.0.0.1:9101", engine=EngineKind.VLLM, model="tiny", slots=2)


def record(state: WarmState, at: float, *, verified: int | None = None) -> WarmRecord:
    return WarmRecord(
        box_id=BOX.id,
        epoch="e1",
        prefix_hash="p1",
        state=state,
        prefix_tokens=3000,
        verified_cached_tokens=verified,
        attempts=1,
        last_error=None,
        updated_at=at,
        warmed_at=at,
        verified_at=at if verified is not None else None,
    )


def test_a_replica_past_its_lease_cannot_write_over_its_successor(database_url: str) -> None:
    upgrade_database(database_url)

    async def scenario() -> None:
        stale_store, successor_store = SqlStore.from_url(database_url), SqlStore.from_url(database_url)
        stale_store.fence_box_writes("stale")
        successor_store.fence_box_writes("successor")
        stale, successor = SqlCoordination(stale_store), SqlCoordination(successor_store)
        try:
            await stale_store.sync_boxes([BOX])
            with pytest.raises(LeaseLost, match="no longer holds its lease"):  # never held: not its to write
                await stale_store.record_epoch(BOX.id, "e1", time.time())

            assert (await stale.heartbeat("stale", [BOX.id], at=time.time(), config=SHORT)).owner_of(BOX.id)
            now = time.time()
            assert await stale_store.record_epoch(BOX.id, "e1", now)  # the holder writes
            await stale_store.put_warm(record(WarmState.WARMING, now), reason="warm started", previous=None)
            await stale_store.put_phase(PhaseRecord(BOX.id, "e1", PhaseName.SAMPLED, started_at=now))

            await asyncio.sleep(SHORT.lease_seconds + 0.3)  # `stale` pauses past its lease
            taken = await successor.heartbeat("successor", [BOX.id], at=time.time(), config=SHORT)
            assert taken.owner_of(BOX.id) == "successor"
            rows = (
                await successor_store.list_warm(box_id=BOX.id),
                await successor_store.list_phases(BOX.id, "e1"),
                await successor_store.current_epoch(BOX.id),
                len(await successor_store.events(limit=1000)),
            )

            later = time.time()
            result = record(WarmState.WARM, later, verified=3000)
            with pytest.raises(LeaseLost, match="'stale' no longer holds"):
                await stale_store.put_warm(result, reason="verified", previous=WarmState.WARMING)
            with pytest.raises(LeaseLost):
                await stale_store.put_phase(
                    PhaseRecord(BOX.id, "e1", PhaseName.SAMPLED, started_at=now, finished_at=later, ok=True)
                )
            with pytest.raises(LeaseLost):
                await stale_store.record_epoch(BOX.id, "e2", later)
            with pytest.raises(LeaseLost):
                await stale_store.drop_other_epochs(BOX.id, "e2")
            assert await stale_store.record_epochs([(BOX.id, "e2", later)]) == {BOX.id}  # skipped
            late_phase = PhaseRecord(
                BOX.id, "e1", PhaseName.SAMPLED, started_at=now, finished_at=later, ok=True
            )
            assert await stale_store.put_phases_and_events([late_phase], []) == {BOX.id}  # skipped
            assert rows == (
                await successor_store.list_warm(box_id=BOX.id),
                await successor_store.list_phases(BOX.id, "e1"),
                await successor_store.current_epoch(BOX.id),
                len(await successor_store.events(limit=1000)),
            )  # nothing of the refused writes landed, events included
            (warming,) = rows[0]
            assert warming.state is WarmState.WARMING

            # the successor writes the box; a store that was never fenced (one daemon alone) is not checked
            verified = replace(record(WarmState.WARM, later, verified=3000), attempts=2)
            await successor_store.put_warm(verified, reason="verified", previous=WarmState.WARMING)
            alone = SqlStore.from_url(database_url)
            try:
                await alone.put_phase(PhaseRecord(BOX.id, "e1", PhaseName.BURST, started_at=later))
            finally:
                await alone.close()
            assert [r.state for r in await successor_store.list_warm(box_id=BOX.id)] == [WarmState.WARM]
            # a fleet's sightings in one transaction: the held box written, the others skipped, not failed
            await successor_store.sync_boxes([BOX, OTHER])
            assert await successor_store.record_epochs([(BOX.id, "e1", later), (OTHER.id, "o1", later)]) == {
                OTHER.id
            }
            assert await successor_store.current_epoch(OTHER.id) is None
        finally:
            await stale_store.close()
            await successor_store.close()

    asyncio.run(scenario())


def test_fencing_needs_a_replica_id() -> None:
    store = SqlStore.from_url("sqlite://")
    with pytest.raises(StoreError, match="replica_id: must not be empty"):
        store.fence_box_writes("")
    asyncio.run(store.close())
