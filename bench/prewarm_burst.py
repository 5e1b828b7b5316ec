"""Pre-call warm API under a dialer burst: N concurrent `POST /v1/prewarm` asks for one agent.

Everything real but the engines: the FastAPI app in-process over httpx.ASGITransport, the reconciler with
its loop running, the SQL store on a temp SQLite file. The engine port is a fake whose prefix requests
take a fixed time (a stand-in for prefill) and are counted per box, so "warm requests sent" is what an
engine would have received.

Scenarios, in one run:
- cold, coalesced: the agent's prefix is cold on every box; asks wait up to 10 s (the real path);
- cold, no coalescing (baseline): the same burst where every ask sends its own warm to the box it was
  given (what a naive pre-call hook does);
- warm: the prefix is already warm everywhere; asks answer at once (the steady-state path).

Run: python -m bench.prewarm_burst [--asks 1000] [--boxes 3] [--warm-ms 50]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry

from warmer.adapters.store import SqlStore, upgrade_database
from warmer.api import ApiServices, Readiness, create_app
from warmer.core.agents import AgentSpec, DynamicTail, Placeholder, StaticBlock
from warmer.core.errors import NotSupported
from warmer.core.model import (
    BoxCapacity,
    BoxSpec,
    CacheLayout,
    CacheStats,
    CompletionReport,
    EngineKind,
    ModelProfile,
    Prefix,
    RestartRecipe,
    WarmState,
)
from warmer.core.placement import PlacementConfig
from warmer.core.planner import PlannerConfig
from warmer.core.readiness import Route
from warmer.core.warm_budget import WarmBudget
from warmer.root.engines import SystemClock
from warmer.service.prewarm import PrewarmService, ReconcilerBackend
from warmer.service.reconciler import ComputedPrefix, Reconciler, ReconcilerConfig
from warmer.service.warming import WarmExecutor
from warmer.testing import is_probe

PREFIX_TOKENS = 1500
PROFILE = ModelProfile(
    name="m",
    engine=EngineKind.LLAMACPP,
    slots=4,
    context_length=4096,
    restart=RestartRecipe(sampled=None, constrained=None, burst_levels=(), long_prefill_tokens=16),
)


class TimedEngine:
    """Prefix caches per box; every prefix request takes `warm_seconds` (cold) or 1 ms (cached), and a box
    serves at most `slots` requests at once (an engine's parallel slots), the rest queue."""

    def __init__(self, box_ids: Sequence[str], warm_seconds: float, slots: int = 4) -> None:
        self.slots = {b: asyncio.Semaphore(slots) for b in box_ids}
        self.caches: dict[str, set[tuple[int, ...]]] = {b: set() for b in box_ids}
        self.warm_seconds = warm_seconds
        self.warms: Counter[str] = Counter()
        self.probes: Counter[str] = Counter()
        self.generation = 0

    async def health(self, box: BoxSpec) -> bool:
        return True

    async def epoch(self, box: BoxSpec) -> str:
        return f"gen-{self.generation}"

    async def complete_prefix(
        self,
        box: BoxSpec,
        prefix: Prefix,
        *,
        suffix: str = "",
        max_tokens: int = 1,
        slot: int | None = None,
        rank: int | None = None,
    ) -> CompletionReport:
        assert prefix.token_ids is not None
        (self.probes if is_probe(suffix) else self.warms)[box.id] += 1
        async with self.slots[box.id]:
            hit = prefix.token_ids in self.caches[box.id]
            await asyncio.sleep(0.001 if hit else self.warm_seconds)
            self.caches[box.id].add(prefix.token_ids)
        return CompletionReport(
            prompt_tokens=prefix.token_count + len(suffix),
            cached_tokens=prefix.token_count - 1 if hit else 0,
            wall_seconds=0.0,
            engine_seconds=0.001,
        )

    async def complete_prompt(
        self,
        box: BoxSpec,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float = 0.0,
        json_schema: dict[str, object] | None = None,
    ) -> CompletionReport:
        return CompletionReport(
            prompt_tokens=len(prompt), cached_tokens=0, wall_seconds=0.0, engine_seconds=0.0
        )

    async def render_chat(
        self, box: BoxSpec, messages: Sequence[dict[str, object]], tools: Sequence[dict[str, object]]
    ) -> str:
        raise NotSupported(box.id, "bench")

    async def tokenize(self, box: BoxSpec, text: str) -> list[int]:
        return [0] * (len(text) + 1)

    async def cache_layout(self, box: BoxSpec) -> CacheLayout:
        return CacheLayout()

    async def cache_stats(self, box: BoxSpec) -> CacheStats:
        raise NotSupported(box.id, "bench")

    async def capacity(self, box: BoxSpec) -> BoxCapacity:
        return BoxCapacity(source="bench")


class Source:
    async def __call__(self, spec: AgentSpec, profile: ModelProfile) -> ComputedPrefix:
        ids = tuple(range(3, PREFIX_TOKENS + 3))
        return ComputedPrefix(Prefix(text="p", token_count=len(ids), token_ids=ids), "bench")


@dataclass(frozen=True)
class NaiveAnswer:
    box_id: str | None
    state: WarmState | None
    routed: bool
    prefix_hash: str | None
    detail: str = ""
    routes: tuple[Route, ...] = ()


class NaiveBackend:
    """A pre-call hook without coalescing: each ask sends its own warm (round robin over the boxes)."""

    def __init__(self, boxes: Sequence[BoxSpec], executor: WarmExecutor, prefix: Prefix) -> None:
        self._boxes = list(boxes)
        self._executor = executor
        self._prefix = prefix
        self._next = 0

    def knows(self, agent_id: str) -> bool:
        return agent_id == "sales"

    async def ensure_warm(self, agent_id: str, wait_seconds: float) -> NaiveAnswer:
        box = self._boxes[self._next % len(self._boxes)]
        self._next += 1
        outcome = await self._executor.warm_and_verify(box, PROFILE, self._prefix)
        state = WarmState.WARM if outcome.verified else WarmState.FAILED
        return NaiveAnswer(box.id, state, False, self._prefix.hash)

    def routes_for(self, agent_id: str) -> Sequence[Route]:
        return ()

    def box(self, box_id: str) -> BoxSpec | None:
        return next((b for b in self._boxes if b.id == box_id), None)

    def slot(self, agent_id: str, box_id: str) -> int | None:
        return None

    async def recheck(self, box_id: str) -> None:
        return None

    def sent(self, agent_id: str, box_id: str, slot: int) -> None:
        return None


async def ready() -> Readiness:
    return Readiness(True)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def burst(
    client: httpx.AsyncClient, asks: int, wait_ms: int
) -> tuple[float, list[float], Counter[int]]:
    latencies: list[float] = []
    codes: Counter[int] = Counter()

    async def one(i: int) -> None:
        started = time.perf_counter()
        response = await client.post(
            "/v1/prewarm", json={"agent": "sales", "call_id": f"c{i}", "wait_ms": wait_ms}
        )
        latencies.append(time.perf_counter() - started)
        codes[response.status_code] += 1

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(asks)))
    return time.perf_counter() - started, latencies, codes


async def run(asks: int, box_count: int, warm_seconds: float) -> None:
    box_ids = [f"b{i}" for i in range(box_count)]
    boxes = [BoxSpec(b, f"http://{b}:8080", EngineKind.LLAMACPP, "m", slots=4) for b in box_ids]
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'warmer.db'}"
        upgrade_database(url)
        store = SqlStore.from_url(url)
        engine = TimedEngine(box_ids, warm_seconds)
        clock = SystemClock()
        agent = AgentSpec(
            id="sales",
            model="m",
            blocks=(StaticBlock("persona", "You are sales."),),
            tail=DynamicTail("Customer: {name}"),
            placeholders=(Placeholder("name", "name"),),
        )
        reconciler = Reconciler(
            engine=engine,
            store=store,
            clock=clock,
            boxes=boxes,
            profiles={"m": PROFILE},
            agents={"sales": agent},
            prefix_source=Source(),
            config=ReconcilerConfig(
                planner=PlannerConfig(
                    budget=WarmBudget(max_concurrent=2, tokens_per_second=1e7, burst_tokens=1e7),
                    ramp_seconds=0.0,
                    retire_idle_after_seconds=None,
                ),
                placement=PlacementConfig(min_group_size=box_count, max_group_size=box_count),
            ),
        )
        # Warm-ups done, prefix computed, but no prefix on any box yet: tick once with a gated engine.
        await reconciler.start()
        service = PrewarmService(ReconcilerBackend(reconciler), clock)
        app = create_app(ApiServices(registry=CollectorRegistry(), readiness=ready, prewarm=service))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://warmer", timeout=60) as client:
            # Bring the boxes up (restart warm-up) without warming the prefix: new epoch right after.
            for _ in range(3):
                await reconciler.tick()
                await reconciler.wait_idle()
            engine.generation += 1  # a fleet restart: every cache cold, warm-ups again
            for box_id in box_ids:
                engine.caches[box_id].clear()
            stopping = asyncio.Event()
            await reconciler.tick()  # sees the new epochs; the restart warm-ups start
            await reconciler.wait_idle()
            engine.warms.clear()
            engine.probes.clear()
            loop = asyncio.create_task(reconciler.run(stopping))
            seconds, latencies, codes = await burst(client, asks, wait_ms=10_000)
            report(
                "cold, coalesced (reconciler single-flight)", asks, seconds, latencies, codes, engine.warms
            )

            warm_seconds_total, warm_lat, warm_codes = await burst(client, asks, wait_ms=0)
            engine.warms.clear()
            report("warm prefix (steady state)", asks, warm_seconds_total, warm_lat, warm_codes, engine.warms)
            stopping.set()
            await loop

        # Baseline: the same HTTP path, but every ask warms its box itself (no single-flight).
        naive_engine = TimedEngine(box_ids, warm_seconds)
        naive = NaiveBackend(
            boxes, WarmExecutor(naive_engine, clock), (await Source()(agent, PROFILE)).prefix
        )
        naive_app = create_app(
            ApiServices(registry=CollectorRegistry(), readiness=ready, prewarm=PrewarmService(naive, clock))
        )
        transport = httpx.ASGITransport(app=naive_app)
        async with httpx.AsyncClient(transport=transport, base_url="http://warmer", timeout=60) as client:
            seconds, latencies, codes = await burst(client, asks, wait_ms=10_000)
        report("cold, no coalescing (baseline)", asks, seconds, latencies, codes, naive_engine.warms)
        await store.close()


def report(
    name: str, asks: int, seconds: float, latencies: list[float], codes: Counter[int], warms: Counter[str]
) -> None:
    print(
        f"| {name} | {asks} | {asks / seconds:,.0f} | {statistics.median(latencies) * 1000:,.1f} | "
        f"{percentile(latencies, 0.99) * 1000:,.1f} | {sum(warms.values())} ({len(warms)} boxes) | "
        f"{dict(sorted(codes.items()))} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--asks", type=int, default=1000)
    parser.add_argument("--boxes", type=int, default=3)
    parser.add_argument("--warm-ms", type=float, default=50.0, help="simulated cold prefill per warm request")
    args = parser.parse_args()
    print("| scenario | asks | asks/s | p50 ms | p99 ms | warm requests sent | HTTP codes |")
    print("|---|---|---|---|---|---|---|")
    asyncio.run(run(args.asks, args.boxes, args.warm_ms / 1000.0))


if __name__ == "__main__":
    main()
