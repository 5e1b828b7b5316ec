"""Side requests (a dialer's requests that are no agent's call: a summary, a classifier) ask warmer for a
slot first, so what they overwrite is known: the pure choice, the book's rule, the real Reconciler over the
fake engine (its cache is the truth every "ready" answer is checked against) and the HTTP route."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from tests.unit.reconciler_fakes import FakeClock, FakeEngine, World, route_boxes, settle, world
from tests.unit.test_precall_lending import held_ids, prefix_ids
from warmer.api import ApiServices, Readiness, create_app
from warmer.core.model import WarmRecord, WarmState
from warmer.core.placement.loans import side_slot
from warmer.service.dialer.prewarm import PrewarmService, ReconcilerBackend
from warmer.service.reconciler.records import WarmBook

TOKEN = "side-token"


# ------------------------------------------------------------------------------------------- the choice


def test_a_free_slot_is_lent_first_then_the_least_valuable_prefix_and_a_slot_in_a_call_last() -> None:
    values = {"hot": 10.0, "cool": 1.0, "warmish": 5.0}
    value = values.__getitem__
    assert side_slot(3, {0: "hot", 2: "cool"}, value, ()) == (1, None)  # evicts nothing
    assert side_slot(3, {0: "hot", 1: "warmish", 2: "cool"}, value, ()) == (2, "cool")
    # a slot a call may still be sending turns to goes last, whatever its prefix is worth
    assert side_slot(3, {0: "hot", 1: "warmish", 2: "cool"}, value, (), in_call={2}) == (1, "warmish")
    assert side_slot(2, {0: "hot", 1: "cool"}, value, (), in_call={0, 1}) == (1, "cool")
    assert side_slot(2, {0: "hot", 1: "cool"}, value, {1}) == (0, "hot")  # protected: never
    assert side_slot(2, {0: "hot", 1: "cool"}, value, {0, 1}) is None
    assert side_slot(0, {}, value, ()) is None


def test_a_prefix_whose_slot_was_lent_is_at_risk_until_verified_after_the_lend() -> None:
    book = WarmBook(store=None)  # type: ignore[arg-type]  # the rule reads only the book's own maps
    key = ("b1", "e1", "p1")
    book.records[key] = WarmRecord(
        box_id="b1",
        epoch="e1",
        prefix_hash="p1",
        state=WarmState.WARM,
        prefix_tokens=500,
        updated_at=100.0,
        verified_at=100.0,
    )
    book.keep_pin(key, 1)
    assert not book.at_risk(key, 200.0, hold=60.0)
    book.note_side_use("b1", "e1", 0, 150.0)  # another slot: no matter
    assert not book.at_risk(key, 200.0, hold=60.0)
    book.note_side_use("b1", "e1", 1, 150.0)
    assert book.at_risk(key, 200.0, hold=60.0)
    assert book.at_risk(key, 10_000.0, hold=60.0)  # time alone does not clear it
    book.records[key] = dataclasses.replace(book.records[key], updated_at=160.0, verified_at=160.0)
    assert not book.at_risk(key, 200.0, hold=60.0)
    book.note_side_use("b1", "e1", 1, 170.0)
    book.keep_only_epochs({"b1": "e2"})  # a restart: the old process's lends go with it
    assert book.side_uses == {}


# ------------------------------------------------------------------------------ the reconciler, for real


def slotted_world(store_url: str) -> World:
    """One llama.cpp-like box of two slots that requests may name, two agents warm there."""
    engine = FakeEngine(["b1"])
    engine.boxes["b1"].holds = 2
    engine.boxes["b1"].pinnable = True
    volume = {"hot": 10.0, "cool": 1.0}
    return world(store_url, ("b1",), tuple(volume), engine=engine, min_group=1, demand=lambda: volume)


async def settled(store_url: str) -> tuple[World, int, int]:
    """`slotted_world` after its first warms, past their answers' protection: (world, cool's slot, hot's)."""
    w = slotted_world(store_url)
    await settle(w.reconciler)
    cool_slot = w.reconciler.prefix_slot("cool", "b1")
    hot_slot = w.reconciler.prefix_slot("hot", "b1")
    assert cool_slot is not None
    assert hot_slot is not None
    assert cool_slot != hot_slot
    w.clock.t += 30.0
    return w, cool_slot, hot_slot


def side_request(engine: FakeEngine, box_id: str, slot: int) -> None:
    """The dialer's summary in the slot it was lent: whatever prefix the slot held is gone."""
    engine.boxes[box_id].use((9, 9, 9), slot)


def test_the_prefix_a_side_request_overwrites_is_never_answered_ready_while_the_engine_lacks_it(
    store_url: str,
) -> None:
    """Without the lend noted, the next ask for `cool` would be answered ready from its record while the
    engine no longer holds its prefix."""

    async def scenario() -> None:
        w, cool_slot, hot_slot = await settled(store_url)
        assert route_boxes(w.reconciler, "cool") == ["b1"]
        lent = await w.reconciler.side_slot("b1")
        assert (lent.slot, lent.evicts) == (cool_slot, "cool")  # the least valuable prefix gives way
        assert lent.slot is not None
        side_request(w.engine, "b1", lent.slot)
        assert prefix_ids("cool") not in held_ids(w.engine, "b1")

        answer = await w.reconciler.ensure_warm("cool", wait_seconds=5.0)
        if answer.routed:
            assert prefix_ids("cool") in held_ids(w.engine, "b1")  # a ready answer is true
        assert any(kind == "probe" and slot == cool_slot for _, kind, slot in w.engine.slots_named)
        hot = await w.reconciler.ensure_warm("hot", wait_seconds=5.0)
        assert hot.routed  # the other slot was not touched: still vouched for at once
        assert prefix_ids("hot") in held_ids(w.engine, "b1")
        assert w.reconciler.prefix_slot("hot", "b1") == hot_slot
        await settle(w.reconciler, rounds=3)  # and the victim is warm and routed again
        assert route_boxes(w.reconciler, "cool") == ["b1"]
        assert prefix_ids("cool") in held_ids(w.engine, "b1")

    asyncio.run(scenario())


def test_a_prefix_just_answered_ready_is_not_lent(store_url: str) -> None:
    async def scenario() -> None:
        w, _, hot_slot = await settled(store_url)
        assert (await w.reconciler.ensure_warm("cool", wait_seconds=0.0)).routed
        lent = await w.reconciler.side_slot("b1")  # cool's first turn is on its way: the busier slot goes
        assert (lent.slot, lent.evicts) == (hot_slot, "hot")
        await settle(w.reconciler, rounds=3)

    asyncio.run(scenario())


def test_when_every_prefix_was_answered_within_the_window_one_answered_before_a_first_turn_gives_way(
    store_url: str,
) -> None:
    async def scenario() -> None:
        w, cool_slot, _ = await settled(store_url)
        assert (await w.reconciler.ensure_warm("hot", wait_seconds=0.0)).routed
        assert (await w.reconciler.ensure_warm("cool", wait_seconds=0.0)).routed
        w.clock.t += 0.5  # both first turns may be on their way: nothing to lend
        refused = await w.reconciler.side_slot("b1")
        assert (refused.slot, refused.evicts) == (None, None)
        asked = w.clock.monotonic()
        lent = await w.reconciler.side_slot("b1", wait_seconds=5.0)  # asked to wait: once past 2 s...
        assert (lent.slot, lent.evicts) == (cool_slot, "cool")  # ...the cheaper prefix gives its slot
        assert 1.5 < w.clock.monotonic() - asked < 2.0  # (on the fake clock: no real time passes)
        await settle(w.reconciler, rounds=3)

    asyncio.run(scenario())


def test_a_slot_a_call_is_sending_turns_to_is_lent_last(store_url: str) -> None:
    async def scenario() -> None:
        w, cool_slot, hot_slot = await settled(store_url)
        w.reconciler.note_call("cool", "b1", cool_slot)  # a call of cool's is sending its turns there
        lent = await w.reconciler.side_slot("b1")
        assert (lent.slot, lent.evicts) == (hot_slot, "hot")
        await settle(w.reconciler, rounds=3)

    asyncio.run(scenario())


def test_a_box_whose_requests_name_no_slot_gets_no_slot_and_nothing_is_noted(store_url: str) -> None:
    async def scenario() -> None:
        engine = FakeEngine(["b1"])
        engine.boxes["b1"].holds = 2
        w = world(store_url, ("b1",), ("hot", "cool"), engine=engine, min_group=1)
        await settle(w.reconciler)
        lent = await w.reconciler.side_slot("b1")
        assert (lent.slot, lent.evicts) == (None, None)
        assert w.reconciler.snapshot() is not None
        assert (await w.reconciler.ensure_warm("cool", wait_seconds=0.0)).routed

    asyncio.run(scenario())


# ----------------------------------------------------------------------------------------------- HTTP


def test_the_route_lends_a_slot_names_what_it_evicts_and_refuses_an_unknown_box(store_url: str) -> None:
    async def scenario() -> None:
        w, cool_slot, _ = await settled(store_url)
        prewarm = PrewarmService(ReconcilerBackend(w.reconciler), FakeClock())

        async def ready() -> Readiness:
            return Readiness(True)

        services = ApiServices(
            registry=CollectorRegistry(), readiness=ready, tokens=(SecretStr(TOKEN),), prewarm=prewarm
        )
        transport = httpx.ASGITransport(app=create_app(services))
        headers = {"authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://w", headers=headers) as client:
            answer = await client.post("/v1/boxes/b1/side-slot")
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["box_id"] == "b1"
            assert body["base_url"] == "http://b1:8080"
            assert (body["slot"], body["evicts"]) == (cool_slot, "cool")
            for bad in ("-1", "soon", "1.5", "600001"):
                refused = await client.post(f"/v1/boxes/b1/side-slot?wait_ms={bad}")
                assert refused.status_code == 422, bad
                assert refused.json()["field"] == "wait_ms"
            unknown = await client.post("/v1/boxes/nope/side-slot")
            assert unknown.status_code == 404
            assert unknown.json()["field"] == "box_id"
            anonymous = await client.post("/v1/boxes/b1/side-slot", headers={"authorization": ""})
            assert anonymous.status_code == 401
        await settle(w.reconciler, rounds=2)

    asyncio.run(scenario())
