"""The reconciler over a fake engine port, a fake clock and a real SqlStore on a temp SQLite file.

The fake engine keeps a per-box prefix cache (a restart empties it and changes the epoch) and logs every
request, so ordering (restart warm-up before prefixes), coalescing and re-probing are observed from the
engine's side, the way a real fleet would see them. No sleeping: the loop is stepped with `tick()` and
`drain()`, or run as a task and driven by the engine's own gates.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

import httpx
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy.orm import Session

from tests.unit.reconciler_fakes import (
    PREFIX_TOKENS,
    PROFILE,
    FakeClock,
    FakeEngine,
    World,
    boxes,
    route_boxes,
    routed_boxes,
    settle,
    world,
)
from warmer.adapters.store import SqlStore
from warmer.api import ApiServices, Readiness, create_app
from warmer.core.errors import StoreUnavailable
from warmer.core.model import PhaseName, RestartRecipe, WarmRecord, WarmState
from warmer.core.placement import AgentDemand, PlacementConfig, place
from warmer.core.planner import PlannerConfig, WarmupStatus
from warmer.core.warm_budget import WarmBudget
from warmer.root.metrics import ReconcileMetrics
from warmer.service.engine_work.restart_warmup import RestartWarmup, burst_levels
from warmer.service.reconciler import UnknownAgent
from warmer.service.views.status import StatusService

T = TypeVar("T")


def test_restart_warmup_runs_before_prefixes_and_the_box_becomes_ready(store_url: str) -> None:
    async def scenario() -> None:
        w = world(store_url)
        await w.reconciler.tick()
        assert route_boxes(w.reconciler, "sales") == []  # nothing is warm before the first tick's work
        await settle(w.reconciler)

        for box_id in ("b1", "b2"):
            kinds = [kind for b, kind, _ in w.engine.log if b == box_id]
            first_prefix = kinds.index("warm")
            assert set(kinds[:first_prefix]) == {"prompt"}  # the whole recipe before any prefix request
            assert "prompt" not in kinds[first_prefix:]
            phases = await w.store.list_phases(box_id, "gen-0")
            assert [p.phase for p in phases] == [
                PhaseName.SAMPLED,
                PhaseName.CONSTRAINED,
                PhaseName.BURST,
                PhaseName.LONG_PREFILL,
                PhaseName.PREFIXES,
            ]
            assert all(p.ok for p in phases)
            assert phases[-1].finished_at is not None  # PREFIXES ends when the box is ready
            ready = w.reconciler.snapshot().live[box_id].ready_report
            assert ready is not None
            assert ready.epoch == "gen-0"
            assert ready.engine_seconds > 0

        prompts = [(p, schema, temp) for b, p, schema, temp in w.engine.prompts if b == "b1"]
        assert prompts[0][2] > 0  # sampled
        assert prompts[1][1] == dict(PROFILE.restart.constrained.json_schema)  # type: ignore[union-attr]
        long_tokens = len(await w.engine.tokenize(boxes("b1")[0], prompts[-1][0]))
        # sized to the longest prompt the box's calls send (the prefix x the recipe's headroom), not the
        # whole context: a longer prefill is only warm traffic on every box at every restart
        wanted = min(
            PROFILE.context_length - 64, math.ceil(PREFIX_TOKENS * PROFILE.restart.long_prefill_headroom)
        )
        assert wanted < PROFILE.context_length - 64
        assert wanted >= long_tokens >= 0.97 * wanted
        assert w.engine.max_in_flight_prompts >= 2  # the burst reached the slot count concurrently

        assert sorted(route_boxes(w.reconciler, "sales")) == ["b1", "b2"]
        records = await w.store.list_warm()
        assert {(r.box_id, r.state) for r in records} == {("b1", WarmState.WARM), ("b2", WarmState.WARM)}
        history = [e for e in await w.store.events(limit=500) if e.kind == "warm_transition"]
        assert [(e.detail["from"], e.detail["to"]) for e in reversed(history) if e.box_id == "b1"] == [
            (None, "warming"),
            ("warming", "warm"),
        ]
        assert any(e.kind == "box_ready" for e in await w.store.events(limit=500))
        assert w.source.calls == ["sales"]  # computed once per spec version
        await w.store.close()

    asyncio.run(scenario())


def test_a_new_epoch_drops_the_box_from_routes_at_once_then_it_is_rewarmed(store_url: str) -> None:
    async def scenario() -> None:
        w = world(store_url)
        await settle(w.reconciler)
        assert sorted(route_boxes(w.reconciler, "sales")) == ["b1", "b2"]

        w.engine.restart("b1")
        await w.reconciler.tick()  # one observation is enough: no warm needs to finish first
        assert route_boxes(w.reconciler, "sales") == ["b2"]
        assert await w.store.list_warm(box_id="b1", epoch="gen-0") == []  # died with the process
        status = StatusService(w.reconciler, w.store)
        ready = await status.ready("b1")
        assert ready is not None
        assert not ready.ready

        await settle(w.reconciler)
        assert sorted(route_boxes(w.reconciler, "sales")) == ["b1", "b2"]
        phases = await w.store.list_phases("b1", "gen-1")
        assert next(p.phase for p in phases) is PhaseName.SAMPLED
        assert all(p.ok for p in phases)
        epochs = [e for e in await w.store.events(box_id="b1", limit=500) if e.kind == "epoch_changed"]
        assert [e.epoch for e in reversed(epochs)] == ["gen-0", "gen-1"]
        await w.store.close()

    asyncio.run(scenario())


def test_an_unhealthy_box_leaves_routes_on_the_next_observation(store_url: str) -> None:
    async def scenario() -> None:
        w = world(store_url)
        await settle(w.reconciler)
        w.engine.boxes["b2"].healthy = False
        await w.reconciler.tick()
        assert route_boxes(w.reconciler, "sales") == ["b1"]
        await w.store.close()

    asyncio.run(scenario())


def test_concurrent_pre_call_asks_for_one_prefix_send_one_warm_per_box(store_url: str) -> None:
    async def scenario() -> None:
        # Idle agents are not kept warm: only the pre-call asks make the prefix wanted.
        w = world(store_url, planner=PlannerConfig(retire_idle_after_seconds=1.0))
        await settle(w.reconciler)  # warm-ups done; the agent, new, was warmed once
        w.clock.t += 3600.0
        await settle(w.reconciler)  # idle now: released everywhere
        assert route_boxes(w.reconciler, "sales") == []
        w.engine.restart("b1")
        w.engine.restart("b2")  # cold caches, new epochs: the prefix must really be sent again
        await settle(w.reconciler)
        sent_before = len(w.engine.warms())

        w.engine.gate = asyncio.Event()
        stopping = asyncio.Event()
        loop_task = asyncio.create_task(w.reconciler.run(stopping))
        asks = [asyncio.create_task(w.reconciler.ensure_warm("sales", wait_seconds=30.0)) for _ in range(6)]
        for _ in range(50):
            await asyncio.sleep(0)
        w.engine.gate.set()
        results = await asyncio.gather(*asks)
        stopping.set()
        await loop_task

        assert {r.routed for r in results} == {True}
        assert len({r.box_id for r in results}) == 1  # everyone is sent to the same warm box
        new = w.engine.warms()[sent_before:]
        assert 1 <= len(new) <= 2  # six asks: at most one warm per (box, prefix) of the group
        assert len({box_id for box_id, _, _ in new}) == len(new)
        with pytest.raises(UnknownAgent):
            await w.reconciler.ensure_warm("nobody")
        await w.store.close()

    asyncio.run(scenario())


def test_resume_reprobes_records_verified_before_the_daemon_started(store_url: str) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        first = world(store_url, box_ids=("b1",), clock=clock, min_group=1)
        await settle(first.reconciler)
        assert route_boxes(first.reconciler, "sales") == ["b1"]
        await first.store.close()

        # The daemon restarts; the engine kept running (same epoch, prefix still cached).
        clock.t += 60.0
        second = world(store_url, box_ids=("b1",), engine=first.engine, clock=clock, min_group=1)
        sent_before = len(first.engine.log)
        # the probe the pass starts is held at the engine until looked at: on a loaded machine it could
        # otherwise finish during the pass's own awaits and make the box routed before the check
        first.engine.gate = asyncio.Event()
        await second.reconciler.tick()
        assert route_boxes(second.reconciler, "sales") == []  # not trusted blindly
        (view,) = await StatusService(second.reconciler, second.store).boxes()
        assert [(p.state, p.trusted) for p in view.prefixes] == [("warm", False)]
        first.engine.gate.set()
        await settle(second.reconciler)
        assert route_boxes(second.reconciler, "sales") == ["b1"]
        new = first.engine.log[sent_before:]
        assert [kind for _, kind, _ in new] == ["probe"]  # no warm-up rerun, no re-warm: one probe
        reasons = [
            e.detail.get("reason") for e in await second.store.events(limit=50) if e.kind == "warm_transition"
        ]
        assert any("untrusted" in str(r) and "saw the hit" in str(r) for r in reasons)
        await second.store.close()

    asyncio.run(scenario())


def test_keepalive_touches_a_warm_prefix_when_due_and_it_stays_routed(store_url: str) -> None:
    async def scenario() -> None:
        w = world(
            store_url, box_ids=("b1",), planner=PlannerConfig(retire_idle_after_seconds=None), min_group=1
        )
        await settle(w.reconciler)
        (before,) = await w.store.list_warm()
        w.clock.t += 100.0
        await settle(w.reconciler)
        assert await w.store.list_warm() == [before]  # not due: no touch
        w.clock.t += PROFILE.keepalive_seconds
        await w.reconciler.tick()
        assert route_boxes(w.reconciler, "sales") == ["b1"]  # stale is still serving
        await settle(w.reconciler)
        (after,) = await w.store.list_warm()
        assert after.state is WarmState.WARM
        assert after.verified_at == w.clock.t
        assert after.warmed_at == before.warmed_at  # one continuous warm stretch: no ramp restart
        reasons = [e.detail["reason"] for e in await w.store.events(limit=50) if e.kind == "warm_transition"]
        assert "keepalive due" in reasons
        await w.store.close()

    asyncio.run(scenario())


def test_a_suspect_box_is_probed_and_an_evicted_prefix_leaves_the_route_until_rewarmed(
    store_url: str,
) -> None:
    """The hit-rate monitor's path: `set_suspect` -> a SUSPECT probe of the box's warm prefixes (no more
    often than `probe_min_interval_seconds` per prefix) -> a cold probe marks the record evicted, which is
    not serving, so the box leaves the route -> the planner re-warms it and the route comes back."""

    async def step(w: World) -> None:
        await w.reconciler.tick()
        await w.reconciler.wait_idle()

    async def b1_history(w: World) -> list[tuple[object, object, str]]:
        events = await w.store.events(box_id="b1", limit=500)
        return [
            (e.detail["from"], e.detail["to"], str(e.detail["reason"]))
            for e in reversed(events)
            if e.kind == "warm_transition"
        ]

    async def scenario() -> None:
        interval = 60.0
        w = world(
            store_url,
            planner=PlannerConfig(
                budget=WarmBudget(max_concurrent=2, tokens_per_second=1e6),
                retire_idle_after_seconds=None,
                probe_min_interval_seconds=interval,
            ),
        )
        await settle(w.reconciler)
        assert sorted(route_boxes(w.reconciler, "sales")) == ["b1", "b2"]
        history_before = len(await b1_history(w))
        probes = {box_id: len(w.engine.probes(box_id)) for box_id in ("b1", "b2")}

        def new_probes(box_id: str) -> int:
            return len(w.engine.probes(box_id)) - probes[box_id]

        w.engine.boxes["b1"].cache.clear()  # the engine evicted the prefix: the next read is cold
        w.reconciler.set_suspect("b1", True)
        await step(w)
        assert new_probes("b1") == 0  # verified just now: within the probe interval, not probed yet
        assert sorted(route_boxes(w.reconciler, "sales")) == ["b1", "b2"]

        warms_before = len(w.engine.warms("b1"))
        w.clock.t += interval + 1.0
        await step(w)  # the probe goes out, reads cold; the re-warm waits for the next pass
        assert new_probes("b1") == 1
        assert new_probes("b2") == 0  # not suspect: never probed
        assert len(w.engine.warms("b1")) == warms_before  # the re-warm waits for the next pass
        (evicted,) = await w.store.list_warm(box_id="b1")
        assert evicted.state is WarmState.EVICTED
        assert route_boxes(w.reconciler, "sales") == ["b2"]  # evicted is not serving: out of the route
        assert w.reconciler.ready_box_ids() == {"b2"}

        await step(w)  # evicted -> warming -> warm
        assert len(w.engine.warms("b1")) == warms_before + 1
        (rewarmed,) = await w.store.list_warm(box_id="b1")
        assert rewarmed.state is WarmState.WARM
        assert rewarmed.verified_at == w.clock.t
        assert sorted(route_boxes(w.reconciler, "sales")) == ["b1", "b2"]
        transitions = (await b1_history(w))[history_before:]
        assert [(before, after) for before, after, _ in transitions] == [
            ("warm", "evicted"),
            ("evicted", "warming"),
            ("warming", "warm"),
        ]
        assert "probe (suspect) says cold" in transitions[0][2]
        (b2,) = await w.store.list_warm(box_id="b2")
        assert b2.state is WarmState.WARM

        # Still suspect: the re-warmed prefix is probed again only once the interval has passed.
        probes = {box_id: len(w.engine.probes(box_id)) for box_id in ("b1", "b2")}
        w.clock.t += interval / 2
        await step(w)
        assert new_probes("b1") == 0
        w.clock.t += interval / 2
        await step(w)
        assert new_probes("b1") == 1  # reads warm this time: stays warm and routed
        assert new_probes("b2") == 0
        (probed,) = await w.store.list_warm(box_id="b1")
        assert probed.state is WarmState.WARM
        assert probed.verified_at == w.clock.t
        assert sorted(route_boxes(w.reconciler, "sales")) == ["b1", "b2"]

        # The monitor clears the verdict: no more probes, however long it has been.
        w.reconciler.set_suspect("b1", False)
        w.clock.t += interval + 1.0
        await step(w)
        assert new_probes("b1") == 1
        await w.store.close()

    asyncio.run(scenario())


def test_an_engine_that_claims_every_prompt_cached_is_never_ready(store_url: str) -> None:
    """A consistent liar: every answer claims the whole prompt cached while nothing is (its over-claims
    stay within what was sent, so each warm alone would read as verified). The restart warm-up's long
    prefill starts with a fresh nonce: a hit claimed there cannot be true, so the box's reports prove
    nothing and it is never ready; an honest engine passes the same check."""

    async def scenario() -> None:
        engine = FakeEngine(["b1", "b2"])
        engine.lies = True
        w = world(store_url, engine=engine)
        await settle(w.reconciler)
        assert w.reconciler.ready_box_ids() == set()
        assert engine.warms() == []  # nothing is warmed on reports that prove nothing
        phases = await w.store.list_phases("b1", "gen-0")
        assert [(p.phase, p.ok) for p in phases][-1] == (PhaseName.LONG_PREFILL, False)
        assert "made up this moment" in (phases[-1].error or "")
        box = await StatusService(w.reconciler, w.store).box("b1")
        assert box is not None
        assert "made up this moment" in (box.warmup_error or "")

        engine.lies = False
        w.engine.restart("b1")  # an honest process: the same check passes
        await settle(w.reconciler)
        assert "b1" in (w.reconciler.ready_box_ids() or set())
        await w.store.close()

    asyncio.run(scenario())


def test_a_failed_restart_phase_is_recorded_with_its_reason_and_blocks_prefixes(store_url: str) -> None:
    async def scenario() -> None:
        engine = FakeEngine(["b1", "b2"])
        engine.fail_constrained = True
        w = world(store_url, engine=engine)
        await settle(w.reconciler)
        assert engine.warms() == []
        phases = await w.store.list_phases("b1", "gen-0")
        assert [(p.phase, p.ok) for p in phases] == [
            (PhaseName.SAMPLED, True),
            (PhaseName.CONSTRAINED, False),
        ]
        assert phases[1].error is not None
        assert "grammar backend crashed" in phases[1].error
        status = StatusService(w.reconciler, w.store)
        ready = await status.ready("b1")
        assert ready is not None
        assert not ready.ready
        assert "restart warm-up failed" in ready.reasons
        await w.store.close()

    asyncio.run(scenario())


def test_box_and_route_endpoints(store_url: str) -> None:
    async def scenario() -> None:
        w = world(store_url)
        status = StatusService(w.reconciler, w.store)

        async def ok() -> Readiness:
            return Readiness(True)

        app = create_app(ApiServices(registry=CollectorRegistry(), readiness=ok, status=status))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://warmer") as client:
            await w.reconciler.tick()
            not_ready = await client.get("/v1/boxes/b1/ready")
            assert not_ready.status_code == 503
            assert not_ready.json()["reasons"] == ["restart warm-up running"]
            await settle(w.reconciler)
            ready = await client.get("/v1/boxes/b1/ready")
            assert ready.status_code == 200
            assert ready.json()["ready"] is True
            assert 0 < ready.json()["weight"] <= 1
            assert (await client.get("/v1/boxes/nope")).status_code == 404
            assert (await client.get("/v1/boxes/nope/ready")).status_code == 404
            box = (await client.get("/v1/boxes/b1")).json()
            assert box["epoch"] == "gen-0"
            assert box["warmup"] == "done"
            assert [p["phase"] for p in box["phases"]][-1] == "prefixes"
            assert [(p["agents"], p["state"]) for p in box["prefixes"]] == [(["sales"], "warm")]
            assert box["time_to_ready"]["engine_seconds"] > 0
            listed = (await client.get("/v1/boxes")).json()["boxes"]
            assert [b["id"] for b in listed] == ["b1", "b2"]
            routes = (await client.get("/v1/routes")).json()["routes"]
            assert sorted(r["box_id"] for r in routes["sales"]["routes"]) == ["b1", "b2"]
        await w.store.close()

    asyncio.run(scenario())


def test_long_prefill_prompt_is_sized_with_the_engine_tokenizer_and_never_exceeds_it(store_url: str) -> None:
    async def scenario() -> None:
        store = SqlStore.from_url(store_url)
        (box,) = boxes("b1")
        for space_tokens in (1, 3):
            engine = FakeEngine(["b1"], space_tokens=space_tokens)
            runner = RestartWarmup(engine, store, FakeClock())
            prompt = await runner.long_prompt(box, 4000)
            tokens = len(await engine.tokenize(box, prompt))
            assert 0.97 * 4000 <= tokens <= 4000
        await store.close()

    asyncio.run(scenario())


def test_burst_levels_rise_to_the_slot_count() -> None:
    recipe = RestartRecipe(burst_levels=(1, 4, 16))
    assert burst_levels(recipe, 2) == (1, 2)
    assert burst_levels(recipe, 8) == (1, 4, 8)
    assert burst_levels(recipe, 32) == (1, 4, 16, 32)
    assert burst_levels(RestartRecipe(burst_levels=()), 4) == ()


class BlinkingStore(SqlStore):
    """A real store whose database is unreachable for the next `outages` reads of the warm records."""

    outages = 0

    async def list_warm(self, *, box_id: str | None = None, epoch: str | None = None) -> list[WarmRecord]:
        if self.outages > 0:
            self.outages -= 1
            raise StoreUnavailable("database unreachable (simulated blip)")
        return await super().list_warm(box_id=box_id, epoch=epoch)


def test_a_database_blip_fails_one_tick_and_the_loop_carries_on(store_url: str) -> None:
    async def scenario() -> None:
        w = world(store_url, store_class=BlinkingStore)
        blinking = w.store
        assert isinstance(blinking, BlinkingStore)
        blinking.outages = 2  # every part of the reconciler writes through this store
        stopping = asyncio.Event()
        loop = asyncio.create_task(w.reconciler.run(stopping))
        for _ in range(200):  # bounded: poke until the outage is over and the boxes are warm
            if sorted(route_boxes(w.reconciler, "sales")) == ["b1", "b2"]:
                break
            assert not loop.done(), "the reconcile loop died on a database blip"
            w.reconciler.poke()
            await asyncio.sleep(0.01)
            await w.reconciler.wait_idle()
        assert blinking.outages == 0
        assert sorted(route_boxes(w.reconciler, "sales")) == ["b1", "b2"]
        stopping.set()
        await asyncio.wait_for(loop, timeout=10)
        await w.store.close()

    asyncio.run(scenario())


class DownStore(SqlStore):
    """A real store whose database refuses every call while `down` is True, as SqlStore says it
    (StoreUnavailable), for every part of the reconciler (restart warm-up, staging, records)."""

    down = False

    async def _run(self, work: Callable[[Session], T], *, write: bool) -> T:
        if self.down:
            raise StoreUnavailable("database unreachable (simulated outage)")
        return await super()._run(work, write=write)


def down_world(store_url: str) -> tuple[World, DownStore]:
    w = world(store_url, store_class=DownStore)
    assert isinstance(w.store, DownStore)
    return w, w.store


def test_an_engine_restart_during_a_database_outage_leaves_readiness_at_once(store_url: str) -> None:
    async def scenario() -> None:
        w, store = down_world(store_url)
        w.engine.boxes["b1"].holds, w.engine.boxes["b1"].pinnable = 2, True  # llama.cpp-like slots: pins
        await settle(w.reconciler)
        status = StatusService(w.reconciler, w.store)
        assert sorted(route_boxes(w.reconciler, "sales")) == ["b1", "b2"]
        ready = await status.ready("b1")
        assert ready is not None
        assert ready.ready
        assert [k[:2] for k in w.reconciler._book.pins if k[0] == "b1"] == [("b1", "gen-0")]

        store.down = True
        w.engine.restart("b1")
        for _ in range(3):  # every pass fails on the store, and the restarted box stays out meanwhile
            with pytest.raises(StoreUnavailable):
                await w.reconciler.tick()
            await w.reconciler.wait_idle()
            assert route_boxes(w.reconciler, "sales") == ["b2"]
            ready = await status.ready("b1")
            assert ready is not None
            assert not ready.ready
            assert w.reconciler.ready_box_ids() == {"b2"}
            answer = await w.reconciler.ensure_warm("sales")
            assert answer.box_id != "b1" or not answer.routed
            snapshot = w.reconciler.snapshot()
            assert snapshot.live["b1"].epoch == "gen-1"
            assert [k for k in snapshot.records if k[0] == "b1"] == []
            assert [k for k in w.reconciler._book.pins if k[0] == "b1"] == []

        store.down = False
        assert await w.store.current_epoch("b1") == "gen-0"  # nothing reached the store during the outage
        await settle(w.reconciler)
        assert await w.store.current_epoch("b1") == "gen-1"
        assert await w.store.list_warm(box_id="b1", epoch="gen-0") == []
        epochs = [e for e in await w.store.events(box_id="b1", limit=500) if e.kind == "epoch_changed"]
        assert [e.epoch for e in reversed(epochs)] == ["gen-0", "gen-1"]
        assert sorted(route_boxes(w.reconciler, "sales")) == ["b1", "b2"]
        phases = await w.store.list_phases("b1", "gen-1")
        assert [p.phase for p in phases][-1] is PhaseName.PREFIXES
        assert all(p.ok for p in phases)
        await w.store.close()

    asyncio.run(scenario())


def test_a_box_down_during_a_database_outage_leaves_routes_and_its_events_are_stored_after(
    store_url: str,
) -> None:
    async def scenario() -> None:
        w, store = down_world(store_url)
        await settle(w.reconciler)
        store.down = True
        w.engine.boxes["b1"].healthy = False
        with pytest.raises(StoreUnavailable):
            await w.reconciler.tick()
        assert route_boxes(w.reconciler, "sales") == ["b2"]
        w.engine.boxes["b1"].healthy = True
        w.clock.t += 1.0
        with pytest.raises(StoreUnavailable):
            await w.reconciler.tick()

        store.down = False
        await settle(w.reconciler)
        kinds = [e.kind for e in reversed(await w.store.events(box_id="b1", limit=500))]
        assert [k for k in kinds if k in ("box_unhealthy", "box_healthy")] == ["box_unhealthy", "box_healthy"]
        assert sorted(route_boxes(w.reconciler, "sales")) == ["b1", "b2"]
        await w.store.close()

    asyncio.run(scenario())


def test_a_box_removed_before_its_outage_writes_landed_does_not_block_later_passes(store_url: str) -> None:
    async def scenario() -> None:
        w, store = down_world(store_url)
        await settle(w.reconciler)
        store.down = True
        w.engine.restart("b1")
        with pytest.raises(StoreUnavailable):
            await w.reconciler.tick()
        store.down = False
        await w.reconciler.remove_box("b1")  # its box row goes before its new epoch was written
        await settle(w.reconciler)  # raises if a pass keeps failing on the removed box's epoch
        assert route_boxes(w.reconciler, "sales") == ["b2"]
        assert await w.store.current_epoch("b2") == "gen-0"
        await w.store.close()

    asyncio.run(scenario())


def test_per_box_ready_and_per_agent_warm_gauges_follow_the_loop(store_url: str) -> None:
    registry = CollectorRegistry()
    observer = ReconcileMetrics(registry)

    def gauge(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    async def scenario() -> None:
        w = world(store_url, observer=observer)
        await settle(w.reconciler)
        for box_id in ("b1", "b2"):
            assert gauge("warmer_box_ready", box=box_id) == 1
            assert gauge("warmer_box_agent_warm", box=box_id, agent="sales") == 1
            sent = gauge("warmer_warm_prompt_tokens_total", box=box_id)
            assert sent is not None
            assert sent >= len(w.engine.warms(box_id)) > 0

        w.engine.restart("b1")
        await w.reconciler.tick()
        assert gauge("warmer_box_ready", box="b1") == 0
        # b1 warms up its new process outside placement: the agent is not kept warm there, no series
        assert gauge("warmer_box_agent_warm", box="b1", agent="sales") is None
        await settle(w.reconciler)
        assert gauge("warmer_box_agent_warm", box="b1", agent="sales") == 1  # back once warmed up
        assert gauge("warmer_box_ready", box="b2") == 1
        await w.store.close()

    asyncio.run(scenario())


def test_a_box_is_never_given_more_prefixes_than_its_engine_says_it_holds(store_url: str) -> None:
    """Six agents wanting two boxes each on three boxes whose engines hold two prompts each (llama.cpp
    with two slots): every agent is warm on one box, and everything routed is really in the engine's cache
    (12 prefixes on 6 slots would evict what was just verified, and the routes would lie)."""

    async def scenario() -> None:
        names = [f"a{i}" for i in range(6)]
        engine = FakeEngine(["b1", "b2", "b3"])
        for box in engine.boxes.values():
            box.holds = 2
        w = world(store_url, ("b1", "b2", "b3"), names, engine=engine, min_group=2)
        await settle(w.reconciler)
        snapshot = w.reconciler.snapshot()
        routed = {agent: route_boxes(w.reconciler, agent) for agent in names}
        assert all(len(boxes_) == 1 for boxes_ in routed.values()), routed
        for agent, (box_id,) in routed.items():
            prefix = snapshot.prefixes[agent].prefix
            assert prefix.token_ids in engine.boxes[box_id].cache, f"{agent} routed to {box_id}, not held"
        per_box = [sum(1 for group in routed.values() if b in group) for b in ("b1", "b2", "b3")]
        assert per_box == [2, 2, 2]
        assert w.reconciler.ready_box_ids() == {"b1", "b2", "b3"}

    asyncio.run(scenario())


def test_a_draining_box_serves_its_agent_until_the_agent_is_warm_elsewhere(store_url: str) -> None:
    """rollout.started on the only box of an agent: the agent is warmed on another box first, and the
    draining box keeps its route until then, so no call is sent to a cold box while a warm one exists."""

    async def scenario() -> None:
        w = world(store_url, ("b1", "b2"), min_group=1)
        await settle(w.reconciler)
        (home,) = route_boxes(w.reconciler, "sales")
        other = "b2" if home == "b1" else "b1"
        w.engine.gate = asyncio.Event()  # hold the warm on the other box in flight
        w.reconciler.drain_boxes([home], "rollout roll-1")
        await w.reconciler.tick()
        assert not w.engine.warms(other)  # the gate holds the warm there
        assert route_boxes(w.reconciler, "sales") == [home]  # still serving: nothing warm elsewhere yet
        assert w.reconciler.drained_boxes() == frozenset()
        w.engine.gate.set()
        await settle(w.reconciler)
        assert route_boxes(w.reconciler, "sales") == [other]
        assert w.reconciler.drained_boxes() == {home}
        assert w.reconciler.ready_box_ids() == {other}

    asyncio.run(scenario())


def test_a_box_that_goes_down_hands_its_agents_to_the_fleet_where_they_stay_warm(store_url: str) -> None:
    """Its agent is warmed on a stand-in at once; when the box returns the agent stays where it is warm
    (moving back would cost a warm and a cold box), and the returned box is free for others."""

    async def scenario() -> None:
        w = world(store_url, ("b1", "b2"), min_group=1)
        await settle(w.reconciler)
        (home,) = route_boxes(w.reconciler, "sales")
        other = "b2" if home == "b1" else "b1"
        w.engine.boxes[home].healthy = False
        await settle(w.reconciler)
        assert route_boxes(w.reconciler, "sales") == [other]  # warmed there, not left without a route
        warms_on_home = len(w.engine.warms(home))
        w.engine.boxes[home].healthy = True
        w.engine.restart(home)
        await settle(w.reconciler)
        assert route_boxes(w.reconciler, "sales") == [other]  # the mapping stays where the cache is warm
        assert len(w.engine.warms(home)) == warms_on_home  # nothing moved back
        assert w.reconciler.ready_box_ids() == {"b1", "b2"}

    asyncio.run(scenario())


def test_an_agent_that_fits_nowhere_warm_gets_a_cold_box_named_not_a_refusal(store_url: str) -> None:
    """With lending off (`dialer.precall_lend_seconds = 0`); with it on, see test_precall_lending."""

    async def scenario() -> None:
        engine = FakeEngine(["b1"])
        engine.boxes["b1"].holds = 1
        w = world(store_url, ("b1",), ("a1", "a2"), engine=engine, min_group=1, lend_seconds=0.0)
        await settle(w.reconciler)
        placed = [a for a in ("a1", "a2") if route_boxes(w.reconciler, a)]
        assert len(placed) == 1  # one prompt fits: the other agent is not warmed over it
        (left_out,) = {"a1", "a2"} - set(placed)
        answer = await w.reconciler.ensure_warm(left_out, wait_seconds=0.0)
        assert (answer.box_id, answer.state, answer.routed) == ("b1", WarmState.COLD, False)
        assert "cold" in answer.detail
        await settle(w.reconciler)
        assert route_boxes(w.reconciler, placed[0]) == ["b1"]  # the warm agent kept its box
        assert not w.engine.warms("b1")[1:]  # one warm in all: nothing thrashes the single prompt

    asyncio.run(scenario())


def test_on_pinnable_slots_each_prefix_gets_a_slot_of_its_own_and_keeps_it(store_url: str) -> None:
    """llama.cpp keeps one prompt per slot and runs a request in the slot it names: two agents on a
    two-slot box are warmed into different slots, and warmer's later requests for a prefix (probes after a
    daemon restart here) name the same slot, so they never evict the neighbour."""

    async def scenario() -> None:
        engine = FakeEngine(["b1"])
        engine.boxes["b1"].holds = 2
        engine.boxes["b1"].pinnable = True
        w = world(store_url, ("b1",), ("a1", "a2"), engine=engine, min_group=1)
        await settle(w.reconciler)
        warm_slots = {slot for box, kind, slot in engine.slots_named if kind == "warm"}
        assert warm_slots == {0, 1}
        pinned = {agent: w.reconciler.prefix_slot(agent, "b1") for agent in ("a1", "a2")}
        assert set(pinned.values()) == {0, 1}
        # every request of one warm (the warm and its verification) ran in the warm's slot
        per_slot = Counter(slot for _, _, slot in engine.slots_named)
        assert set(per_slot) == {0, 1}
        engine.slots_named.clear()
        await w.reconciler.wait_idle()
        w.reconciler.set_suspect("b1", True)  # probes of both prefixes
        w.clock.t += 120.0
        await settle(w.reconciler)
        probes = [(kind, slot) for _, kind, slot in engine.slots_named if kind == "probe"]
        assert sorted(slot for _, slot in probes) == [0, 1]
        assert {agent: w.reconciler.prefix_slot(agent, "b1") for agent in ("a1", "a2")} == pinned

    asyncio.run(scenario())


def test_a_recheck_between_polls_takes_a_restarted_box_out_of_the_routes_at_once(store_url: str) -> None:
    """A retried pre-call ask rechecks the box it was given: a restart quicker than a poll interval is a
    new epoch before the answer, so the cold new process is not answered as the warm old one."""

    async def scenario() -> None:
        w = world(store_url, ("b1", "b2"), min_group=1)
        await settle(w.reconciler)
        (home,) = route_boxes(w.reconciler, "sales")
        await w.reconciler.recheck_box(home)  # nothing changed
        assert route_boxes(w.reconciler, "sales") == [home]
        w.engine.restart(home)  # healthy again before any poll saw it down
        assert route_boxes(w.reconciler, "sales") == [home]  # the loop has not looked yet
        await w.reconciler.recheck_box(home)
        assert route_boxes(w.reconciler, "sales") == []  # no tick in between
        await settle(w.reconciler)
        assert route_boxes(w.reconciler, "sales")  # and it is served warm again after a pass

    asyncio.run(scenario())


def test_a_pre_call_ask_for_a_warm_agent_does_not_wake_the_loop(store_url: str) -> None:
    """A pass per ask is CPU spent on every call, on the machine the calls' engines may share; an agent
    that is routed warm needs none. A cold one does."""

    async def scenario() -> None:
        w = world(store_url, ("b1", "b2"), ("sales", "support"))
        await settle(w.reconciler)
        w.reconciler._wake.clear()
        answer = await w.reconciler.ensure_warm("sales", wait_seconds=0.0)
        assert answer.routed
        assert not w.reconciler._wake.is_set()
        w.engine.restart("b1")
        w.engine.restart("b2")
        await w.reconciler.tick()  # both boxes warming up again: nothing routed
        w.reconciler._wake.clear()
        cold = await w.reconciler.ensure_warm("support", wait_seconds=0.0)
        assert not cold.routed
        assert w.reconciler._wake.is_set()
        await w.reconciler.wait_idle()  # the warm the cold ask started

    asyncio.run(scenario())


def test_the_kept_placement_follows_a_box_removal_and_an_agent_change_as_a_full_place(store_url: str) -> None:
    """The reconciler edits one PlacementState across passes instead of placing from scratch; after each
    edit it equals `place` of the same inputs (the fleet as placement sees it, the routing before)."""
    volume: dict[str, float] = {}
    agents = ("sales", "support", "billing", "retention", "onboarding")
    w = world(
        store_url,
        box_ids=("b1", "b2", "b3", "b4", "b5", "b6"),
        agents=agents,
        demand=lambda: dict(volume),
        placement=PlacementConfig(min_group_size=2, max_group_size=4, calls_per_minute_per_box=10.0),
    )
    desired = w.reconciler._desired

    def full_place(previous: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        demands = [
            AgentDemand(a, "m", ref.tokens, calls_per_minute=volume.get(a, 0.0), prefix_hash=ref.hash)
            for a, ref in sorted(w.reconciler._catalogue.refs().items())
        ]
        boxes = desired.placement_boxes()
        config = w.reconciler._config.placement
        return dict(
            place(boxes, demands, config, eligible=desired._eligible_boxes(), previous=previous).groups
        )

    async def scenario() -> None:
        await settle(w.reconciler)
        state = desired._state
        assert state is not None
        assert dict(state.placement().groups) == full_place(desired.routing)
        holder = next(a for a, group in state.placement().groups.items() if group)
        gone = state.placement().groups[holder][0]
        before = dict(desired.routing)
        await w.reconciler.remove_box(gone)
        await w.reconciler.tick()
        assert desired._state is state  # edited, not rebuilt
        groups = dict(state.placement().groups)
        assert all(gone not in group for group in groups.values())
        assert groups == full_place(before)
        await settle(w.reconciler)
        volume["support"] = 35.0  # a wider group for one agent (4 boxes at 10 calls/minute each)
        before = dict(desired.routing)
        await w.reconciler.tick()
        assert desired._state is state
        groups = dict(state.placement().groups)
        assert len(groups["support"]) == 4
        assert groups == full_place(before)
        await w.reconciler.wait_idle()

    asyncio.run(scenario())


def test_a_restarted_box_warmed_up_before_placement_looks_again_is_not_ready_with_nothing_warm(
    store_url: str,
) -> None:
    """Its agents went elsewhere while it restarted; once its restart warm-up is done and before the next
    pass places them back, nothing is assigned to it *yet*: that is not "needs nothing", so not ready
    (seen on a real fleet: 200 from /ready with 1 of 3,113 prefix tokens cached, for up to 3 s)."""

    async def scenario() -> None:
        w = world(store_url)
        await settle(w.reconciler)
        assert w.reconciler.ready_box_ids() == {"b1", "b2"}
        w.engine.restart("b1")
        await w.reconciler.tick()  # the new epoch: b1 leaves placement while it warms up
        await w.reconciler.wait_idle()  # ...and its restart warm-up finishes before the next pass
        assert w.reconciler.snapshot().live["b1"].warmup is WarmupStatus.DONE
        warms_before = len(w.engine.warms("b1"))
        ready = await StatusService(w.reconciler, w.store).ready("b1")
        assert ready is not None
        assert not ready.ready
        assert ready.reasons == ("waiting for placement",)
        assert "b1" not in w.reconciler.ready_box_ids()
        assert len(w.engine.warms("b1")) == warms_before  # indeed nothing of its prefix was sent there yet

        await settle(w.reconciler)  # placed again, its prefix warmed: ready for real
        assert w.reconciler.ready_box_ids() == {"b1", "b2"}
        assert routed_boxes(w.reconciler, "sales") == ["b1", "b2"]
        await w.store.close()

    asyncio.run(scenario())
