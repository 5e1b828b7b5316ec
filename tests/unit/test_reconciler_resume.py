"""A daemon restarted over engines that kept running resumes their epochs: the restart-phase history the
previous daemon wrote is kept, not overwritten by the timings of the new daemon's re-verification probes;
a phase the previous daemon left unfinished (it died mid-phase) is finished by the new one. The new daemon's
readiness is recorded as resumed: its re-verification time is not a time to ready, so it stays out of the
time-to-ready metrics."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from tests.unit.reconciler_fakes import FakeClock, FakeEngine, World, route_boxes, routed_boxes, settle, world
from warmer.core.model import LoggedEvent, PhaseName, PhaseRecord, WarmRecord, WarmState
from warmer.core.warmstate import RetryBackoff
from warmer.service.reconciler import NullObserver
from warmer.service.views.status import StatusService


class ReadyRecorder(NullObserver):
    """Keeps every box_ready the reconciler reports to metrics."""

    def __init__(self) -> None:
        self.ready: list[tuple[str, float, float]] = []

    def box_ready(self, box_id: str, time_to_ready_seconds: float, engine_seconds: float) -> None:
        self.ready.append((box_id, time_to_ready_seconds, engine_seconds))


async def ready_events(w: World, box_id: str = "b1") -> list[LoggedEvent]:
    return [e for e in await w.store.events(limit=500) if e.kind == "box_ready" and e.box_id == box_id]


async def prefixes_phase(w: World, box_id: str = "b1") -> PhaseRecord:
    epoch = await w.store.current_epoch(box_id)
    assert epoch is not None
    (phase,) = [p for p in await w.store.list_phases(box_id, epoch) if p.phase is PhaseName.PREFIXES]
    return phase


async def restarted(
    first: World, store_url: str, clock: FakeClock, observer: ReadyRecorder | None = None
) -> World:
    """A second daemon on the same store and engine, a minute later; settled until it routes b1 again."""
    await first.store.close()
    clock.t += 60.0
    second = world(
        store_url, box_ids=("b1",), engine=first.engine, clock=clock, min_group=1, observer=observer
    )
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


def test_a_resumed_epoch_is_ready_as_resumed_and_stays_out_of_time_to_ready_metrics(store_url: str) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        first_metrics = ReadyRecorder()
        first = world(store_url, box_ids=("b1",), clock=clock, min_group=1, observer=first_metrics)
        await settle(first.reconciler)
        # The daemon that ran the epoch's warm-up measured its time to ready.
        assert [box_id for box_id, _, _ in first_metrics.ready] == ["b1"]
        (fresh,) = await ready_events(first)
        assert "resumed" not in fresh.detail
        engine_seconds = fresh.detail["engine_seconds"]
        assert isinstance(engine_seconds, float)
        assert engine_seconds > 0
        report = first.reconciler.snapshot().live["b1"].ready_report
        assert report is not None
        assert not report.resumed

        second_metrics = ReadyRecorder()
        second = await restarted(first, store_url, clock, second_metrics)
        assert second_metrics.ready == []
        resumed, earlier = await ready_events(second)  # newest first; the earlier daemon's is kept
        assert earlier == fresh
        assert resumed.epoch == fresh.epoch
        assert resumed.detail["resumed"] is True
        assert "time_to_ready_seconds" not in resumed.detail
        assert "overhead_fraction" not in resumed.detail
        reverify_seconds = resumed.detail["reverify_seconds"]
        # The fake clock stood still from this daemon's first health check to ready; the epoch and the
        # earlier daemon's ready are a minute older, so a figure measured from either would be >= 60.
        assert reverify_seconds == 0.0

        report = second.reconciler.snapshot().live["b1"].ready_report
        assert report is not None
        assert report.resumed
        view = await StatusService(second.reconciler, second.store).box("b1")
        assert view is not None
        assert view.time_to_ready is not None
        assert view.time_to_ready.resumed
        assert view.time_to_ready.time_to_ready_seconds is None
        assert view.time_to_ready.overhead_fraction is None
        assert view.time_to_ready.reverify_seconds == report.reverify_seconds
        await second.store.close()

    asyncio.run(scenario())


def test_a_daemon_finishing_a_crashed_daemons_prefixes_phase_is_ready_as_resumed(store_url: str) -> None:
    """It did not see the epoch's warm-up either: its wall time from its own start is no time to ready."""

    async def scenario() -> None:
        clock = FakeClock()
        first = world(store_url, box_ids=("b1",), clock=clock, min_group=1)
        await settle(first.reconciler)
        finished = await prefixes_phase(first)
        await first.store.put_phase(
            replace(finished, finished_at=None, engine_seconds=None, requests=0, ok=None)
        )

        metrics = ReadyRecorder()
        second = await restarted(first, store_url, clock, metrics)
        assert metrics.ready == []
        newest = (await ready_events(second))[0]
        assert newest.detail["resumed"] is True
        assert (await prefixes_phase(second)).ok is True
        await second.store.close()

    asyncio.run(scenario())


def test_a_warm_left_in_flight_by_a_killed_daemon_is_redone_at_once_by_the_next(store_url: str) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        first = world(store_url, box_ids=("b1",), clock=clock, min_group=1)
        first.engine.gate = asyncio.Event()  # every warm hangs: the daemon dies with them in flight
        left: list[WarmRecord] = []
        for _ in range(200):  # bounded: ticks until a warm is in flight (its row written in a worker thread)
            await first.reconciler.tick()
            await asyncio.sleep(0.01)
            epoch = await first.store.current_epoch("b1")
            rows = [] if epoch is None else await first.store.list_warm(box_id="b1", epoch=epoch)
            left = [r for r in rows if r.state is WarmState.WARMING]
            if left:
                break
        assert left, "the first daemon should have left a warming row behind"
        await first.reconciler.close()  # the kill: its warms in flight never finish
        await first.store.close()
        first.engine.gate = None

        clock.t += 60.0  # a minute later: far inside the 300 s warming timeout
        second = world(store_url, box_ids=("b1",), engine=first.engine, clock=clock, min_group=1)
        await second.reconciler.tick()
        (given_up,) = await second.store.list_warm(box_id="b1", epoch=epoch)
        assert (given_up.state, given_up.last_error) == (
            WarmState.FAILED,
            "left warming by an earlier daemon",
        )
        clock.t += RetryBackoff().initial_seconds  # then warmed again as any failed warm is
        await settle(second.reconciler)
        assert route_boxes(second.reconciler, "sales") == ["b1"]
        (record,) = await second.store.list_warm(box_id="b1", epoch=epoch)
        assert record.state is WarmState.WARM
        await second.store.close()

    asyncio.run(scenario())


def test_a_restarted_daemon_keeps_its_agents_where_their_prefixes_are_warm(store_url: str) -> None:
    """Placement is sticky to the store's warm records, not to a routing that died with the daemon: a
    daemon restarted with more boxes configured keeps the agent on the boxes that hold its prefix (each
    re-probed, none warmed again) instead of moving it to the top of its ranking over the larger fleet."""
    ids = ("b1", "b2", "b3", "b4", "b5", "b6")

    async def scenario() -> tuple[list[str], int]:
        clock = FakeClock()
        engine = FakeEngine(ids)
        first = world(store_url, box_ids=("b1", "b2"), engine=engine, clock=clock)
        await settle(first.reconciler)
        assert routed_boxes(first.reconciler, "sales") == ["b1", "b2"]
        await first.store.close()
        warms = len(engine.warms())
        clock.t += 60.0
        second = world(store_url, box_ids=ids, engine=engine, clock=clock)
        await settle(second.reconciler)
        await second.store.close()
        return routed_boxes(second.reconciler, "sales"), len(engine.warms()) - warms

    routed, warmed_again = asyncio.run(scenario())
    assert routed == ["b1", "b2"]
    assert warmed_again == 0
