"""KV cache events from a real vLLM CPU server: a warmed prefix stored, evicted, re-warmed; a restart.

The module runs its own server (not the session's): `--kv-events-config` publishes events on two ports of
its own, and `--num-gpu-blocks-override 8` leaves 7 usable blocks of 128 tokens (block 0 is vLLM's null
block, `vllm/v1/core/block_pool.py`), so two other prompts of 4 blocks evict a warmed 3-block prefix.
Eviction order: freed blocks go to the tail of the free queue, the last block of a request first, and
new blocks come from its head (`FreeKVCacheBlockQueue`), so the never-used blocks go before any cached one.

Events are read by warmer's own adapter and watcher (`ZmqKvEventSource`, `CacheEventWatcher`); nothing
here probes the cache to learn that the prefix left it: the engine says so.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
import pytest

from testbed.vllm_server import CPU_BLOCK_SIZE, VllmServer, free_port, kv_events_args
from warmer.adapters.engines.vllm import VllmEngine
from warmer.adapters.engines.vllm_kv_events import ZmqKvEventSource, sha256_cbor_hasher
from warmer.adapters.store import SqlStore, upgrade_database
from warmer.config.settings import Settings
from warmer.core.agents import AgentSpec, DynamicTail, Placeholder, StaticBlock
from warmer.core.kv_event_stream import BlockStored
from warmer.core.model import (
    BoxSpec,
    EngineKind,
    EngineTimeouts,
    KvEventsEndpoint,
    ModelProfile,
    Prefix,
    RestartRecipe,
    WarmState,
)
from warmer.core.residency import PrefixResidency, PrefixState
from warmer.root.engines import SystemClock, build_engine_dispatcher, engine_http_client
from warmer.root.kv_events import cache_event_task
from warmer.root.reconcile import reconciler_config, run_timers
from warmer.service.engine_signals.cache_events import CacheEventWatcher, ResetReason
from warmer.service.engine_work.warming import WarmExecutor
from warmer.service.reconciler import Reconciler
from warmer.service.reconciler.types import ComputedPrefix

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

PROFILE = ModelProfile(name="tiny-vllm-cpu", engine=EngineKind.VLLM, block_tokens=CPU_BLOCK_SIZE)
GPU_BLOCKS = 8
HASH_SEED = "20"
PROMPT_BYTES = 3 * CPU_BLOCK_SIZE + 66  # three full blocks and a partial one: 4 blocks while it runs
EVENT_WAIT_S = 60.0  # events follow the engine step that made them; a busy 2-core box may lag
WAIT_S = 180.0  # the reconciler's passes on a loaded 2-core machine: bounds, not expectations


@dataclass
class KvServer:
    server: VllmServer
    box: BoxSpec


@pytest.fixture(scope="module")
def kv_server(tiny_hf_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KvServer]:
    pub, replay = free_port(), free_port()
    server = VllmServer(
        tiny_hf_model_path,
        workdir=tmp_path_factory.mktemp("vllm-kv-events"),
        max_model_len=512,
        extra_args=(
            *kv_events_args(pub, replay), "--num-gpu-blocks-override", str(GPU_BLOCKS),
            "--prefix-caching-hash-algo", "sha256_cbor",  # with a fixed seed: reproducible hashes
        ),
        extra_env=(("PYTHONHASHSEED", HASH_SEED),),
    )  # fmt: skip
    box = BoxSpec(
        id="vllm-kv",
        base_url=server.base_url,
        engine=EngineKind.VLLM,
        model=PROFILE.name,
        kv_events=KvEventsEndpoint(f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}"),
    )
    with server:
        yield KvServer(server, box)


def unique_text(n_bytes: int = PROMPT_BYTES) -> str:
    """Unlike any other prompt from its first byte, so it shares no block with anything cached."""
    rng = random.Random(uuid.uuid4().int)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(n_bytes))


@dataclass
class Recorder:
    """The watcher's listener: what the events said, in order, with a wake-up for each call."""

    calls: list[tuple[str, ...]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def prefix_evicted(self, box_id: str, prefix_hash: str, resident_tokens: int) -> None:
        self._add("evicted", prefix_hash, str(resident_tokens))

    def prefix_resident(self, box_id: str, prefix_hash: str) -> None:
        self._add("resident", prefix_hash)

    def box_reset(self, box_id: str, reason: ResetReason) -> None:
        self._add("reset", reason.value)

    def _add(self, *call: str) -> None:
        self.calls.append(call)
        self.changed.set()

    def count(self, *head: str) -> int:
        return sum(1 for call in self.calls if call[: len(head)] == head)

    async def until(self, *head: str, count: int = 1) -> None:
        """Wait for the `count`-th call starting with `head` (a wait bound, not a timing assertion:
        failing means the event never came)."""

        async def seen() -> None:
            while self.count(*head) < count:
                self.changed.clear()
                await self.changed.wait()

        try:
            await asyncio.wait_for(seen(), EVENT_WAIT_S)
        except TimeoutError:
            pytest.fail(f"no {head} after {EVENT_WAIT_S:.0f} s; calls so far: {self.calls}")


async def complete(engine: VllmEngine, box: BoxSpec, text: str) -> None:
    await engine.complete_prompt(box, text, max_tokens=1)


async def token_prefix(engine: VllmEngine, box: BoxSpec, text: str) -> Prefix:
    ids = await engine.tokenize(box, text)
    return Prefix(text=text, token_count=len(ids), token_ids=tuple(ids))


Scenario = Callable[[VllmEngine, WarmExecutor, CacheEventWatcher, Recorder], Awaitable[None]]


def run_with_watcher(kv: KvServer, scenario: Scenario, *, follow: bool = True) -> Recorder:
    """Run the scenario with warmer's watcher (following the box's stream from the start unless not
    `follow`: the scenario then starts it)."""

    async def go() -> Recorder:
        recorder = Recorder()
        source = ZmqKvEventSource(replay_timeout_s=10.0)
        async with httpx.AsyncClient() as client:
            engine = VllmEngine(client, timeouts=EngineTimeouts(request=120.0))
            watcher = CacheEventWatcher(
                port=source,
                listener=recorder,
                fleet=lambda: [kv.box],
                tokenize=engine.tokenize,
                clock=SystemClock(),
            )
            if follow:
                watcher.sync_boxes([kv.box])
            try:
                await scenario(engine, WarmExecutor(engine, SystemClock()), watcher, recorder)
            finally:
                await watcher.close()
                source.close()
        return recorder

    return asyncio.run(go())


@dataclass
class Seen:
    prefix: Prefix | None = None
    states: dict[str, PrefixResidency | None] = field(default_factory=dict)
    rewarm_cached: int | None = None


def test_a_warmed_prefix_is_seen_stored_evicted_and_rewarmed(kv_server: KvServer) -> None:
    box = kv_server.box
    others = [unique_text() for _ in range(4)]
    seen = Seen()

    async def scenario(
        engine: VllmEngine, executor: WarmExecutor, watcher: CacheEventWatcher, recorder: Recorder
    ) -> None:
        prefix = seen.prefix = await token_prefix(engine, box, unique_text())
        warmed = await executor.warm_and_verify(box, PROFILE, prefix)
        assert warmed.verified, warmed.describe()
        await watcher.watch(box, prefix)
        await recorder.until("resident", prefix.hash)
        seen.states["resident"] = watcher.state(box.id, prefix.hash)

        for text in others:  # until the engine reports the prefix's blocks gone
            await complete(engine, box, text)
            if recorder.count("evicted", prefix.hash):
                break
        await recorder.until("evicted", prefix.hash)
        seen.states["evicted"] = watcher.state(box.id, prefix.hash)

        # The re-warm the listener asks for: the engine's own count of what it still held must agree.
        report = await engine.complete_prefix(box, prefix, max_tokens=1)
        seen.rewarm_cached = report.cached_tokens
        await recorder.until("resident", prefix.hash, count=2)
        seen.states["rewarmed"] = watcher.state(box.id, prefix.hash)
        verified = await executor.probe(box, PROFILE, prefix)
        assert verified.verified, verified.describe()

    recorder = run_with_watcher(kv_server, scenario)

    assert seen.prefix is not None
    full = seen.prefix.token_count // CPU_BLOCK_SIZE * CPU_BLOCK_SIZE
    assert full == 3 * CPU_BLOCK_SIZE
    resident, evicted, rewarmed = (seen.states[k] for k in ("resident", "evicted", "rewarmed"))
    assert resident is not None
    assert (resident.state, resident.resident_tokens, resident.tracked_tokens) == (
        PrefixState.RESIDENT,
        full,
        full,
    )
    assert evicted is not None
    assert evicted.state is PrefixState.EVICTED
    assert evicted.resident_tokens < full
    assert seen.rewarm_cached == evicted.resident_tokens  # the engine's answer is what the events said
    assert rewarmed is not None
    assert rewarmed.state is PrefixState.RESIDENT
    assert recorder.count("reset") == 0  # every batch arrived or was replayed


def test_a_watcher_that_missed_the_first_store_learns_the_blocks_from_a_hit(kv_server: KvServer) -> None:
    """warmer (re)started after the warm, without a replay socket: the first store is gone for good, but
    warmer's requests ask for "full" reports, so the next hit on the prefix names its blocks."""
    box = kv_server.box
    assert box.kv_events is not None
    late_box = replace(box, kv_events=KvEventsEndpoint(box.kv_events.endpoint))  # no replay endpoint
    seen = Seen()

    async def scenario(
        engine: VllmEngine, executor: WarmExecutor, watcher: CacheEventWatcher, recorder: Recorder
    ) -> None:
        prefix = await token_prefix(engine, box, unique_text())
        assert (await executor.warm_and_verify(box, PROFILE, prefix)).verified  # before the watcher runs
        watcher.sync_boxes([late_box])
        await watcher.watch(late_box, prefix)
        seen.states["joined"] = watcher.state(box.id, prefix.hash)
        # Traffic until the subscription is through (ZMQ drops what a SUB socket publishes before it has
        # joined); its first batch cannot be replayed. Bounded by the same wait as every event.
        deadline = time.monotonic() + EVENT_WAIT_S
        while not recorder.count("reset", "lost"):
            assert time.monotonic() < deadline, "the watcher saw no batch of the box's stream"
            await complete(engine, box, unique_text(CPU_BLOCK_SIZE + 1))
            await asyncio.sleep(0.5)

        probed = await executor.probe(box, PROFILE, prefix)
        assert probed.verified, probed.describe()
        await recorder.until("resident", prefix.hash)
        seen.states["after_hit"] = watcher.state(box.id, prefix.hash)

    run_with_watcher(kv_server, scenario, follow=False)

    joined, after_hit = seen.states["joined"], seen.states["after_hit"]
    assert joined is not None
    assert joined.state is PrefixState.UNKNOWN
    assert after_hit is not None
    assert after_hit.state is PrefixState.RESIDENT


AGENT = "kv-agent"
PROFILE = ModelProfile(
    name="tiny-vllm-kv",
    engine=EngineKind.VLLM,
    block_tokens=CPU_BLOCK_SIZE,
    context_length=512,
    slots=2,
    keepalive_seconds=3600.0,
    restart=RestartRecipe(
        sampled=None, constrained=None, burst_levels=(), long_prefill_tokens=CPU_BLOCK_SIZE
    ),
)
SPEC = AgentSpec(
    id=AGENT,
    model=PROFILE.name,
    blocks=(StaticBlock("persona", "You answer calls."),),
    tail=DynamicTail("Customer: {customer_name}"),
    placeholders=(Placeholder("customer_name", "name"),),
)


def test_the_reconciler_rewarms_an_evicted_prefix_on_the_event(kv_server: KvServer, tmp_path: Path) -> None:
    """No probe and no keepalive timer: the re-warm follows the engine's `BlockRemoved`."""
    box = kv_server.box
    url = f"sqlite:///{tmp_path / 'warmer.db'}"
    upgrade_database(url)
    settings = Settings.model_validate({"reconcile": {"interval_seconds": 0.5, "health_poll_seconds": 0.5}})
    text = unique_text(PROMPT_BYTES)
    others = [unique_text() for _ in range(6)]

    async def prefix_of(client: httpx.AsyncClient) -> Prefix:
        response = await client.post(f"{box.base_url}/tokenize", json={"prompt": text})
        response.raise_for_status()
        ids = response.json()["tokens"]
        return Prefix(text=text, token_count=len(ids), token_ids=tuple(ids), model=PROFILE.name)

    async def scenario() -> list[dict[str, object]]:
        store = SqlStore.from_url(url)
        async with engine_http_client(settings) as client:
            prefix = await prefix_of(client)

            async def prefix_source(spec: AgentSpec, profile: ModelProfile) -> ComputedPrefix:
                return ComputedPrefix(prefix=prefix, engine_version="vllm /tokenize")

            engines = build_engine_dispatcher(settings, client, boxes=[box], profiles={PROFILE.name: PROFILE})
            reconciler = Reconciler(
                engine=engines,
                store=store,
                clock=SystemClock(),
                boxes=[box],
                profiles={PROFILE.name: PROFILE},
                agents={AGENT: SPEC},
                prefix_source=prefix_source,
                config=reconciler_config(settings),
            )
            await reconciler.start()
            stopping = asyncio.Event()
            events = cache_event_task(
                fleet=reconciler.fleet, reactions=reconciler.evictions, engine=engines, clock=SystemClock()
            )
            tasks = [
                asyncio.create_task(reconciler.run(stopping)),
                asyncio.create_task(run_timers(settings, reconciler.poke, reconciler.poll_health, stopping)),
                asyncio.ensure_future(events(stopping)),
            ]

            def record_state() -> WarmState | None:
                records = reconciler.snapshot().records
                found = [r for (b, _, h), r in records.items() if b == box.id and h == prefix.hash]
                return found[0].state if found else None

            async def until(what: str, check: Callable[[], bool]) -> None:
                deadline = time.monotonic() + WAIT_S
                while not check():
                    assert time.monotonic() < deadline, f"timed out waiting for {what}"
                    await asyncio.sleep(0.2)

            try:
                await until("the prefix warm", lambda: record_state() is WarmState.WARM)
                await until(
                    "the events to vouch for it",
                    lambda: reconciler.evictions.still_resident(box.id, prefix.hash) is not None,
                )
                evicting_from = time.time()
                for other in others:  # other traffic until the engine drops the prefix's blocks
                    body = {"prompt": other, "max_tokens": 1, "temperature": 0}
                    (await client.post(f"{box.base_url}/v1/completions", json=body)).raise_for_status()
                    if record_state() is not WarmState.WARM:
                        break
                await until("the re-warm", lambda: _rewarmed(reconciler, box.id, prefix.hash, evicting_from))
            finally:
                stopping.set()
                await asyncio.gather(*tasks)
                await reconciler.close()
            rows = await store.events(box_id=box.id, limit=500)
            await store.close()
            transitions = [
                (row.at, dict(row.detail))
                for row in rows
                if row.prefix_hash == prefix.hash and row.at >= evicting_from
            ]
            return [detail for _, detail in sorted(transitions, key=lambda t: t[0])]

    transitions = asyncio.run(scenario())

    reasons = [str(t.get("reason", "")) for t in transitions]
    assert any(r.startswith("kv event: evicted") for r in reasons), reasons
    evicted_at = next(i for i, r in enumerate(reasons) if r.startswith("kv event: evicted"))
    after = reasons[evicted_at + 1 :]
    assert any(r.startswith("warm started") for r in after), reasons
    assert any(r.startswith("verified") for r in after), reasons
    # the engine's word, not a probe's (a keepalive touch of a held prefix may be a probe that saw the hit)
    assert not any(r.startswith("probe") and "says cold" in r for r in reasons), reasons
    # keepalive touches may come too: the horizon measured from the other prompts' evictions is short here


def _rewarmed(reconciler: Reconciler, box_id: str, prefix_hash: str, since: float) -> bool:
    records = reconciler.snapshot().records
    return any(
        b == box_id and h == prefix_hash and r.state is WarmState.WARM and (r.verified_at or 0.0) > since
        for (b, _, h), r in records.items()
    )


def test_a_restart_is_seen_as_a_sequence_reset(kv_server: KvServer) -> None:
    box = kv_server.box
    seen = Seen()

    async def scenario(
        engine: VllmEngine, executor: WarmExecutor, watcher: CacheEventWatcher, recorder: Recorder
    ) -> None:
        prefix = await token_prefix(engine, box, unique_text())
        assert (await executor.warm_and_verify(box, PROFILE, prefix)).verified
        await watcher.watch(box, prefix)
        await recorder.until("resident", prefix.hash)

        await asyncio.to_thread(kv_server.server.restart)
        await complete(engine, box, unique_text())  # the new process's first events: sequence 0 again
        await recorder.until("reset", "restarted")
        seen.states["after"] = watcher.state(box.id, prefix.hash)

    recorder = run_with_watcher(kv_server, scenario)

    after = seen.states["after"]
    assert after is not None
    assert after.state is PrefixState.EVICTED
    assert recorder.count("reset") == 1
    assert recorder.count("evicted") == 0  # the restart path re-warms everything, not prefix by prefix


def test_with_a_fixed_seed_and_sha256_cbor_warmer_computes_the_servers_block_hashes(
    kv_server: KvServer,
) -> None:
    """The server runs PYTHONHASHSEED=20 and `--prefix-caching-hash-algo sha256_cbor`: the hashes its
    BlockStored events carry for a warmed prefix are the ones warmer computes from the token ids alone
    (`sha256_cbor_hasher`, what `kv_events.hash_seed` turns on)."""
    box = kv_server.box

    async def scenario() -> tuple[tuple[object, ...], tuple[object, ...]]:
        source = ZmqKvEventSource(replay_timeout_s=10.0)
        stream = source.subscribe(box)
        try:
            async with httpx.AsyncClient() as client:
                engine = VllmEngine(client, timeouts=EngineTimeouts(request=120.0))
                prefix = await token_prefix(engine, box, unique_text())
                assert prefix.token_ids is not None
                await engine.complete_prefix(box, prefix, max_tokens=1)
                computed = sha256_cbor_hasher(HASH_SEED)(prefix.token_ids, CPU_BLOCK_SIZE)
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    for batch in await stream.replay(0):
                        for event in batch.events:
                            if (
                                isinstance(event, BlockStored)
                                and event.parent_hash is None
                                and tuple(event.token_ids) == prefix.token_ids[: len(event.token_ids)]
                            ):
                                return tuple(event.block_hashes), computed
                    await asyncio.sleep(0.5)
                raise AssertionError("the warmed prefix's BlockStored never came")
        finally:
            await stream.aclose()
            source.close()

    announced, computed = asyncio.run(scenario())
    assert len(announced) == 3
    # vLLM 0.32 sends ints by default (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES: the low 64 bits of the digest)
    on_wire = tuple(
        int.from_bytes(h, "big") & 0xFFFF_FFFF_FFFF_FFFF if isinstance(a, int) and isinstance(h, bytes) else h
        for a, h in zip(announced, computed, strict=False)
    )
    assert announced == on_wire
