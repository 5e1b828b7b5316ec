"""The reconciler wired to a box's KV cache events: the re-warm follows the engine's removal, and a
keepalive touch of a prefix the events say is held is still sent, just inside the eviction horizon the
events measure.

The real Reconciler over the fake engine (tests/unit/reconciler_fakes.py); the events come from the fake
publisher (tests/unit/kv_cache_fakes.py), published as the engine would after warmer's own warm.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace

import pytest
from structlog.testing import capture_logs

from tests.unit.kv_cache_fakes import FakeCache, FakePort, FakePublisher, TickClock
from tests.unit.reconciler_fakes import PROFILE, FencedOutStore, World, settle, world
from warmer.core.model import KvEventsEndpoint, Prefix, WarmRecord, WarmState
from warmer.core.planner import PlannerConfig
from warmer.core.residency import PrefixState
from warmer.service.engine_signals.cache_events import CacheEventWatcher, ResetReason

pytestmark = pytest.mark.timeout(60)


def followed(w: World) -> tuple[CacheEventWatcher, FakePublisher]:
    """A watcher over the fake port following b1, reporting to the reconciler's reactions."""
    publisher = FakePublisher()
    box = replace(w.reconciler.fleet()["b1"], kv_events=KvEventsEndpoint("tcp://b1:5557"))
    watcher = CacheEventWatcher(
        port=FakePort(publisher),
        listener=w.reconciler.evictions,
        fleet=lambda: [box],
        tokenize=w.engine.tokenize,
        clock=TickClock(),
    )
    w.reconciler.evictions.attach(watcher)
    watcher.sync_boxes([box])
    return watcher, publisher


async def warm_record(w: World) -> WarmRecord:
    (record,) = await w.store.list_warm()
    return record


async def transitions(w: World) -> list[str]:
    return [str(e.detail["reason"]) for e in await w.store.events(limit=100) if e.kind == "warm_transition"]


def run(scenario: Callable[[World], Awaitable[None]], store_url: str) -> None:
    async def go() -> None:
        w = world(
            store_url,
            box_ids=("b1",),
            planner=PlannerConfig(retire_idle_after_seconds=None),
            min_group=1,
            store_class=FencedOutStore,
        )
        try:
            await scenario(w)
        finally:
            await w.reconciler.close()
            await w.store.close()

    asyncio.run(go())


def the_prefix(w: World) -> Prefix:
    return w.source.compute(next(iter(w.reconciler.agent_specs().values()))).prefix


async def warmed_and_stored(w: World) -> tuple[CacheEventWatcher, FakePublisher, FakeCache, Prefix]:
    """b1 followed, its agent's prefix warmed and verified, and the engine's store of it published."""
    watcher, publisher = followed(w)
    await asyncio.sleep(0)
    await publisher.settled()
    cache, prefix = FakeCache(), the_prefix(w)
    assert prefix.token_ids is not None
    await settle(w.reconciler)
    await w.reconciler.evictions.wait_idle()  # the verified prefix is now followed
    publisher.publish(cache.store(prefix.token_ids))
    await publisher.settled()
    return watcher, publisher, cache, prefix


def test_an_evicted_prefix_is_rewarmed_on_the_event_without_a_probe(store_url: str) -> None:
    async def scenario(w: World) -> None:
        watcher, publisher, cache, prefix = await warmed_and_stored(w)
        assert getattr(watcher.state("b1", prefix.hash), "state", None) is PrefixState.RESIDENT
        warms, probes = len(w.engine.warms("b1")), len(w.engine.probes("b1"))

        publisher.publish(cache.evict(prefix.token_ids, 3))
        await publisher.settled()
        await w.reconciler.evictions.wait_idle()
        assert (await warm_record(w)).state is WarmState.EVICTED  # at once, before any pass
        await settle(w.reconciler)

        assert (await warm_record(w)).state is WarmState.WARM
        assert len(w.engine.warms("b1")) > warms  # re-warmed
        assert len(w.engine.probes("b1")) == probes + 1  # only the re-warm's own verification
        reasons = await transitions(w)
        assert any(r.startswith("kv event: evicted, the engine holds 12 of its tokens") for r in reasons)
        await watcher.close()

    run(scenario, store_url)


def test_an_eviction_another_replica_must_record_is_left_to_it(store_url: str) -> None:
    """Several replicas follow a box's events; the store refuses the eviction's write on a replica that
    does not hold the box's lease (`LeaseLost`): the reaction leaves it to the holder, without failing."""

    async def scenario(w: World) -> None:
        watcher, publisher, cache, prefix = await warmed_and_stored(w)
        store = w.store
        assert isinstance(store, FencedOutStore)
        store.fenced_warms = frozenset({"b1"})
        with capture_logs() as logs:
            publisher.publish(cache.evict(prefix.token_ids, 3))
            await publisher.settled()
            await w.reconciler.evictions.wait_idle()
        assert (await warm_record(w)).state is WarmState.WARM  # the holder records it, not this replica
        (left,) = [e for e in logs if e["event"] == "kv event left to the box's lease holder"]
        assert (left["box"], left["prefix"]) == ("b1", prefix.hash)
        await watcher.close()

    run(scenario, store_url)


def test_a_held_prefix_is_touched_inside_the_horizon_the_events_measure(store_url: str) -> None:
    """vLLM evicts least recently used first: "still resident" is no reason to skip a touch. Other
    prefixes' blocks stored and evicted 8 s later (the fake engine's clock: one second per batch) put the
    box's horizon at 8 s, so the held prefix is touched after 0.8 x 8 s (jittered below), long before the
    profile's keepalive."""

    async def scenario(w: World) -> None:
        watcher, publisher, cache, _ = await warmed_and_stored(w)
        sent, probed = len(w.engine.warms("b1")), len(w.engine.probes("b1"))
        others = [list(range(5000 + 8 * i, 5008 + 8 * i)) for i in range(8)]
        for other in others:
            publisher.publish(cache.store(other))
        for other in others:
            publisher.publish(cache.evict(other, 0))
        await publisher.settled()
        assert w.reconciler.evictions.horizons() == {"b1": 8.0}
        assert PROFILE.keepalive_seconds > 8.0
        verified = (await warm_record(w)).verified_at
        assert verified is not None

        w.clock.t = verified + 8.0 * 0.8
        await settle(w.reconciler)

        # The touch reached the engine, as one probe: the events vouch for every block, so the probe (a
        # request like any other) refreshes them and its own cached tokens verify the hit.
        assert len(w.engine.warms("b1")) == sent
        assert len(w.engine.probes("b1")) == probed + 1
        record = await warm_record(w)
        assert (record.state, record.verified_at) == (WarmState.WARM, w.clock.t)
        assert "keepalive due" in await transitions(w)
        assert w.reconciler.evictions.still_resident("b1", (await warm_record(w)).prefix_hash) is not None
        await watcher.close()

    run(scenario, store_url)


def test_a_prefix_the_events_do_not_vouch_for_is_touched_as_before(store_url: str) -> None:
    async def scenario(w: World) -> None:
        watcher, publisher = followed(w)
        await asyncio.sleep(0)
        await publisher.settled()
        await settle(w.reconciler)
        await w.reconciler.evictions.wait_idle()
        warms = len(w.engine.warms("b1"))  # no store event published: the prefix stays UNKNOWN

        w.clock.t += PROFILE.keepalive_seconds
        await settle(w.reconciler)

        assert len(w.engine.warms("b1")) == warms + 1  # the keepalive touch went out
        assert "keepalive due" in await transitions(w)
        await watcher.close()

    run(scenario, store_url)


def test_a_sequence_reset_looks_at_the_box_at_once(store_url: str) -> None:
    async def scenario(w: World) -> None:
        watcher, publisher = followed(w)
        await asyncio.sleep(0)
        await publisher.settled()
        await settle(w.reconciler)
        old_epoch = (await warm_record(w)).epoch
        w.engine.restart("b1")  # a new process: new epoch

        w.reconciler.evictions.box_reset("b1", ResetReason.RESTARTED)
        await w.reconciler.evictions.wait_idle()

        assert w.reconciler.snapshot().live["b1"].epoch not in (None, old_epoch)  # seen before any pass
        await watcher.close()

    run(scenario, store_url)
