"""Fakes at our own seams for the dialer tests: a clock that never sleeps and an engine port that keeps a
per-box prefix cache and counts every request it receives, the way a real engine's counters would."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from warmer.adapters.store import SqlStore
from warmer.core.agents import AgentSpec, DynamicTail, Placeholder, StaticBlock
from warmer.core.errors import NotSupported
from warmer.core.model import (
    BoxSpec,
    CacheStats,
    CompletionReport,
    EngineKind,
    ModelProfile,
    Prefix,
    RestartRecipe,
)
from warmer.core.placement import PlacementConfig
from warmer.core.planner import PlannerConfig, WarmBudget
from warmer.service.reconciler import ComputedPrefix, Reconciler, ReconcilerConfig

PREFIX_TOKENS = 400
PROFILE = ModelProfile(
    name="m",
    engine=EngineKind.LLAMACPP,
    slots=2,
    context_length=1024,
    keepalive_seconds=240.0,
    restart=RestartRecipe(burst_levels=(1,), long_prefill_margin_tokens=64),
)
PROBE_MARK = "\n#probe"


class FakeClock:
    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


class CountingEngine:
    """Per-box prefix caches; `warm_requests[box]` counts prefix requests that are not probes.

    `gate`, when set, holds every prefix request until it is opened (so a burst piles up behind a warm)."""

    def __init__(self, box_ids: Sequence[str]) -> None:
        self.caches: dict[str, set[tuple[int, ...]]] = {box_id: set() for box_id in box_ids}
        self.generation: Counter[str] = Counter()
        self.warm_requests: Counter[str] = Counter()
        self.probe_requests: Counter[str] = Counter()
        self.prefix_log: list[tuple[str, str, float]] = []  # (box, warm|probe, clock time)
        self.gate: asyncio.Event | None = None
        self.clock: FakeClock | None = None

    def restart(self, box_id: str) -> None:
        self.generation[box_id] += 1
        self.caches[box_id].clear()

    async def health(self, box: BoxSpec) -> bool:
        return True

    async def epoch(self, box: BoxSpec) -> str:
        return f"gen-{self.generation[box.id]}"

    async def complete_prefix(
        self, box: BoxSpec, prefix: Prefix, *, suffix: str = "", max_tokens: int = 1
    ) -> CompletionReport:
        if self.gate is not None:
            await self.gate.wait()
        kind = "probe" if suffix.startswith(PROBE_MARK) else "warm"
        (self.probe_requests if kind == "probe" else self.warm_requests)[box.id] += 1
        self.prefix_log.append((box.id, kind, self.clock.now() if self.clock is not None else 0.0))
        assert prefix.token_ids is not None
        cache = self.caches[box.id]
        hit = prefix.token_ids in cache
        cache.add(prefix.token_ids)
        return CompletionReport(
            prompt_tokens=prefix.token_count + len(suffix),
            cached_tokens=prefix.token_count - 1 if hit else 0,  # the last token is recomputed
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
        tokens = len(await self.tokenize(box, prompt))
        return CompletionReport(prompt_tokens=tokens, cached_tokens=0, wall_seconds=0.0, engine_seconds=0.001)

    async def render_chat(
        self, box: BoxSpec, messages: Sequence[dict[str, object]], tools: Sequence[dict[str, object]]
    ) -> str:
        raise NotSupported(box.id, "fake")

    async def tokenize(self, box: BoxSpec, text: str) -> list[int]:
        return [1] + [0] * len(text)

    async def cache_stats(self, box: BoxSpec) -> CacheStats:
        raise NotSupported(box.id, "fake")


def agent_spec(agent_id: str) -> AgentSpec:
    return AgentSpec(
        id=agent_id,
        model="m",
        blocks=(StaticBlock("persona", f"You are {agent_id}, a polite caller."),),
        tail=DynamicTail("Customer: {customer_name}"),
        placeholders=(Placeholder("customer_name", "name"),),
    )


class FakePrefixSource:
    async def __call__(self, spec: AgentSpec, profile: ModelProfile) -> ComputedPrefix:
        seed = sum(map(ord, spec.id))
        ids = tuple([1] + [(seed + i) % 250 + 3 for i in range(PREFIX_TOKENS - 1)])
        return ComputedPrefix(
            Prefix(text=f"prefix of {spec.id}", token_count=len(ids), token_ids=ids), "fake"
        )


def box_specs(box_ids: Sequence[str]) -> list[BoxSpec]:
    return [
        BoxSpec(id=b, base_url=f"http://{b}.fleet.test:8080", engine=EngineKind.LLAMACPP, model="m", slots=2)
        for b in box_ids
    ]


@dataclass
class DialerWorld:
    reconciler: Reconciler
    engine: CountingEngine
    store: SqlStore
    clock: FakeClock


def dialer_world(
    store_url: str,
    box_ids: Sequence[str] = ("b1", "b2"),
    agents: Sequence[str] = ("sales",),
    *,
    planner: PlannerConfig | None = None,
    placement: PlacementConfig | None = None,
    demand: Callable[[], Mapping[str, float]] | None = None,
) -> DialerWorld:
    clock = FakeClock()
    engine = CountingEngine(box_ids)
    engine.clock = clock
    store = SqlStore.from_url(store_url)
    reconciler = Reconciler(
        engine=engine,
        store=store,
        clock=clock,
        boxes=box_specs(box_ids),
        profiles={"m": PROFILE},
        agents={a: agent_spec(a) for a in agents},
        prefix_source=FakePrefixSource(),
        config=ReconcilerConfig(
            planner=planner or PlannerConfig(budget=WarmBudget(max_concurrent=2, tokens_per_second=1e6)),
            placement=placement or PlacementConfig(min_group_size=2),
        ),
        demand=demand,
    )
    return DialerWorld(reconciler, engine, store, clock)


async def settle(reconciler: Reconciler, rounds: int = 8) -> None:
    """Tick and let every started action finish, a bounded number of times (no sleeping)."""
    for _ in range(rounds):
        await reconciler.tick()
        await reconciler.drain()
    await reconciler.tick()


def routed_boxes(reconciler: Reconciler, agent_id: str) -> list[str]:
    return sorted(route.box_id for route in reconciler.snapshot().routes().get(agent_id, ()))
