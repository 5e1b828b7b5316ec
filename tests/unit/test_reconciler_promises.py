"""What the reconciler's settings and docstrings promise, held to: route lookups count as traffic, the health
timer is a light poll, a late health answer is not an outage, a probe that cannot reach the engine is no
eviction, and engine work logs say which box, prefix, action and agent they are about."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

import structlog
from structlog.testing import capture_logs

from tests.unit.reconciler_fakes import FakeEngine, FencedOutStore, World, route_boxes, settle, world
from warmer.adapters.store import SqlStore
from warmer.core.errors import EngineSlow, EngineUnavailable
from warmer.core.model import BoxSpec, CompletionReport, Prefix, WarmState
from warmer.core.planner import PlannerConfig, WarmBudget
from warmer.service.reconciler.restart_detection import EPOCH_SIGHTING_SECONDS
from warmer.service.views.status import StatusService
from warmer.testing import is_probe

HOUR = 3600.0


class ProbeFailingEngine(FakeEngine):
    """The fake engine, except that while `probes_fail` is set a probe meets a transport error."""

    probes_fail = False

    async def complete_prefix(
        self, box: BoxSpec, prefix: Prefix, *, suffix: str = "", max_tokens: int = 1, slot: int | None = None
    ) -> CompletionReport:
        if self.probes_fail and is_probe(suffix):
            self.log.append((box.id, "probe-failed", suffix))
            raise EngineUnavailable(box.id, "connection refused")
        return await super().complete_prefix(box, prefix, suffix=suffix, max_tokens=max_tokens, slot=slot)


class ForgetfulEngine(FakeEngine):
    """Answers every request, but its probes never see a hit: no warm is ever verified."""

    async def complete_prefix(
        self, box: BoxSpec, prefix: Prefix, *, suffix: str = "", max_tokens: int = 1, slot: int | None = None
    ) -> CompletionReport:
        report = await super().complete_prefix(box, prefix, suffix=suffix, max_tokens=max_tokens, slot=slot)
        return replace(report, cached_tokens=0)


class SlowHealthEngine(FakeEngine):
    """The fake engine, except that the boxes in `slow` take the health call and answer too late."""

    def __init__(self, box_ids: tuple[str, ...]) -> None:
        super().__init__(box_ids)
        self.slow: set[str] = set()

    async def health(self, box: BoxSpec) -> bool:
        if box.id in self.slow:
            raise EngineSlow(box.id, "GET /health timed out after 3s")
        return await super().health(box)


def _planner(**overrides: object) -> PlannerConfig:
    return PlannerConfig(budget=WarmBudget(max_concurrent=2, tokens_per_second=1e6), **overrides)  # type: ignore[arg-type]


def test_route_lookups_for_an_agent_keep_it_warm_past_the_idle_cutoff(store_url: str) -> None:
    """`retire_idle_after_seconds` counts from the agent's last traffic warmer sees; a route lookup is
    traffic (a call is about to use the answer), so an agent looked up every half hour stays warm."""

    async def scenario() -> tuple[list[str], list[str]]:
        looked_up = world(
            store_url, agents=("sales", "support"), planner=_planner(retire_idle_after_seconds=HOUR)
        )
        await settle(looked_up.reconciler)
        assert sorted(route_boxes(looked_up.reconciler, "sales")) == ["b1", "b2"]
        for _ in range(4):  # two hours of lookups for "sales", none for "support"
            looked_up.clock.t += HOUR / 2
            assert looked_up.reconciler.agent_routes("sales")
            await settle(looked_up.reconciler)
        answer = (
            sorted(route_boxes(looked_up.reconciler, "sales")),
            route_boxes(looked_up.reconciler, "support"),
        )
        await looked_up.store.close()
        return answer

    sales, support = asyncio.run(scenario())
    assert sales == ["b1", "b2"]
    assert support == []  # no traffic for two hours: not kept warm


def test_the_health_poll_is_light_and_wakes_a_pass_only_when_a_box_changed(store_url: str) -> None:
    async def scenario() -> None:
        w = world(store_url, planner=_planner(retire_idle_after_seconds=None))
        await settle(w.reconciler)
        desired = w.reconciler.snapshot().desired  # a full pass builds a new one
        warms, probes = len(w.engine.warms()), len(w.engine.probes())

        w.reconciler._wake.clear()
        await w.reconciler.poll_health()  # nothing changed: no pass wanted, no engine work
        assert not w.reconciler._wake.is_set()
        assert (len(w.engine.warms()), len(w.engine.probes())) == (warms, probes)
        assert w.reconciler.snapshot().desired is desired

        w.engine.boxes["b1"].healthy = False
        await w.reconciler.poll_health()
        assert w.reconciler.ready_box_ids() == {"b2"}  # out at once, before any pass
        assert route_boxes(w.reconciler, "sales") == ["b2"]
        assert w.reconciler._wake.is_set()  # and a pass is wanted

        w.reconciler._wake.clear()
        w.engine.boxes["b1"].healthy = True
        w.engine.restart("b1")  # back as a new process: a restart, seen by the light poll
        await w.reconciler.poll_health()
        assert w.reconciler._wake.is_set()
        assert w.reconciler.snapshot().live["b1"].epoch == "gen-1"
        assert w.reconciler.ready_box_ids() == {"b2"}  # cold until warmed up and verified again
        await settle(w.reconciler)
        assert w.reconciler.ready_box_ids() == {"b1", "b2"}
        await w.store.close()

    asyncio.run(scenario())


def test_one_late_health_answer_keeps_a_box_in_its_routes_and_two_in_a_row_do_not(store_url: str) -> None:
    """`reconcile.health_slow_polls_allowed` (1): a busy box that answers its health poll too late once keeps
    its routes (taking it out would shift its calls onto the others and back); a second late answer in a
    row takes it out like any outage. A good answer in between starts the count again."""

    async def scenario() -> None:
        engine = SlowHealthEngine(("b1", "b2"))
        w = world(store_url, engine=engine, planner=_planner(retire_idle_after_seconds=None))
        await settle(w.reconciler)
        assert w.reconciler.ready_box_ids() == {"b1", "b2"}

        engine.slow.add("b1")
        w.reconciler._wake.clear()
        with capture_logs() as logs:
            await w.reconciler.poll_health()
        assert w.reconciler.ready_box_ids() == {"b1", "b2"}
        assert sorted(route_boxes(w.reconciler, "sales")) == ["b1", "b2"]
        assert not w.reconciler._wake.is_set()  # nothing changed: no pass wanted
        (slow,) = [e for e in logs if e["event"].startswith("box slow to answer")]
        assert (slow["box"], slow["slow_polls"], slow["allowed"]) == ("b1", 1, 1)
        view = await StatusService(w.reconciler, w.store).box("b1")
        assert view is not None
        assert (view.healthy, view.health_slow_polls, view.ready.ready) == (True, 1, True)
        assert (view.lease_holder, view.held_here) == (None, True)  # alone: no leases, every box its own

        engine.slow.clear()
        await w.reconciler.poll_health()  # answered in time: the count starts again
        engine.slow.add("b1")
        await w.reconciler.poll_health()
        assert w.reconciler.ready_box_ids() == {"b1", "b2"}

        await w.reconciler.poll_health()  # the second late answer in a row
        assert w.reconciler.ready_box_ids() == {"b2"}
        assert route_boxes(w.reconciler, "sales") == ["b2"]
        assert w.reconciler._wake.is_set()
        assert "timed out" in (w.reconciler.snapshot().live["b1"].health_error or "")
        await w.store.close()

    asyncio.run(scenario())


def test_with_no_late_answers_allowed_one_takes_the_box_out(store_url: str) -> None:
    async def scenario() -> None:
        engine = SlowHealthEngine(("b1", "b2"))
        w = world(
            store_url, engine=engine, planner=_planner(retire_idle_after_seconds=None), slow_polls_allowed=0
        )
        await settle(w.reconciler)
        engine.slow.add("b2")
        await w.reconciler.poll_health()
        assert w.reconciler.ready_box_ids() == {"b1"}
        await w.store.close()

    asyncio.run(scenario())


def test_writes_refused_by_the_lease_fence_are_dropped_not_recorded_and_jam_nothing(store_url: str) -> None:
    """A box taken over by another replica: its warm and its new epoch are refused by the store
    (`LeaseLost`). The warm stops at its first write, before any engine traffic, and never reaches this
    replica's view (the box is not called ready on it); the epoch write leaves the queue (the other boxes'
    writes still land); both are logged."""

    async def scenario() -> None:
        w = world(store_url, planner=_planner(retire_idle_after_seconds=None), store_class=FencedOutStore)
        store = w.store
        assert isinstance(store, FencedOutStore)
        store.fenced_warms = frozenset({"b1"})
        with capture_logs() as logs:
            await settle(w.reconciler)
        assert "warm result not written: the box's lease is held elsewhere" in [e["event"] for e in logs]
        assert not w.engine.warms("b1")  # the refused "warm started" write stops it before any engine traffic
        assert [r.box_id for r in await store.list_warm()] == ["b2"]
        assert w.reconciler.ready_box_ids() == {"b2"}
        assert route_boxes(w.reconciler, "sales") == ["b2"]

        store.fenced_epochs = frozenset({"b1"})
        w.engine.restart("b1")
        w.engine.restart("b2")
        with capture_logs() as logs:
            await w.reconciler.poll_health()
        assert "box write dropped: lease held elsewhere" in [e["event"] for e in logs]
        assert await store.current_epoch("b2") == "gen-1"  # written after b1's refused write
        assert await store.current_epoch("b1") == "gen-0"
        await store.close()

    asyncio.run(scenario())


def test_a_probe_that_cannot_reach_the_engine_is_not_an_eviction_and_is_retried(store_url: str) -> None:
    async def probe(w: World) -> None:
        w.clock.t += 61.0  # past the suspect probe interval
        await w.reconciler.tick()
        await w.reconciler.wait_idle()

    async def scenario() -> None:
        engine = ProbeFailingEngine(["b1", "b2"])
        w = world(
            store_url,
            engine=engine,
            planner=_planner(retire_idle_after_seconds=None, probe_min_interval_seconds=60.0),
        )
        await settle(w.reconciler)
        w.reconciler.set_suspect("b1", True)
        engine.probes_fail = True
        await probe(w)
        assert [e for e in engine.log if e[1] == "probe-failed"], "the probe was sent"
        (record,) = await w.store.list_warm(box_id="b1")
        assert record.state is WarmState.WARM  # unknown, not evicted: no re-warm on no evidence
        warms = len(engine.warms("b1"))

        engine.probes_fail = False
        await probe(w)  # asked again, and this time the engine answers
        assert len(engine.probes("b1")) >= 1
        (record,) = await w.store.list_warm(box_id="b1")
        assert record.state is WarmState.WARM
        assert record.verified_at == w.clock.t
        assert len(engine.warms("b1")) == warms
        assert sorted(route_boxes(w.reconciler, "sales")) == ["b1", "b2"]
        await w.store.close()

    asyncio.run(scenario())


def test_engine_work_logs_name_the_box_prefix_action_and_agent(store_url: str) -> None:
    async def scenario() -> list[dict[str, object]]:
        with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
            w = world(store_url, box_ids=("b1",), engine=ForgetfulEngine(["b1"]), min_group=1)
            await settle(w.reconciler, rounds=2)
            await w.store.close()
        return logs

    logs = asyncio.run(scenario())
    restart = [e for e in logs if e["event"] == "restart warm-up done"]
    assert restart
    assert {(e["box"], e["action"]) for e in restart} == {("b1", "restart-warmup")}
    not_verified = [e for e in logs if e["event"] == "warm not verified"]
    assert not_verified
    for entry in not_verified:
        assert (entry["box"], entry["action"], entry["agent"]) == ("b1", "warm", "sales")
        assert entry["prefix"]
    assert "action" not in structlog.contextvars.get_contextvars()  # bound only while the work runs


class SightingStore(SqlStore):
    """The real store, recording which boxes' known epochs each sighting write names."""

    sightings: list[str]

    async def record_epochs(
        self, seen: Sequence[tuple[str, str, float]], *, drop_others: bool = False
    ) -> frozenset[str]:
        if not drop_others:
            self.sightings = [*getattr(self, "sightings", []), *(box_id for box_id, _, _ in seen)]
        return await super().record_epochs(seen, drop_others=drop_others)


def test_a_known_epoch_seen_again_is_written_once_a_minute_not_at_every_poll(store_url: str) -> None:
    async def scenario() -> None:
        w = world(store_url, store_class=SightingStore)
        store = w.store
        assert isinstance(store, SightingStore)
        await settle(w.reconciler)
        store.sightings = []
        for _ in range(3):  # three polls within the minute: the store already holds these epochs
            w.clock.t += 5.0
            await w.reconciler.poll_health()
        assert store.sightings == []
        w.clock.t += EPOCH_SIGHTING_SECONDS
        await w.reconciler.poll_health()
        assert sorted(store.sightings) == ["b1", "b2"]
        w.engine.restart("b1")  # a new process is written at once, whatever the minute
        await w.reconciler.poll_health()
        assert await store.current_epoch("b1") == "gen-1"
        await store.close()

    asyncio.run(scenario())
