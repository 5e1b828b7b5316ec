"""A warm whose slot is overwritten between the warm and its verification (a call's turn or a side request
landed there) is contested, not failed: it is warmed again at once, in a slot no call is using where there
is one, a bounded number of times, and only then backs off. The real Reconciler over the fake engine, whose
per-slot content is the truth every "ready" answer is checked against."""

from __future__ import annotations

import asyncio

from tests.unit.reconciler_fakes import PROFILE, FakeEngine, World, route_boxes, settle, world
from tests.unit.test_precall_lending import prefix_ids
from tests.unit.test_side_slots import settled, side_request
from warmer.core.errors import EngineError
from warmer.core.model import BoxCapacity, WarmRecord, WarmState
from warmer.core.warmstate import RetryBackoff, is_serving
from warmer.service.reconciler.records import WarmBook

CALL_TURN = (8, 8, 8)  # another agent's call, sent where the engine likes: it overwrites the slot it lands in
REWARMS = RetryBackoff().contested_rewarms


def contest(engine: FakeEngine, agent_id: str, times: int | None = None) -> list[int | None]:
    """Overwrite the slot of the agent's next `times` warms (None: every one) between each warm and its
    probe; the slots overwritten, in order."""
    ids = prefix_ids(agent_id)
    hit: list[int | None] = []

    def landed(box_id: str, slot: int | None) -> None:
        box = engine.boxes[box_id]
        if box.slot_prompts.get(slot) != ids or (times is not None and len(hit) >= times):
            return  # another agent's warm, or the contests asked for are over
        hit.append(slot)
        box.use(CALL_TURN, slot)

    engine.after_warm = landed
    return hit


def fail_warms(engine: FakeEngine, agent_id: str) -> list[int | None]:
    """The agent's warms end in an engine error (the request after the warm fails): no contest."""
    ids = prefix_ids(agent_id)
    failed: list[int | None] = []

    def broken(box_id: str, slot: int | None) -> None:
        if engine.boxes[box_id].slot_prompts.get(slot) == ids:
            failed.append(slot)
            raise EngineError(box_id, "HTTP 500: slot crashed")

    engine.after_warm = broken
    return failed


async def record_of(w: World, agent_id: str) -> WarmRecord:
    computed = w.reconciler._catalogue.get(agent_id)
    assert computed is not None
    rows = [
        r for r in await w.store.list_warm() if r.prefix_hash == computed.prefix.hash and r.box_id == "b1"
    ]
    assert len(rows) == 1
    return rows[0]


async def past_the_side_probe(w: World) -> None:
    """Let the probe that follows a side request into its slot run (it sleeps on the fake clock, which moves
    the clock on by its 2 s): it finds the prefix cold, so an ask that follows warms it."""
    await asyncio.sleep(0)
    await w.reconciler.wait_idle()


async def cool_lent_away(store_url: str) -> World:
    """The settled world once cool's slot went to a side request and the probe after it found cool cold:
    cool's next ask warms it."""
    w, _, _ = await settled(store_url)
    lent = await w.reconciler.side_slot("b1")
    assert lent.slot is not None
    side_request(w.engine, "b1", lent.slot)
    await past_the_side_probe(w)
    return w


def slot_holds(w: World, agent_id: str) -> bool:
    """The fake engine's slot named for the agent holds exactly its prefix."""
    slot = w.reconciler.prefix_slot(agent_id, "b1")
    return slot is not None and w.engine.boxes["b1"].slot_prompts.get(slot) == prefix_ids(agent_id)


def test_a_warm_takes_a_free_slot_nothing_else_is_about_to_use_first() -> None:
    """`WarmBook.pin_for`: among the free slots, one just seen overwritten (`avoid`) goes last, and before
    it one sent another prefix's call or lent to a side request within the hold."""
    three = BoxCapacity(prefixes=3, pinnable_slots=3, source="fake")
    key = ("b1", "e1", "p")

    def book(call_at: float | None = None, side_at: float | None = None, caller: str = "other") -> WarmBook:
        """Slot 0 held by another prefix; a call of `caller`'s sent to slot 1, a side request to slot 2."""
        made = WarmBook(store=None)  # type: ignore[arg-type]  # the choice reads only the book's own maps
        made.keep_pin(("b1", "e1", "kept"), 0)
        if call_at is not None:
            made.note_call(("b1", "e1", caller), 1, now=call_at, hold=60.0)
        if side_at is not None:
            made.note_side_use("b1", "e1", 2, side_at)
        return made

    assert book().pin_for(key, three, now=200.0, hold=60.0) == 1  # nothing in use: the first free slot
    assert book(call_at=150.0).pin_for(key, three, now=200.0, hold=60.0) == 2  # a call is sending turns to 1
    assert book(call_at=100.0).pin_for(key, three, now=200.0, hold=60.0) == 1  # that call is over
    assert book(call_at=150.0, caller="p").pin_for(key, three, now=200.0, hold=60.0) == 1  # the prefix's own
    assert book(side_at=150.0).pin_for(key, three, now=200.0, hold=60.0) == 1  # 2 was lent to a side request
    # ...yet a slot lent lately goes before the slot just seen overwritten
    assert book(side_at=150.0).pin_for(key, three, now=200.0, hold=60.0, avoid={1}) == 2
    both = book(call_at=150.0, side_at=150.0)
    assert both.pin_for(key, three, now=200.0, hold=60.0, avoid={1}) == 2
    assert both.pin_for(key, three, now=200.0, hold=60.0) == 2  # (kept: it holds its pin now)
    assert book(call_at=150.0).pin_for(key, three) == 1  # no time given: the first free slot, as before

    # a side request on its way to slot 2 (lent 1 s ago) is certain to land there: a slot still sent
    # another prefix's turns goes first (a just-in-time loan's warm took slot 2 and was overwritten, and
    # its ready answer was false, in the realmix bench); once it has landed the two rank alike again
    def lent_first(side_at: float) -> WarmBook:
        """Slot 2 held; slot 0 lent to a side request, slot 1 sent another prefix's call lately."""
        made = WarmBook(store=None)  # type: ignore[arg-type]
        made.keep_pin(("b1", "e1", "kept"), 2)
        made.note_side_use("b1", "e1", 0, side_at)
        made.note_call(("b1", "e1", "other"), 1, now=150.0, hold=60.0)
        return made

    assert lent_first(199.0).pin_for(key, three, now=200.0, hold=60.0) == 1
    assert lent_first(190.0).pin_for(key, three, now=200.0, hold=60.0) == 0  # landed: they rank alike
    assert lent_first(199.0).pin_for(key, three, now=200.0, hold=60.0, avoid={1}) == 0
    full = book()
    full.keep_pin(("b1", "e1", "x"), 1)
    full.keep_pin(("b1", "e1", "y"), 2)
    assert full.pin_for(key, three, now=200.0, hold=60.0) is None  # every slot held: the engine chooses


def test_an_ask_waiting_on_a_contested_warm_is_answered_ready_once_it_is_warmed_again(store_url: str) -> None:
    """The realmix case: cool's slot went to a side request, so cool's next ask probes it (cold) and warms
    it; a call's turn lands in that slot between the warm and its probe. Before: the warm failed into a 5 s
    backoff and the ask was answered "failed" after its whole wait. Now the prefix is warmed again at once
    and the ask is answered ready, true of the slot it names."""

    async def scenario() -> None:
        w, cool_slot, _ = await settled(store_url)
        lent = await w.reconciler.side_slot("b1")
        assert (lent.slot, lent.evicts) == (cool_slot, "cool")
        side_request(w.engine, "b1", cool_slot)
        contested = contest(w.engine, "cool", times=1)

        answer = await w.reconciler.ensure_warm("cool", wait_seconds=5.0)
        assert contested == [cool_slot]  # the warm the ask waited on was overwritten before its probe
        assert (answer.box_id, answer.state, answer.routed) == ("b1", WarmState.WARM, True), answer.detail
        assert slot_holds(w, "cool")  # the answer is true of the slot a call names
        record = await record_of(w, "cool")
        assert (record.state, record.attempts) == (WarmState.WARM, 0)
        await settle(w.reconciler, rounds=2)
        assert route_boxes(w.reconciler, "cool") == ["b1"]

    asyncio.run(scenario())


def test_a_contested_warm_is_warmed_again_in_another_free_slot(store_url: str) -> None:
    """Three slots, two agents: the slot a call's turn landed in is the last one taken again."""

    async def scenario() -> None:
        engine = FakeEngine(["b1"])
        engine.boxes["b1"].holds = 3
        engine.boxes["b1"].pinnable = True
        volume = {"hot": 10.0, "cool": 1.0}
        w = world(store_url, ("b1",), tuple(volume), engine=engine, min_group=1, demand=lambda: volume)
        contested = contest(engine, "cool", times=1)
        await settle(w.reconciler)
        assert len(contested) == 1
        assert route_boxes(w.reconciler, "cool") == ["b1"]
        cool_slot = w.reconciler.prefix_slot("cool", "b1")
        assert cool_slot not in (contested[0], w.reconciler.prefix_slot("hot", "b1"))
        assert slot_holds(w, "cool")
        assert slot_holds(w, "hot")
        assert (await w.reconciler.ensure_warm("cool", wait_seconds=0.0)).routed

    asyncio.run(scenario())


def test_a_contested_keepalive_warm_stops_vouching_until_warmed_again(store_url: str) -> None:
    """A keepalive warm of a prefix believed warm (still routed while it is touched) whose slot is then
    seen overwritten: from that moment nothing vouches for it; the re-warm makes it true again."""

    async def scenario() -> None:
        w, cool_slot, _ = await settled(store_url)
        computed = w.reconciler._catalogue.get("cool")
        assert computed is not None
        key = ("b1", "gen-0", computed.prefix.hash)
        contested = contest(w.engine, "cool", times=1)
        landed = w.engine.after_warm
        assert landed is not None
        serving: list[bool] = []  # at each warm of cool's: is its record believed warm?

        def watched(box_id: str, slot: int | None) -> None:
            if w.engine.boxes[box_id].slot_prompts.get(slot) == prefix_ids("cool"):
                record = w.reconciler._book.get(key)
                serving.append(record is not None and is_serving(record))
            landed(box_id, slot)

        w.engine.after_warm = watched
        w.clock.t += PROFILE.keepalive_seconds  # keepalives are due
        await settle(w.reconciler, rounds=3)
        assert contested == [cool_slot]
        assert serving == [True, False]  # touched while warm; then known overwritten: not vouched for
        assert route_boxes(w.reconciler, "cool") == ["b1"]
        assert slot_holds(w, "cool")

    asyncio.run(scenario())


def test_a_slot_overwritten_again_and_again_ends_in_the_backoff(store_url: str) -> None:
    """Every warm of cool is overwritten before its probe: a few immediate re-warms, then the backoff as
    before (no warm storm); the ask is answered failed, never ready; past the backoff it is warmed again."""

    async def scenario() -> None:
        w = await cool_lent_away(store_url)
        contested = contest(w.engine, "cool")
        charged: list[float] = []  # what the re-warms spend of the fleet budget beyond their one admission
        w.reconciler._runner._contests._charge = charged.append

        answer = await w.reconciler.ensure_warm("cool", wait_seconds=0.5)
        assert not answer.routed  # (failed, or still warming again if the wait ran out first)
        await w.reconciler.wait_idle()
        assert len(contested) == 1 + REWARMS
        assert charged == [float(len(prefix_ids("cool")) * PROFILE.warm_requests_per_prefix)] * REWARMS
        assert (await w.reconciler.ensure_warm("cool", wait_seconds=0.0)).state is WarmState.FAILED
        record = await record_of(w, "cool")
        assert (record.state, record.attempts) == (WarmState.FAILED, 1)  # the first backoff: 5 s
        assert record.warmed_at is None
        await settle(w.reconciler, rounds=3)  # within the backoff: nothing more is sent
        assert len(contested) == 1 + REWARMS
        assert route_boxes(w.reconciler, "cool") == []

        w.clock.t += RetryBackoff().initial_seconds + 1.0  # past the backoff: the next attempt...
        await settle(w.reconciler, rounds=3)
        # ...is one warm: a prefix that failed already is not warmed again at once
        assert len(contested) == 2 + REWARMS
        record = await record_of(w, "cool")
        assert (record.state, record.attempts) == (WarmState.FAILED, 2)  # and backs off longer: 10 s

        w.engine.after_warm = None  # the slot is left alone now
        w.clock.t += 2 * RetryBackoff().initial_seconds + 1.0
        await settle(w.reconciler, rounds=3)
        assert route_boxes(w.reconciler, "cool") == ["b1"]
        assert slot_holds(w, "cool")

    asyncio.run(scenario())


def test_an_engine_error_is_not_a_contest_and_keeps_the_backoff(store_url: str) -> None:
    async def scenario() -> None:
        w = await cool_lent_away(store_url)
        failed = fail_warms(w.engine, "cool")

        answer = await w.reconciler.ensure_warm("cool", wait_seconds=0.5)
        assert not answer.routed
        await w.reconciler.wait_idle()
        assert len(failed) == 1  # no immediate re-warm
        assert (await w.reconciler.ensure_warm("cool", wait_seconds=0.0)).state is WarmState.FAILED
        record = await record_of(w, "cool")
        assert record.state is WarmState.FAILED
        assert "engine error" in (record.last_error or "")
        await settle(w.reconciler, rounds=3)
        assert len(failed) == 1

    asyncio.run(scenario())
