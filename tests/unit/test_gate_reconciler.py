"""The admission gate over the real reconciler (fake engine, fake clock, SQLite store): a fleet that cannot
warm is let back in box by box and within the bound, loudly; a warmer restart does not pull serving
engines; `/v1/boxes/{id}/admit` answers what probes act on while `/ready` stays the truth."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from tests.unit.reconciler_fakes import FakeClock, FakeEngine, settle, world
from warmer.api import ApiServices, Readiness, create_app
from warmer.core.event_kinds import EventKind
from warmer.core.gate import GateConfig
from warmer.core.model import CompletionReport
from warmer.core.planner import PlannerConfig
from warmer.core.warm_budget import WarmBudget
from warmer.root.metrics import ReconcileMetrics
from warmer.service.status import AdmitView, StatusService

GATE = GateConfig(max_hold_seconds=120.0, max_held_share=0.5)


async def _ok() -> Readiness:
    return Readiness(True)


class NeverCached(FakeEngine):
    """An engine that never reports a cached token: no warm is ever verified."""

    async def complete_prefix(self, *args: Any, **kwargs: Any) -> CompletionReport:
        return dataclasses.replace(await super().complete_prefix(*args, **kwargs), cached_tokens=0)


def test_a_fleet_that_never_verifies_is_let_in_box_by_box_then_all_after_the_bound(store_url: str) -> None:
    registry = CollectorRegistry()

    def released(box_id: str, rule: str) -> float | None:
        return registry.get_sample_value("warmer_box_gate_released", {"box": box_id, "rule": rule})

    async def scenario() -> None:
        clock = FakeClock()
        engine = NeverCached(["b1", "b2", "b3", "b4"])
        w = world(
            store_url, ("b1", "b2", "b3", "b4"), engine=engine, clock=clock, gate=GATE, min_group=4,
            observer=ReconcileMetrics(registry),
        )  # fmt: skip
        status = StatusService(w.reconciler, w.store)
        app = create_app(ApiServices(registry=CollectorRegistry(), readiness=_ok, status=status))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://w") as client:
            await settle(w.reconciler)
            assert w.reconciler.ready_box_ids() == set()  # nothing verifies: the truth says so
            admits = {b: await client.get(f"/v1/boxes/{b}/admit") for b in ("b1", "b2", "b3", "b4")}
            let_in = {b for b, r in admits.items() if r.status_code == 200}
            assert len(let_in) == 2  # never the whole model held out: half may be
            for box_id in let_in:
                body = admits[box_id].json()
                assert (body["admit"], body["ready"], body["release"]) == (True, False, "share")
                assert released(box_id, "share") == 1
                ready = await client.get(f"/v1/boxes/{box_id}/ready")
                assert ready.status_code == 503  # let in is never called ready
            held = next(b for b in admits if b not in let_in)
            assert admits[held].status_code == 503
            assert admits[held].json()["reasons"]  # why it is not ready

            clock.t += GATE.max_hold_seconds + 1
            await settle(w.reconciler)
            for box_id in ("b1", "b2", "b3", "b4"):
                response = await client.get(f"/v1/boxes/{box_id}/admit")
                assert response.status_code == 200
                assert response.json()["release"] in ("share", "held_too_long")
            assert released(held, "held_too_long") == 1
        events = [e for e in await w.store.events(limit=1000) if e.kind == EventKind.GATE_RELEASED]
        assert {e.box_id for e in events} == {"b1", "b2", "b3", "b4"}
        assert len(events) == 4 + 2  # one per release rule a box went through, not one per pass
        await w.store.close()

    asyncio.run(scenario())


def test_a_box_ready_once_stays_admitted_when_its_prefix_falls_cold_and_ready_says_the_truth(
    store_url: str,
) -> None:
    """An eviction on a serving box is warmer's to repair, not a reason to pull the engine from its
    Service: the gate latches open for the epoch; `/ready` still says not ready until it is re-warmed."""

    async def scenario() -> None:
        planner = PlannerConfig(
            budget=WarmBudget(max_concurrent=2, tokens_per_second=1e6),
            retire_idle_after_seconds=None,
            probe_min_interval_seconds=60.0,
        )
        w = world(store_url, gate=GATE, planner=planner)
        await settle(w.reconciler)
        status = StatusService(w.reconciler, w.store)
        assert (await status.admit("b1")) == AdmitView("b1", True, True, "ready", None, ())
        w.engine.boxes["b1"].cache.clear()  # the engine evicted the prefix
        w.reconciler.set_suspect("b1", True)
        w.clock.t += 61.0
        await w.reconciler.tick()
        await w.reconciler.wait_idle()  # the probe reads cold: evicted, out of the routes
        await w.reconciler.tick()  # ...and the pass that follows notes the gate
        assert "b1" not in (w.reconciler.ready_box_ids() or set())
        answer = await status.admit("b1")
        assert answer is not None
        assert (answer.admit, answer.ready, answer.release) == (True, False, "latched")
        assert answer.reasons
        assert (await status.ready("b1")).ready is False  # type: ignore[union-attr]
        assert (await status.admit("nope")) is None
        await w.reconciler.wait_idle()  # the re-warm the last pass started
        await w.store.close()

    asyncio.run(scenario())


def test_a_restarted_engine_is_held_until_ready_while_its_sibling_serves(store_url: str) -> None:
    async def scenario() -> None:
        w = world(store_url, gate=GATE)
        await settle(w.reconciler)
        w.engine.restart("b1")
        await w.reconciler.tick()
        status = StatusService(w.reconciler, w.store)
        answer = await status.admit("b1")
        assert answer is not None
        assert not answer.admit  # a new epoch: the latch of the old one does not carry over
        await settle(w.reconciler)
        answer = await status.admit("b1")
        assert answer is not None
        assert (answer.admit, answer.ready) == (True, True)
        await w.store.close()

    asyncio.run(scenario())
