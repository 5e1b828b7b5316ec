"""Gateway sync with a fake router and a fake readiness source: only ready fleet boxes are workers,
removals come first, foreign workers are left alone, an outage is survived and retried."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from structlog.testing import capture_logs

from warmer.core.errors import GatewayError
from warmer.core.model import BoxSpec, EngineKind
from warmer.service.fleet.gateway_sync import GatewaySync, SyncOutcome


def box(n: int) -> BoxSpec:
    return BoxSpec(id=f"b{n}", base_url=f"http://10.0.0.{n}:8000", engine=EngineKind.SGLANG, model="m")


B1, B2, B3 = box(1), box(2), box(3)
FOREIGN = "http://10.9.9.9:8000"


class FakeRouter:
    """Workers by URL; calls are logged in order. `down` fails every call; `failing` fails add/remove of
    those URLs; `lands_anyway` makes a failed add still appear (the router kept retrying it); `unusable`
    are listed but not routed to (failing health checks, smg's Failed) until registered again."""

    def __init__(self, workers: set[str] | None = None) -> None:
        self.workers = set(workers or ())
        self.calls: list[tuple[str, str]] = []
        self.down = False
        self.failing: set[str] = set()
        self.lands_anyway = False
        self.unusable: set[str] = set()

    async def registered(self) -> set[str]:
        return set(await self.listing())

    async def listing(self) -> dict[str, bool]:
        if self.down:
            raise GatewayError("gateway GET /workers: ConnectError: refused", transient=True)
        # trailing slashes: the sync must compare URLs normalized
        return {f"{url}/": url not in self.unusable for url in self.workers}

    async def register(self, box: BoxSpec) -> None:
        self.calls.append(("register", box.id))
        if self.down or box.base_url in self.failing:
            if self.lands_anyway:
                self.workers.add(box.base_url)
            raise GatewayError(f"gateway: worker {box.base_url} did not appear in the worker list")
        self.workers.add(box.base_url)
        self.unusable.discard(box.base_url)

    async def deregister(self, box: BoxSpec) -> None:
        self.calls.append(("deregister", box.id))
        if self.down or box.base_url in self.failing:
            raise GatewayError("gateway remove worker: HTTP 500")
        self.workers.discard(box.base_url)
        self.unusable.discard(box.base_url)


class FakeReadiness:
    def __init__(self, ready: set[str] | None) -> None:
        self.ready = ready
        self._changed = asyncio.Event()

    def ready_box_ids(self) -> set[str] | None:
        return None if self.ready is None else set(self.ready)

    def change(self, ready: set[str] | None) -> None:
        self.ready = ready
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_changed(self) -> None:
        await self._changed.wait()


class GatedClock:
    """`sleep` returns only when the test opens the gate: the interval passes when the test says so."""

    def __init__(self) -> None:
        self.t = 0.0
        self.gate = asyncio.Event()
        self.sleeping = 0

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.sleeping += 1
        await self.gate.wait()
        self.gate.clear()
        self.t += seconds


class RecordingObserver:
    def __init__(self) -> None:
        self.passes: list[str] = []
        self.changes: list[tuple[str, str, bool]] = []
        self.listed: list[tuple[int, int]] = []

    def sync_finished(self, outcome: str, seconds: float) -> None:
        self.passes.append(outcome)

    def worker_changed(self, box_id: str, action: str, ok: bool) -> None:
        self.changes.append((box_id, action, ok))

    def workers_listed(self, ours: int, foreign: int) -> None:
        self.listed.append((ours, foreign))


def make_sync(
    router: FakeRouter,
    readiness: FakeReadiness,
    fleet: Sequence[BoxSpec] = (B1, B2, B3),
    observer: RecordingObserver | None = None,
    clock: GatedClock | None = None,
) -> GatewaySync:
    boxes = list(fleet)
    return GatewaySync(
        gateway=router,
        fleet=lambda: boxes,
        readiness=readiness,
        clock=clock or GatedClock(),
        interval_seconds=5.0,
        observer=observer,
    )


def test_only_ready_boxes_become_workers_removals_first_foreign_untouched() -> None:
    async def scenario() -> None:
        router = FakeRouter({B2.base_url, B3.base_url, FOREIGN})
        observer = RecordingObserver()
        sync = make_sync(router, FakeReadiness({"b1", "b2"}), observer=observer)

        report = await sync.sync_once()

        assert report.outcome is SyncOutcome.OK
        assert (report.registered, report.deregistered) == (("b1",), ("b3",))
        assert report.foreign_workers == (FOREIGN,)
        assert router.workers == {B1.base_url, B2.base_url, FOREIGN}
        assert router.calls == [("deregister", "b3"), ("register", "b1")]  # out first, then in
        assert observer.listed == [(2, 1)]
        assert observer.changes == [("b3", "deregister", True), ("b1", "register", True)]
        assert observer.passes == ["ok"]

        # converged: the next pass changes nothing
        router.calls.clear()
        assert (await sync.sync_once()).outcome is SyncOutcome.OK
        assert router.calls == []

    asyncio.run(scenario())


def test_an_unusable_listing_of_a_ready_box_is_replaced_and_of_a_box_not_ready_withdrawn() -> None:
    """Listed is not routed: sglang-router keeps a worker whose health checks fail (`is_healthy: false`),
    smg a Failed one. A ready box's such registration is registered again (the adapter replaces it); a box
    that is not ready is withdrawn whatever state the router shows."""

    async def scenario() -> None:
        router = FakeRouter({B1.base_url, B2.base_url})
        router.unusable = {B1.base_url, B2.base_url}
        sync = make_sync(router, FakeReadiness({"b1"}), fleet=(B1, B2))

        report = await sync.sync_once()

        assert (report.registered, report.deregistered) == (("b1",), ("b2",))
        assert router.calls == [("deregister", "b2"), ("register", "b1")]
        assert await router.listing() == {f"{B1.base_url}/": True}
        router.calls.clear()
        assert (await sync.sync_once()).outcome is SyncOutcome.OK
        assert router.calls == []  # usable now: nothing to replace

    asyncio.run(scenario())


def test_unknown_readiness_changes_nothing() -> None:
    async def scenario() -> None:
        router = FakeRouter({B1.base_url, B2.base_url})
        sync = make_sync(router, FakeReadiness(None))

        report = await sync.sync_once()

        assert report.outcome is SyncOutcome.READINESS_UNKNOWN
        assert router.calls == []
        assert router.workers == {B1.base_url, B2.base_url}

    asyncio.run(scenario())


def test_nothing_ready_withdraws_every_fleet_box() -> None:
    async def scenario() -> None:
        router = FakeRouter({B1.base_url, B2.base_url, FOREIGN})
        sync = make_sync(router, FakeReadiness(set()))

        report = await sync.sync_once()

        assert sorted(report.deregistered) == ["b1", "b2"]
        assert router.workers == {FOREIGN}

    asyncio.run(scenario())


def test_an_add_that_failed_but_landed_later_is_removed_when_the_box_is_not_ready() -> None:
    async def scenario() -> None:
        router = FakeRouter()
        router.failing, router.lands_anyway = {B1.base_url}, True
        readiness = FakeReadiness({"b1"})
        sync = make_sync(router, readiness, observer=(observer := RecordingObserver()))

        report = await sync.sync_once()
        assert report.outcome is SyncOutcome.PARTIAL
        assert report.failed
        assert report.failed[0].startswith("b1: GatewayError")
        assert observer.changes == [("b1", "register", False)]

        # the box lost readiness meanwhile; the router lists it anyway: the listing is the truth
        router.failing = set()
        readiness.change(set())
        report = await sync.sync_once()
        assert report.deregistered == ("b1",)
        assert router.workers == set()

    asyncio.run(scenario())


def test_gateway_outage_is_survived_logged_once_and_retried() -> None:
    async def scenario() -> None:
        router = FakeRouter({B3.base_url})
        router.down = True
        observer = RecordingObserver()
        sync = make_sync(router, FakeReadiness({"b1"}), observer=observer)

        with capture_logs() as logs:
            first = await sync.sync_once()
            second = await sync.sync_once()
            router.down = False
            third = await sync.sync_once()

        assert (first.outcome, second.outcome) == (SyncOutcome.GATEWAY_UNAVAILABLE,) * 2
        assert first.error is not None
        assert "ConnectError" in first.error
        assert third.outcome is SyncOutcome.OK
        assert router.workers == {B1.base_url}
        assert observer.passes == ["gateway_unavailable", "gateway_unavailable", "ok"]
        events = [entry["event"] for entry in logs]
        assert events.count("gateway unreachable: worker list unknown, retrying") == 1
        assert "gateway reachable again" in events

    asyncio.run(scenario())


def test_a_box_that_left_the_fleet_is_still_withdrawn() -> None:
    async def scenario() -> None:
        router = FakeRouter({B1.base_url, B2.base_url})
        fleet = [B1, B2]
        readiness = FakeReadiness({"b1", "b2"})
        sync = GatewaySync(
            gateway=router, fleet=lambda: fleet, readiness=readiness, clock=GatedClock(), interval_seconds=1
        )
        await sync.sync_once()
        fleet.remove(B2)  # box.removed event: the reconciler no longer knows b2, so it is not ready
        readiness.change({"b1"})

        report = await sync.sync_once()

        assert report.deregistered == ("b2",)
        assert router.workers == {B1.base_url}

    asyncio.run(scenario())


async def wait_for(predicate: object, what: str) -> None:
    for _ in range(500):
        if callable(predicate) and predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


def test_run_passes_on_readiness_change_and_on_the_interval_until_stopped() -> None:
    async def scenario() -> None:
        router = FakeRouter()
        readiness = FakeReadiness(set())
        clock = GatedClock()
        sync = make_sync(router, readiness, clock=clock)
        stopping = asyncio.Event()
        running = asyncio.create_task(sync.run(stopping))

        await wait_for(lambda: sync.passes == 1 and clock.sleeping == 1, "first pass")

        # the reconciler ran a pass but readiness did not change: no router traffic
        readiness.change(set())
        for _ in range(50):
            await asyncio.sleep(0)
        assert sync.passes == 1

        # readiness changed: a pass at once, without waiting for the interval
        readiness.change({"b2"})
        await wait_for(lambda: sync.passes == 2, "pass on change")
        assert router.workers == {B2.base_url}

        # a worker added behind our back is corrected by the interval pass
        router.workers.add(B3.base_url)
        await wait_for(lambda: clock.sleeping == 2, "waiting on the interval")
        clock.gate.set()
        await wait_for(lambda: sync.passes == 3, "interval pass")
        assert router.workers == {B2.base_url}

        stopping.set()
        await asyncio.wait_for(running, timeout=5)
        assert running.result() is None

    asyncio.run(scenario())


def test_run_survives_an_outage() -> None:
    async def scenario() -> None:
        router = FakeRouter()
        router.down = True
        readiness = FakeReadiness({"b1"})
        clock = GatedClock()
        sync = make_sync(router, readiness, clock=clock)
        stopping = asyncio.Event()
        running = asyncio.create_task(sync.run(stopping))

        await wait_for(lambda: sync.passes == 1 and clock.sleeping == 1, "failed pass")
        assert not running.done()
        router.down = False
        clock.gate.set()
        await wait_for(lambda: sync.passes == 2, "retry pass")
        assert router.workers == {B1.base_url}

        stopping.set()
        await asyncio.wait_for(running, timeout=5)

    asyncio.run(scenario())
