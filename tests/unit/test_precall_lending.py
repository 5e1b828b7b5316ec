"""Crowded fleets: a pre-call ask for an agent no box keeps warm borrows room just in time.

The real Reconciler over the fake engine (its cache keeps `holds` prompts, least recently used out first),
so "warm" in an answer is checked against what the engine's cache really holds after the warm.
"""

from __future__ import annotations

import asyncio

from tests.unit.reconciler_fakes import FakeEngine, FakePrefixSource, World, agent, route_boxes, settle, world
from warmer.core.capacity import Shortfall, shortfall
from warmer.core.model import BoxSpec, EngineKind, WarmState
from warmer.core.placement import Handover
from warmer.core.placement.loans import LentBoxCaps, Loan, apply_loans, offer_loan, prefix_value
from warmer.service.reconciler import Reconciler
from warmer.service.reconciler.precall import FIRST_TURN_SECONDS


def one_box_world(store_url: str, volume: dict[str, float], *, pinnable: bool = False) -> World:
    """One box holding two prompts (slots that requests may name, when `pinnable`), the agents of
    `volume` at those calls per minute, one box each at most."""
    engine = FakeEngine(["b1"])
    engine.boxes["b1"].holds = 2
    engine.boxes["b1"].pinnable = pinnable
    return world(store_url, ("b1",), tuple(volume), engine=engine, min_group=1, demand=lambda: volume)


def missing(reconciler: Reconciler) -> Shortfall:
    desired = reconciler.snapshot().desired
    assert desired is not None
    return shortfall({a: ref.tokens for a, ref in desired.agents.items()}, desired.assignment)


def held_ids(engine: FakeEngine, box_id: str) -> set[tuple[int, ...]]:
    return set(engine.boxes[box_id].cache)


def prefix_ids(agent_id: str) -> tuple[int, ...]:
    ids = FakePrefixSource().compute(agent(agent_id)).prefix.token_ids
    assert ids is not None
    return ids


def test_a_tail_agent_borrows_the_coolest_room_and_its_ready_answer_is_true(store_url: str) -> None:
    """One box holding two prompts, three agents: placement keeps the two busiest; an ask for the third
    warms it at once in place of the cooler of the two, whose route there goes first; the hot one keeps
    its route and its prompt (the box evicts least recently used first and names no slots, so the keepers
    are touched before the borrower's warm: the prompt that goes is the victim's); while the loan runs
    nothing warms the victim back; when it ends placement takes the room back."""

    async def scenario() -> None:
        volume = {"hot": 10.0, "cool": 1.0, "tail": 0.5}
        w = one_box_world(store_url, volume)
        engine = w.engine
        await settle(w.reconciler)
        assert route_boxes(w.reconciler, "hot") == ["b1"]
        assert route_boxes(w.reconciler, "cool") == ["b1"]
        assert route_boxes(w.reconciler, "tail") == []
        assert missing(w.reconciler).agents_without_room == ("tail",)

        answer = await w.reconciler.ensure_warm("tail", wait_seconds=5.0)
        assert (answer.box_id, answer.state, answer.routed) == ("b1", WarmState.WARM, True)
        held = held_ids(engine, "b1")
        assert prefix_ids("tail") in held  # the answer is true: the engine holds the prefix
        assert prefix_ids("hot") in held  # the busiest agent was not the one to leave
        assert route_boxes(w.reconciler, "cool") == []  # the victim left its route before anything else
        assert route_boxes(w.reconciler, "hot") == ["b1"]

        warms_so_far = len(engine.warms("b1"))
        for _ in range(3):  # passes while the loan runs: the victim is not warmed back over the borrower
            w.clock.t += 10.0
            await settle(w.reconciler, rounds=2)
        assert len(engine.warms("b1")) == warms_so_far
        assert route_boxes(w.reconciler, "tail") == ["b1"]
        assert route_boxes(w.reconciler, "cool") == []
        assert prefix_ids("tail") in held_ids(engine, "b1")
        short = missing(w.reconciler)  # what /v1/capacity says: the victim is the one without room now
        assert (short.agents_without_room, short.tokens_without_room) == (("cool",), 500)

        w.clock.t += 61.0  # the loan ends: placement's choice comes back
        await settle(w.reconciler)
        assert route_boxes(w.reconciler, "cool") == ["b1"]
        assert route_boxes(w.reconciler, "hot") == ["b1"]
        assert route_boxes(w.reconciler, "tail") == []
        assert prefix_ids("cool") in held_ids(engine, "b1")

    asyncio.run(scenario())


def test_a_borrower_is_not_evicted_by_the_next_tail_ask_while_its_loan_runs(store_url: str) -> None:
    async def scenario() -> None:
        volume = {"hot": 10.0, "cool": 1.0, "t1": 0.5, "t2": 0.5}
        w = one_box_world(store_url, volume)
        engine = w.engine
        await settle(w.reconciler)
        first = await w.reconciler.ensure_warm("t1", wait_seconds=5.0)
        assert first.routed
        second = await w.reconciler.ensure_warm("t2", wait_seconds=5.0)
        # the only other room is the hot agent's: t2 takes it (the cheapest room left), t1 keeps its own
        assert second.routed
        assert second.box_id == "b1"
        held = held_ids(engine, "b1")
        assert prefix_ids("t1") in held
        assert prefix_ids("t2") in held
        await settle(w.reconciler, rounds=1)
        assert route_boxes(w.reconciler, "t1") == ["b1"]
        assert route_boxes(w.reconciler, "hot") == []  # and its route went before the warm
        third = await w.reconciler.ensure_warm("cool", wait_seconds=5.0)
        # every prefix on the box is a running loan's borrower now: nothing can leave, so cold and honest
        assert (third.state, third.routed) == (WarmState.COLD, False)
        assert prefix_ids("t1") in held_ids(engine, "b1")
        assert prefix_ids("t2") in held_ids(engine, "b1")
        await settle(w.reconciler, rounds=2)

    asyncio.run(scenario())


def test_on_pinnable_slots_the_borrower_is_warmed_in_the_victims_slot_and_the_answer_names_it(
    store_url: str,
) -> None:
    async def scenario() -> None:
        volume = {"hot": 10.0, "cool": 1.0, "tail": 0.5}
        w = one_box_world(store_url, volume, pinnable=True)
        engine = w.engine
        await settle(w.reconciler)
        cool_slot = w.reconciler.prefix_slot("cool", "b1")
        hot_slot = w.reconciler.prefix_slot("hot", "b1")
        assert {cool_slot, hot_slot} == {0, 1}
        engine.slots_named.clear()
        answer = await w.reconciler.ensure_warm("tail", wait_seconds=5.0)
        assert answer.routed
        assert {slot for _, kind, slot in engine.slots_named if kind == "warm"} == {cool_slot}
        assert w.reconciler.prefix_slot("tail", "b1") == cool_slot
        assert w.reconciler.prefix_slot("hot", "b1") == hot_slot
        assert w.reconciler.prefix_slot("cool", "b1") is None  # not vouched for: no call may name it
        await settle(w.reconciler, rounds=2)

    asyncio.run(scenario())


def test_an_ask_that_does_not_wait_is_answered_warming_with_the_reserved_slot(store_url: str) -> None:
    async def scenario() -> None:
        engine = FakeEngine(["b1"])
        engine.boxes["b1"].holds = 2
        engine.boxes["b1"].pinnable = True
        engine.gate = asyncio.Event()  # the warm is held: the answer comes while it is in flight
        volume = {"hot": 10.0, "cool": 1.0, "tail": 0.5}
        w = world(
            store_url, ("b1",), ("hot", "cool", "tail"), engine=engine, min_group=1, demand=lambda: volume
        )
        engine.gate.set()
        await settle(w.reconciler)
        cool_slot = w.reconciler.prefix_slot("cool", "b1")
        engine.gate.clear()
        answer = await w.reconciler.ensure_warm("tail", wait_seconds=0.0)
        assert (answer.box_id, answer.state, answer.routed) == ("b1", WarmState.WARMING, False)
        assert answer.slot == cool_slot  # the call queues behind the warm in that slot
        engine.gate.set()
        await w.reconciler.wait_idle()
        assert (await w.reconciler.ensure_warm("tail", wait_seconds=0.0)).routed
        await settle(w.reconciler, rounds=2)

    asyncio.run(scenario())


# ------------------------------------------------------------------------------------------- pure core


def _box(box_id: str, *, prefixes: int | None = None, tokens: int | None = None) -> BoxSpec:
    return BoxSpec(
        id=box_id,
        base_url=f"http://{box_id}",
        engine=EngineKind.VLLM,
        model="m",
        prefix_capacity=prefixes,
        cache_capacity_tokens=tokens,
    )


def test_an_offer_prefers_free_room_then_the_cheapest_victims() -> None:
    tokens = {"a": 1000, "b": 1000, "c": 3000, "d": 500}
    volume = {"a": 5.0, "b": 1.0, "c": 1.0, "d": 0.0}

    def value(agent_id: str) -> float:
        return prefix_value(volume.get(agent_id, 0.0), tokens[agent_id])

    full = _box("full", prefixes=2)
    roomy = _box("roomy", prefixes=3)
    held = {"full": ["a", "b"], "roomy": ["a", "c"]}
    offer = offer_loan("d", 500, [full, roomy], held, tokens, value, (), lambda _b: 0)
    assert offer is not None
    assert (offer.box_id, offer.victims, offer.cost) == ("roomy", (), 0.0)
    # no free room: b (1/min x 1,000 tokens) is cheaper than a or c
    offer = offer_loan("d", 500, [full], held, tokens, value, (), lambda _b: 0)
    assert offer is not None
    assert offer.victims == ("b",)
    # protected prefixes never leave; none left: no offer
    assert offer_loan("d", 500, [full], held, tokens, value, {"a", "b"}, lambda _b: 0) is None
    # a token pool: victims leave until the borrower's tokens fit
    pool = _box("pool", tokens=4500)
    offer = offer_loan(
        "x", 2500, [pool], {"pool": ["a", "b", "c"]}, {**tokens, "x": 2500}, value, (), lambda _b: 0
    )
    assert offer is not None
    assert offer.victims == ("b", "c")
    assert offer_loan("x", 5000, [pool], {"pool": []}, {**tokens, "x": 5000}, value, (), lambda _b: 0) is None


def test_loans_are_laid_over_the_handover_and_leave_placement_alone() -> None:
    moving = Handover(
        routing={"hot": ("b1",), "cool": ("b1", "b2")},
        keep_warm={"hot": ("b1",), "cool": ("b1", "b2")},
        pending={},
    )
    prefix_of = {"hot": "ph", "cool": "pc", "tail": "pt"}
    loan = Loan("b1", "tail", ("cool",), until=100.0)
    before_warm = apply_loans(moving, [loan], prefix_of, warm=())
    assert before_warm.keep_warm == {"hot": ("b1",), "cool": ("b2",), "tail": ("b1",)}
    assert before_warm.routing == {"hot": ("b1",), "cool": ("b2",), "tail": ()}  # not routed until warm
    after_warm = apply_loans(moving, [loan], prefix_of, warm={("b1", "pt")})
    assert after_warm.routing["tail"] == ("b1",)
    assert apply_loans(moving, [], prefix_of, warm=()) is moving


def test_a_box_kept_over_its_cap_while_loans_run_sheds_others_never_the_borrower() -> None:
    """Placement does not count loans: when a rollout moves a new agent onto a box whose room is lent,
    the new arrival (not warm there yet) leaves before anything warm, and the borrower stays."""
    moving = Handover(
        routing={"moved": (), "warm": ("b1",)},
        keep_warm={"moved": ("b1",), "warm": ("b1",), "victim": ("b1",)},
        pending={"moved": ("b1",)},
    )
    prefix_of = {"moved": "pm", "warm": "pw", "victim": "pv", "tail": "pt"}
    loan = Loan("b1", "tail", ("victim",), until=100.0)
    boxes = {"b1": _box("b1", prefixes=2)}
    caps = LentBoxCaps(boxes, priority={"moved": 9.0, "warm": 1.0})
    laid = apply_loans(moving, [loan], prefix_of, {("b1", "pw"), ("b1", "pt")}, caps)
    kept = sorted(agent for agent, group in laid.keep_warm.items() if "b1" in group)
    assert kept == ["tail", "warm"]  # the busier newcomer leaves: it holds nothing there yet
    assert laid.routing["tail"] == ("b1",)
    # when everything on the box is warm, the quietest non-borrower leaves
    laid = apply_loans(moving, [loan], prefix_of, {("b1", "pw"), ("b1", "pt"), ("b1", "pm")}, caps)
    assert sorted(a for a, g in laid.keep_warm.items() if "b1" in g) == ["moved", "tail"]


def test_a_prefix_just_answered_ready_never_leaves_and_a_borrower_is_protected_only_briefly(
    store_url: str,
) -> None:
    """A ready answer sends a call whose first turn has not reached the box yet: for
    `precall_protect_seconds` (10 s) that prefix stays, even when it is the cheapest to lose; so does a
    borrower. When that leaves no room, a prefix answered longer ago than a first turn takes
    (`FIRST_TURN_SECONDS`) gives its room rather than let the call land cold in a slot the engine picks.
    After the window both are ordinary residents again."""

    async def scenario() -> None:
        volume = {"hot": 10.0, "cool": 1.0, "t1": 0.5, "t2": 0.4}
        w = one_box_world(store_url, volume)
        engine = w.engine
        await settle(w.reconciler)
        assert (await w.reconciler.ensure_warm("cool", wait_seconds=0.0)).routed  # its call is on its way
        answer = await w.reconciler.ensure_warm("t1", wait_seconds=5.0)
        assert answer.routed
        held = held_ids(engine, "b1")
        assert prefix_ids("cool") in held  # protected: the busier unasked one left instead
        assert prefix_ids("hot") not in held
        # within cool's first-turn time and t1's protection: t2 cannot borrow and is answered cold
        w.clock.t += FIRST_TURN_SECONDS / 2
        assert not (await w.reconciler.ensure_warm("t2", wait_seconds=0.0)).routed
        # past cool's first turn, t1 still protected: cool's room goes to t2, chosen and released first
        w.clock.t += 4.0
        answer = await w.reconciler.ensure_warm("t2", wait_seconds=5.0)
        assert answer.routed
        held = held_ids(engine, "b1")
        assert {prefix_ids("t1"), prefix_ids("t2")} <= held
        assert prefix_ids("cool") not in held
        # past t1's window it is the cheapest resident (0.5/min), and gives its room to cool's next call
        w.clock.t += 6.0
        answer = await w.reconciler.ensure_warm("cool", wait_seconds=5.0)
        assert answer.routed
        held = held_ids(engine, "b1")
        assert {prefix_ids("cool"), prefix_ids("t2")} <= held
        assert prefix_ids("t1") not in held
        await settle(w.reconciler, rounds=2)
        assert route_boxes(w.reconciler, "t1") == []

    asyncio.run(scenario())


def test_a_prefix_in_a_slot_another_call_still_writes_to_is_probed_before_it_is_called_ready(
    store_url: str,
) -> None:
    """A call keeps sending turns to the slot its answer named. When that slot is lent to another agent
    while the call still runs, its next turn overwrites the borrower there, and the borrower's record
    alone would keep vouching for it (seen on the crowded fleet bench: ready answers whose turn 1 found 28
    of ~2,900 tokens). An ask within the call's hold probes first; the answer is true of the engine."""

    async def scenario() -> None:
        volume = {"hot": 10.0, "cool": 1.0, "tail": 0.5}
        w = one_box_world(store_url, volume, pinnable=True)
        engine, reconciler = w.engine, w.reconciler
        await settle(reconciler)
        cool_slot = reconciler.prefix_slot("cool", "b1")
        assert cool_slot is not None
        reconciler.note_call("cool", "b1", cool_slot)  # a call of cool's runs in its slot
        w.clock.t += 11.0  # past cool's protection; its call still runs (a minute's hold)
        answer = await reconciler.ensure_warm("tail", wait_seconds=5.0)
        assert answer.routed
        assert reconciler.prefix_slot("tail", "b1") == cool_slot  # the room lent was cool's slot
        assert prefix_ids("tail") in held_ids(engine, "b1")

        # cool's call sends its next turn to its slot: the borrower there is overwritten
        engine.boxes["b1"].use((*prefix_ids("cool"), 7, 7, 7), cool_slot)
        assert prefix_ids("tail") not in held_ids(engine, "b1")
        w.clock.t += 2.0
        probes = len(engine.probes("b1"))
        answer = await reconciler.ensure_warm("tail", wait_seconds=5.0)
        assert len(engine.probes("b1")) > probes  # looked before vouching
        assert not answer.routed or prefix_ids("tail") in held_ids(engine, "b1")  # never a false ready
        history = [e for e in await w.store.events(box_id="b1", limit=500) if e.kind == "warm_transition"]
        found_cold = [e for e in history if "slot shared with a running call" in str(e.detail["reason"])]
        assert [(e.detail["from"], e.detail["to"]) for e in found_cold] == [("warm", "evicted")]

        # outside the call's hold, a verified prefix is answered from its record again: no probe
        w.clock.t += 61.0
        await settle(reconciler, rounds=2)
        probes = len(engine.probes("b1"))
        if route_boxes(reconciler, "tail"):
            assert (await reconciler.ensure_warm("tail", wait_seconds=0.0)).routed
            assert len(engine.probes("b1")) == probes

    asyncio.run(scenario())


def test_a_short_protection_look_does_not_forget_answers_the_full_window_still_protects(
    store_url: str,
) -> None:
    """The fallback lend asks who was answered within a first turn's time; that look must not drop the
    answers the protection window (10 s) still covers, or the next ask's full protection misses them."""

    async def scenario() -> None:
        w = one_box_world(store_url, {"hot": 10.0, "cool": 1.0})
        await settle(w.reconciler)
        assert (await w.reconciler.ensure_warm("cool", wait_seconds=0.0)).routed
        precall = w.reconciler._precall  # the pre-call part of the reconciler, asked directly
        w.clock.t += 5.0
        assert precall.answered_within(FIRST_TURN_SECONDS) == frozenset()
        assert precall.answered_within(10.0) == {"cool"}
        w.clock.t += 6.0
        assert precall.answered_within(10.0) == frozenset()

    asyncio.run(scenario())
