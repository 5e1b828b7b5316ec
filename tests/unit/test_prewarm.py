"""The pre-call ask: box choice by weight (stable per call id), state mapping, bounded waits, HTTP errors,
and coalescing: 1,000 concurrent asks for a cold agent through the HTTP route send exactly one warm per box
(counted by a fake engine at our EnginePort seam; the reconciler, store and API are real)."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from tests.unit.reconciler_fakes import FakeClock, routed_boxes, settle, world
from tests.unit.reconciler_fakes import boxes as box_specs
from warmer.api import ApiServices, Readiness, create_app
from warmer.core.model import BoxSpec, WarmState
from warmer.core.planner import PlannerConfig
from warmer.core.readiness import Route
from warmer.core.warm_budget import WarmBudget
from warmer.service.dialer.call_spread import CallVolumeMeter, pick_route
from warmer.service.dialer.prewarm import (
    PrewarmAnswer,
    PrewarmAsk,
    PrewarmService,
    PrewarmState,
    PrewarmUnavailable,
    ReconcilerBackend,
    UnknownPrewarmAgent,
)

TOKEN = "dialer-token"


@dataclass(frozen=True)
class Answer:
    box_id: str | None
    state: WarmState | None
    routed: bool
    prefix_hash: str | None = "abc"
    detail: str = ""
    routes: tuple[Route, ...] = ()
    slot: int | None = None


@dataclass
class FakeBackend:
    """A scripted reconciler: the answer to give, the routes, and what was asked."""

    answer: Answer
    routes: tuple[Route, ...] = ()
    boxes: dict[str, BoxSpec] = field(default_factory=lambda: {b.id: b for b in box_specs("b1", "b2", "b3")})
    asked: list[tuple[str, float]] = field(default_factory=list)
    clock: FakeClock | None = None
    takes_seconds: float = 0.0
    slots: dict[str, int] = field(default_factory=dict)
    rechecked: list[str] = field(default_factory=list)
    sent_to: list[tuple[str, str, int]] = field(default_factory=list)

    def knows(self, agent_id: str) -> bool:
        return agent_id == "sales"

    async def ensure_warm(self, agent_id: str, wait_seconds: float) -> Answer:
        self.asked.append((agent_id, wait_seconds))
        if self.clock is not None:
            self.clock.t += min(wait_seconds, self.takes_seconds)
        return self.answer

    def routes_for(self, agent_id: str) -> Sequence[Route]:
        return self.routes

    def box(self, box_id: str) -> BoxSpec | None:
        return self.boxes.get(box_id)

    def slot(self, agent_id: str, box_id: str) -> int | None:
        return self.slots.get(box_id)

    async def recheck(self, box_id: str) -> None:
        self.rechecked.append(box_id)

    def sent(self, agent_id: str, box_id: str, slot: int) -> None:
        self.sent_to.append((agent_id, box_id, slot))


def run(ask: Coroutine[Any, Any, PrewarmAnswer]) -> PrewarmAnswer:
    return asyncio.run(ask)


# -------------------------------------------------------------------------------------------- box choice


def test_pick_is_stable_per_call_and_follows_the_weights() -> None:
    routes = (Route("b1", 1.0), Route("b2", 1.0), Route("b3", 0.1))
    rng = random.Random(7)
    for call in range(50):
        first = pick_route(routes, f"call-{call}", rng)
        assert all(pick_route(routes, f"call-{call}", rng) == first for _ in range(3))
    by_call = Counter(pick_route(routes, f"call-{i}", rng).box_id for i in range(21_000))
    assert by_call["b3"] / 21_000 == pytest.approx(0.1 / 2.1, abs=0.01)  # the ramping box gets its slice
    assert by_call["b1"] / 21_000 == pytest.approx(1 / 2.1, abs=0.02)
    by_chance = Counter(pick_route(routes, None, rng).box_id for _ in range(21_000))
    assert by_chance["b3"] / 21_000 == pytest.approx(0.1 / 2.1, abs=0.01)
    # A box leaving moves only its own calls.
    without_b2 = (Route("b1", 1.0), Route("b3", 0.1))
    for i in range(2_000):
        before = pick_route(routes, f"call-{i}", rng).box_id
        if before != "b2":
            assert pick_route(without_b2, f"call-{i}", rng).box_id == before


def test_a_burst_of_asks_spreads_over_the_warm_boxes_by_load_and_each_call_keeps_its_box() -> None:
    """1,000 asks for a warm agent routed to three boxes: an even spread (the rendezvous pick alone lands
    by chance, ~±30 here), a ramping box its slice, retries stay put, and a box leaving the route moves only
    its own calls."""
    clock = FakeClock()
    backend = FakeBackend(
        Answer("b1", WarmState.WARM, True), routes=(Route("b1", 1.0), Route("b2", 1.0), Route("b3", 1.0))
    )
    service = PrewarmService(backend, clock)
    first = {f"c{i}": run(service.prewarm(PrewarmAsk("sales", call_id=f"c{i}"))).box_id for i in range(999)}
    spread = Counter(first.values())
    assert max(spread.values()) - min(spread.values()) <= 1
    assert all(run(service.prewarm(PrewarmAsk("sales", call_id=f"c{i}"))).box_id == first[f"c{i}"]
               for i in range(0, 999, 37))  # fmt: skip
    backend.routes = (Route("b1", 1.0), Route("b3", 1.0))
    moved = {c: run(service.prewarm(PrewarmAsk("sales", call_id=c))).box_id for c in list(first)[:300]}
    assert all(moved[c] == first[c] for c in moved if first[c] != "b2")
    assert {moved[c] for c in moved if first[c] == "b2"} <= {"b1", "b3"}
    clock.t += 60.0  # the window has passed: a ramping box gets its slice of new calls
    backend.routes = (Route("b1", 1.0), Route("b2", 0.1))
    ramp = Counter(run(service.prewarm(PrewarmAsk("sales", call_id=f"n{i}"))).box_id for i in range(220))
    assert ramp["b2"] == pytest.approx(20, abs=2)


def test_meter_counts_asks_per_agent_over_its_window() -> None:
    clock = FakeClock(1000.0)
    meter = CallVolumeMeter(clock, window_seconds=60.0)
    for _ in range(30):
        meter.add("sales")
    meter.add("sales", 30)
    clock.t += 30
    meter.add("support", 6)
    assert meter.calls_per_minute() == {"sales": 60.0, "support": 6.0}
    clock.t += 31
    assert meter.calls_per_minute() == {"support": 6.0}
    clock.t += 60
    assert meter.calls_per_minute() == {}


# ------------------------------------------------------------------------------------------- the service


def test_routed_answer_picks_by_weight_and_reports_warm_and_ready() -> None:
    backend = FakeBackend(
        Answer("b1", WarmState.WARM, True, detail="warm"), routes=(Route("b1", 1.0), Route("b2", 1.0))
    )
    service = PrewarmService(backend, FakeClock())
    answers = [run(service.prewarm(PrewarmAsk("sales", call_id=f"c{i}"))) for i in range(40)]
    assert {a.state for a in answers} == {PrewarmState.WARM}
    assert all(a.ready for a in answers)
    assert {a.box_id for a in answers} == {"b1", "b2"}  # spread by weight, not always the first route
    again = run(service.prewarm(PrewarmAsk("sales", call_id="c3")))
    assert again.box_id == answers[3].box_id  # a retry of one call gets the same box
    assert answers[0].base_url == backend.boxes[answers[0].box_id].base_url
    assert service.observed_demand() == {"sales": 40.0}  # the retry is not a new call
    assert backend.rechecked == [answers[3].box_id]  # but the box it had is looked at again first


def test_not_yet_warm_states_and_the_wait_cap() -> None:
    clock = FakeClock()
    for given, expected in [
        (WarmState.WARMING, PrewarmState.WARMING),
        (WarmState.COLD, PrewarmState.COLD),
        (None, PrewarmState.COLD),
        (WarmState.FAILED, PrewarmState.FAILED),
        (WarmState.EVICTED, PrewarmState.COLD),
        (WarmState.WARM, PrewarmState.WARM),  # verified, route switch pending
    ]:
        backend = FakeBackend(Answer("b2", given, False), clock=clock, takes_seconds=2.5)
        service = PrewarmService(backend, clock, max_wait_seconds=2.0)
        answer = run(service.prewarm(PrewarmAsk("sales", wait_seconds=30.0)))
        assert (answer.state, answer.ready, answer.box_id) == (expected, False, "b2")
        assert backend.asked == [("sales", 2.0)]  # the caller's 30 s capped at the operator's 2 s
        assert answer.waited_ms == 2000


def test_unknown_agent_and_no_box_are_typed_errors() -> None:
    service = PrewarmService(FakeBackend(Answer(None, None, False, detail="no warmed-up box")), FakeClock())
    with pytest.raises(UnknownPrewarmAgent):
        run(service.prewarm(PrewarmAsk("nobody")))
    with pytest.raises(PrewarmUnavailable, match="no warmed-up box"):
        run(service.prewarm(PrewarmAsk("sales")))


# ----------------------------------------------------------------------------------------------- HTTP


def client_for(services: ApiServices) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(services)),
        base_url="http://warmer.test",
        headers={"authorization": f"Bearer {TOKEN}"},
    )


def api_services(prewarm: PrewarmService) -> ApiServices:
    async def ready() -> Readiness:
        return Readiness(True)

    return ApiServices(
        registry=CollectorRegistry(), readiness=ready, tokens=(SecretStr(TOKEN),), prewarm=prewarm
    )


def test_http_errors_name_the_field_or_reason() -> None:
    async def scenario() -> None:
        backend = FakeBackend(Answer(None, None, False, detail="no warmed-up box in its group"))
        async with client_for(api_services(PrewarmService(backend, FakeClock()))) as client:
            for body, field in [
                ({}, "agent"),
                ({"agent": ""}, "agent"),
                ({"agent": "sales", "wait_ms": -1}, "wait_ms"),
                ({"agent": "sales", "wait_ms": "soon"}, "wait_ms"),
                ({"agent": "sales", "expected_calls": -3}, "expected_calls"),
                ({"agent": "sales", "call_id": 12}, "call_id"),
                ({"agent": "sales", "box": "b1"}, "box"),
                ([1, 2], "body"),
            ]:
                response = await client.post("/v1/prewarm", json=body)
                assert response.status_code == 422, body
                assert response.json()["field"] == field, (body, response.json())
            assert backend.asked == []  # nothing was asked of the reconciler
            unknown = await client.post("/v1/prewarm", json={"agent": "nobody"})
            assert unknown.status_code == 404
            assert "unknown agent 'nobody'" in unknown.json()["reason"]
            no_box = await client.post("/v1/prewarm", json={"agent": "sales"})
            assert no_box.status_code == 503
            assert no_box.json()["reason"] == "no warmed-up box in its group"
            assert no_box.headers["retry-after"] == "1"
            anonymous = await client.post(
                "/v1/prewarm", json={"agent": "sales"}, headers={"authorization": ""}
            )
            assert anonymous.status_code == 401
            schema = (await client.get("/openapi.json")).json()
            assert (
                "agent"
                in schema["paths"]["/v1/prewarm"]["post"]["requestBody"]["content"]["application/json"][
                    "schema"
                ]["properties"]
            )

    asyncio.run(scenario())


# --------------------------------------------------------------------- coalescing with the real reconciler


def test_a_burst_of_1000_asks_for_a_cold_agent_sends_exactly_one_warm_per_box(store_url: str) -> None:
    planner = PlannerConfig(
        budget=WarmBudget(max_concurrent=2, tokens_per_second=1e6), retire_idle_after_seconds=60.0
    )

    async def scenario() -> None:
        w = world(store_url, box_ids=("b1", "b2", "b3"), planner=planner)
        service = PrewarmService(ReconcilerBackend(w.reconciler), w.clock, max_wait_seconds=10.0)
        await settle(w.reconciler)  # restart warm-ups done; the new agent warmed once
        w.clock.t += 120.0
        await settle(w.reconciler)  # idle: released
        for box_id in ("b1", "b2", "b3"):
            w.engine.restart(box_id)  # new epochs, empty caches: the agent is cold everywhere
        await settle(w.reconciler)
        assert routed_boxes(w.reconciler, "sales") == []
        group = w.reconciler.snapshot().desired.assignment["sales"]  # type: ignore[union-attr]
        before = Counter(w.engine.warm_requests)

        w.engine.gate = asyncio.Event()  # hold the warms until every ask is in
        stopping = asyncio.Event()
        loop = asyncio.create_task(w.reconciler.run(stopping))
        async with client_for(api_services(service)) as client:
            asks = [
                asyncio.create_task(
                    client.post(
                        "/v1/prewarm", json={"agent": "sales", "call_id": f"call-{i}", "wait_ms": 10_000}
                    )
                )
                for i in range(1000)
            ]
            for _ in range(200):
                await asyncio.sleep(0)
            w.engine.gate.set()
            responses = await asyncio.gather(*asks)
            # The held pre-call demand has the loop warm the rest of the group: let it finish before counting.
            for _ in range(3):
                w.reconciler.poke()
                await asyncio.wait_for(w.reconciler.wait_changed(), 30)
            await w.reconciler.wait_idle()
        stopping.set()
        await loop

        assert {r.status_code for r in responses} == {200}
        bodies = [r.json() for r in responses]
        assert {b["state"] for b in bodies} == {"warm"}
        assert {b["ready"] for b in bodies} == {True}
        sent = Counter(w.engine.warm_requests)
        sent.subtract(before)
        assert {box: sent[box] for box in group} == {box: 1 for box in group}  # one warm per box
        assert sum(sent.values()) == len(group)
        by_call = {b["box_id"] for b in bodies}
        assert by_call <= set(group)
        assert service.observed_demand()["sales"] == pytest.approx(1000.0)
        await w.store.close()

    asyncio.run(scenario())


def test_a_routed_answer_names_the_slot_holding_the_prefix_where_slots_are_pinned() -> None:
    backend = FakeBackend(Answer("b1", WarmState.WARM, True), routes=(Route("b1", 1.0),), slots={"b1": 1})
    answer = run(PrewarmService(backend, FakeClock()).prewarm(PrewarmAsk("sales", call_id="c1")))
    assert (answer.box_id, answer.slot, answer.as_json()["slot"]) == ("b1", 1, 1)
    cold = FakeBackend(Answer("b1", WarmState.COLD, False), slots={"b1": 1})
    assert run(PrewarmService(cold, FakeClock()).prewarm(PrewarmAsk("sales"))).slot is None  # not ready
    # warming into a slot reserved for it (room lent just in time): the call may queue behind the warm there
    warming = FakeBackend(Answer("b1", WarmState.WARMING, False, slot=0), slots={"b1": 1})
    answer = run(PrewarmService(warming, FakeClock()).prewarm(PrewarmAsk("sales")))
    assert (answer.ready, answer.slot, answer.as_json()["slot"]) == (False, 0, 0)
    # every slot an answer names is told to the reconciler: that call's turns land there for a while
    assert (backend.sent_to, cold.sent_to, warming.sent_to) == (
        [("sales", "b1", 1)],
        [],
        [("sales", "b1", 0)],
    )


def test_a_routed_answer_is_picked_from_the_routes_the_reconciler_answered_with() -> None:
    """The reconciler's answer carries the routes it found (including a box of the group verified warm
    since the last pass); the pick uses them instead of asking for the routes again."""
    answer = Answer("b2", WarmState.WARM, True, routes=(Route("b2", 1.0),))
    backend = FakeBackend(answer, routes=(Route("b1", 1.0),))
    picked = {run(PrewarmService(backend, FakeClock()).prewarm(PrewarmAsk("sales", call_id=f"c{i}"))).box_id
              for i in range(20)}  # fmt: skip
    assert picked == {"b2"}
