"""A daemon restarted over engines that kept running resumes their epochs: the restart-phase history the
previous daemon wrote is kept, not overwritten by the timings of the new daemon's re-verification probes;
a phase the previous daemon left unfinished (it died mid-phase) is finished by the new one."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from tests.unit.reconciler_fakes import FakeClock, World, route_boxes, settle, world
from warmer.core.model import PhaseName, PhaseRecord


async def prefixes_phase(w: World, box_id: str = "b1") -> PhaseRecord:
    epoch = await w.store.current_epoch(box_id)
    assert epoch is not None
    (phase,) = [p for p in await w.store.list_phases(box_id, epoch) if p.phase is PhaseName.PREFIXES]
    return phase


async def restarted(first: World, store_url: str, clock: FakeClock) -> World:
    """A second daemon on the same store and engine, a minute later; settled until it routes b1 again."""
    await first.store.close()
    clock.t += 60.0
    second = world(store_url, box_ids=("b1",), engine=first.engine, clock=clock, min_group=1)
    await settle(second.reconciler)
    assert route_boxes(second.reconciler, "sales") == ["b1"]
    return second


def test_a_finished_prefixes_phase_survives_a_daemon_restart_unchanged(store_url: str) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        first = world(store_url, box_ids=("b1",), clock=clock, min_group=1)
        await settle(first.reconciler)
        before = await prefixes_phase(first)
        assert before.finished_at is not None
        assert before.requests >= 1

        second = await restarted(first, store_url, clock)
        assert await prefixes_phase(second) == before  # the probe's timings are not this phase's
        await second.store.close()

    asyncio.run(scenario())


def test_a_prefixes_phase_left_unfinished_by_a_crash_is_finished_by_the_next_daemon(store_url: str) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        first = world(store_url, box_ids=("b1",), clock=clock, min_group=1)
        await settle(first.reconciler)
        finished = await prefixes_phase(first)
        # As the crashed daemon left it: the phase started, never finished.
        unfinished = replace(finished, finished_at=None, engine_seconds=None, requests=0, ok=None)
        await first.store.put_phase(unfinished)

        second = await restarted(first, store_url, clock)
        after = await prefixes_phase(second)
        assert after.started_at == finished.started_at
        assert after.ok is True
        assert after.finished_at is not None
        assert after.finished_at >= clock.t - 60.0
        await second.store.close()

    asyncio.run(scenario())
