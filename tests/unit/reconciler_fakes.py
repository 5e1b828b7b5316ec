"""Fakes at our own seams for tests that drive the real Reconciler: a clock that never sleeps, an engine
port that keeps a per-box prefix cache and logs/counts every request it receives (the way a real engine's
counters would), a per-agent prefix source, and a builder for the whole world over a real SqlStore."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from warmer.adapters.store import SqlStore
from warmer.core.agents import AgentSpec, DynamicTail, Placeholder, StaticBlock
from warmer.core.errors import EngineError, LeaseLost, NotSupported
from warmer.core.fleet_pacing import FleetBudget
from warmer.core.gate import GateConfig
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
    WarmRecord,
    WarmState,
)
from warmer.core.placement import PlacementConfig
from warmer.core.planner import PlannerConfig
from warmer.core.warm_budget import WarmBudget
from warmer.service.reconciler import ComputedPrefix, ReconcileObserver, Reconciler, ReconcilerConfig
from warmer.service.replicas.replica_gate import ReplicaGate
from warmer.testing import is_probe

PREFIX_TOKENS = 500
PROFILE = ModelProfile(
    name="m",
    engine=EngineKind.LLAMACPP,
    slots=2,
    context_length=1024,
    keepalive_seconds=240.0,
    restart=RestartRecipe(burst_levels=(1, 4), long_prefill_margin_tokens=64),
)


class FakeClock:
    def __init__(self, start: float = 1_000_000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


@dataclass
class FakeBox:
    """One engine box. With `holds` set, its cache keeps that many prompts, least recently used out first
    (llama.cpp: one prompt per slot), and `capacity()` reports it the way llama-server's /props does."""

    healthy: bool = True
    generation: int = 0
    cache: dict[tuple[int, ...], None] = field(default_factory=dict)  # insertion order = LRU order
    holds: int | None = None
    pinnable: bool = False  # `holds` slots that a request may name (llama.cpp id_slot)
    # Prompts a host prompt cache (llama-server `--cache-ram`) keeps beyond the slots: a prompt a named
    # request pushes out of its slot is kept there, and a request for it restores it into the slot it runs
    # in (server-task.cpp `server_prompt_cache::alloc`/`load`). Like llama-server, `capacity()` does not
    # report it.
    host: int = 0

    slot_prompts: dict[int, tuple[int, ...]] = field(default_factory=dict)  # pinnable: what each slot holds

    def use(self, prompt: tuple[int, ...], slot: int | None = None) -> bool:
        """Send `prompt` through the cache: True when it was held; it is then the most recent. On pinnable
        slots a request naming one replaces what that slot held (llama.cpp: a slot holds one prompt)."""
        if slot is not None and self.pinnable:
            hit = self.slot_prompts.get(slot) == prompt or (self.host > 0 and prompt in self.cache)
            old = self.slot_prompts.get(slot)
            self.slot_prompts[slot] = prompt
            if old is not None and old != prompt and old not in self.slot_prompts.values() and not self.host:
                self.cache.pop(old, None)
        else:
            hit = prompt in self.cache
        self.cache.pop(prompt, None)
        self.cache[prompt] = None
        while self.holds is not None and len(self.cache) > self.holds + self.host:
            evicted = next(iter(self.cache))
            del self.cache[evicted]
            self.slot_prompts = {s: p for s, p in self.slot_prompts.items() if p != evicted}
        return hit


class FakeEngine:
    """Per-box prefix caches and a request log.

    `log` holds (box, warm|probe|prompt, detail); `warm_requests[box]` / `probe_requests[box]` count prefix
    requests and `prefix_log` holds (box, warm|probe, clock time) when a `clock` is set. `gate`, when set,
    holds every warm/probe request until it is opened (so a burst piles up behind a warm)."""

    def __init__(self, box_ids: Sequence[str], *, space_tokens: int = 1) -> None:
        self.boxes = {box_id: FakeBox() for box_id in box_ids}
        self.log: list[tuple[str, str, str]] = []  # (box, kind, detail)
        self.prompts: list[tuple[str, str, dict[str, object] | None, float]] = []
        self.warm_requests: Counter[str] = Counter()
        self.probe_requests: Counter[str] = Counter()
        self.prefix_log: list[tuple[str, str, float]] = []  # (box, warm|probe, clock time)
        self.slots_named: list[tuple[str, str, int | None]] = []  # (box, warm|probe, id_slot sent)
        self.in_flight_prompts = 0
        self.max_in_flight_prompts = 0
        self.gate: asyncio.Event | None = None
        self.clock: FakeClock | None = None
        self.fail_constrained = False
        # called with (box, slot named) after each warm request, before its probe: what lands in the engine
        # between a warm and its verification (a call's turn in that slot; raising fails the warm)
        self.after_warm: Callable[[str, int | None], None] | None = None
        self.lies = False  # every report claims the whole prompt cached, whatever the cache holds
        self.space_tokens = space_tokens

    def restart(self, box_id: str) -> None:
        box = self.boxes[box_id]
        box.generation += 1
        box.cache.clear()

    def warms(self, box_id: str | None = None) -> list[tuple[str, str, str]]:
        return [e for e in self.log if e[1] == "warm" and (box_id is None or e[0] == box_id)]

    def probes(self, box_id: str | None = None) -> list[tuple[str, str, str]]:
        return [e for e in self.log if e[1] == "probe" and (box_id is None or e[0] == box_id)]

    async def health(self, box: BoxSpec) -> bool:
        return self.boxes[box.id].healthy

    async def epoch(self, box: BoxSpec) -> str:
        return f"gen-{self.boxes[box.id].generation}"

    async def complete_prefix(
        self, box: BoxSpec, prefix: Prefix, *, suffix: str = "", max_tokens: int = 1, slot: int | None = None
    ) -> CompletionReport:
        if self.gate is not None:
            await self.gate.wait()
        kind = "probe" if is_probe(suffix) else "warm"
        self.log.append((box.id, kind, suffix))
        (self.probe_requests if kind == "probe" else self.warm_requests)[box.id] += 1
        self.prefix_log.append((box.id, kind, self.clock.now() if self.clock is not None else 0.0))
        assert prefix.token_ids is not None
        hit = self.boxes[box.id].use(prefix.token_ids, slot)
        self.slots_named.append((box.id, kind, slot))
        if kind == "warm" and self.after_warm is not None:
            self.after_warm(box.id, slot)
        cached = prefix.token_count - 1 if hit or self.lies else 0  # llama.cpp recomputes the last token
        return CompletionReport(
            prompt_tokens=prefix.token_count + len(suffix),
            cached_tokens=cached,
            wall_seconds=0.0,
            engine_seconds=0.001,
            slot=slot,
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
        self.log.append((box.id, "prompt", prompt[:20]))
        self.prompts.append((box.id, prompt, json_schema, temperature))
        if json_schema is not None and self.fail_constrained:
            raise EngineError(box.id, "grammar backend crashed")
        self.in_flight_prompts += 1
        self.max_in_flight_prompts = max(self.max_in_flight_prompts, self.in_flight_prompts)
        await asyncio.sleep(0)  # let a concurrent burst overlap
        self.in_flight_prompts -= 1
        tokens = len(await self.tokenize(box, prompt))
        cached = tokens - 1 if self.lies else 0
        return CompletionReport(
            prompt_tokens=tokens, cached_tokens=cached, wall_seconds=0.0, engine_seconds=0.01
        )

    async def render_chat(
        self, box: BoxSpec, messages: Sequence[dict[str, object]], tools: Sequence[dict[str, object]]
    ) -> str:
        raise NotSupported(box.id, "fake")

    async def tokenize(self, box: BoxSpec, text: str) -> list[int]:
        # BOS + one token per char, a space costs `space_tokens` (the SPM byte vocabulary spends 3).
        return [1] + [0] * (len(text) + text.count(" ") * (self.space_tokens - 1))

    async def cache_layout(self, box: BoxSpec) -> CacheLayout:
        return CacheLayout()

    async def cache_stats(self, box: BoxSpec) -> CacheStats:
        raise NotSupported(box.id, "fake")

    async def capacity(self, box: BoxSpec) -> BoxCapacity:
        fake = self.boxes[box.id]
        return BoxCapacity(
            prefixes=fake.holds, pinnable_slots=fake.holds if fake.pinnable else None, source="fake"
        )


class CountingEngine(FakeEngine):
    """One replica's view of a shared FakeEngine (same boxes, same caches) counting its own polls."""

    def __init__(self, shared: FakeEngine) -> None:
        super().__init__(())
        self.boxes, self.clock = shared.boxes, shared.clock
        self.polls: Counter[tuple[str, str]] = Counter()  # (box, health|epoch) -> requests

    async def health(self, box: BoxSpec) -> bool:
        self.polls[(box.id, "health")] += 1
        return await super().health(box)

    async def epoch(self, box: BoxSpec) -> str:
        self.polls[(box.id, "epoch")] += 1
        return await super().epoch(box)

    def polled(self) -> set[str]:
        return {box_id for box_id, _kind in self.polls}


def agent(agent_id: str, text: str | None = None) -> AgentSpec:
    """A one-block agent on model "m"; `text` is its persona block (default: "You are {agent_id}.")."""
    return AgentSpec(
        id=agent_id,
        model="m",
        blocks=(StaticBlock("persona", f"You are {agent_id}." if text is None else text),),
        tail=DynamicTail("Customer: {customer_name}"),
        placeholders=(Placeholder("customer_name", "name"),),
    )


class FakePrefixSource:
    """A distinct prefix per agent, PREFIX_TOKENS long, as token ids (what the offline source yields)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def __call__(self, spec: AgentSpec, profile: ModelProfile) -> ComputedPrefix:
        self.calls.append(spec.id)
        return self.compute(spec)

    def compute(self, spec: AgentSpec) -> ComputedPrefix:
        seed = sum(map(ord, spec.id))
        ids = tuple([1] + [(seed + i) % 250 + 3 for i in range(PREFIX_TOKENS - 1)])
        return ComputedPrefix(
            Prefix(text=f"prefix of {spec.id}", token_count=len(ids), token_ids=ids), "fake"
        )


class SpecTextPrefixSource(FakePrefixSource):
    """A prefix that depends on the spec's static text, so a prompt change changes the prefix."""

    def compute(self, spec: AgentSpec) -> ComputedPrefix:
        text = "\n".join(block.text for block in spec.blocks)
        ids = tuple([1] + [ord(c) % 250 + 3 for c in text] + [7] * 200)
        return ComputedPrefix(Prefix(text=text, token_count=len(ids), token_ids=ids), "fake")


def boxes(*box_ids: str, prefix_capacity: int | None = None) -> list[BoxSpec]:
    return [
        BoxSpec(
            id=b,
            base_url=f"http://{b}:8080",
            engine=EngineKind.LLAMACPP,
            model="m",
            slots=2,
            prefix_capacity=prefix_capacity,
        )
        for b in box_ids
    ]


@dataclass
class World:
    reconciler: Reconciler
    engine: FakeEngine
    store: SqlStore
    clock: FakeClock
    source: FakePrefixSource


class FencedOutStore(SqlStore):
    """The real store, except that the writes of the boxes in `fenced_warms` / `fenced_epochs` are refused as
    the lease fence refuses them: another replica took the box between this replica's check and its write."""

    fenced_warms: frozenset[str] = frozenset()
    fenced_epochs: frozenset[str] = frozenset()

    async def put_warm(self, record: WarmRecord, *, reason: str, previous: WarmState | None) -> None:
        if record.box_id in self.fenced_warms:
            raise LeaseLost(f"box {record.box_id!r}: replica 'r1' no longer holds its lease; not written")
        await super().put_warm(record, reason=reason, previous=previous)

    async def record_epoch(self, box_id: str, epoch: str, at: float) -> bool:
        if box_id in self.fenced_epochs:
            raise LeaseLost(f"box {box_id!r}: replica 'r1' no longer holds its lease; not written")
        return await super().record_epoch(box_id, epoch, at)

    async def record_epochs(
        self, seen: Sequence[tuple[str, str, float]], *, drop_others: bool = False
    ) -> frozenset[str]:
        refused = frozenset(box_id for box_id, _, _ in seen if box_id in self.fenced_epochs)
        kept = [s for s in seen if s[0] not in refused]
        return refused | await super().record_epochs(kept, drop_others=drop_others)


def world(
    store_url: str,
    box_ids: Sequence[str] = ("b1", "b2"),
    agents: Sequence[str] = ("sales",),
    *,
    planner: PlannerConfig | None = None,
    placement: PlacementConfig | None = None,
    engine: FakeEngine | None = None,
    clock: FakeClock | None = None,
    min_group: int = 2,
    specs: Mapping[str, AgentSpec] | None = None,
    source: FakePrefixSource | None = None,
    demand: Callable[[], Mapping[str, float]] | None = None,
    observer: ReconcileObserver | None = None,
    store_class: type[SqlStore] = SqlStore,
    slow_polls_allowed: int = 1,
    lend_seconds: float = 60.0,
    gate: GateConfig | None = None,
    fleet_budget: FleetBudget | None = None,
    prefix_capacity: int | None = None,
) -> World:
    """The real Reconciler over a FakeEngine, a FakeClock and a SqlStore on `store_url` (migrated).

    `specs` overrides the default `agent(id)` for each of `agents`; `placement` overrides `min_group`;
    `store_class` is the SqlStore (sub)class every part of the reconciler writes through."""
    engine = engine or FakeEngine(box_ids)
    clock = clock or FakeClock()
    if engine.clock is None:
        engine.clock = clock
    store = store_class.from_url(store_url)
    source = source or FakePrefixSource()
    reconciler = Reconciler(
        engine=engine,
        store=store,
        clock=clock,
        boxes=boxes(*box_ids, prefix_capacity=prefix_capacity),
        profiles={"m": PROFILE},
        agents=dict(specs) if specs is not None else {a: agent(a) for a in agents},
        prefix_source=source,
        config=ReconcilerConfig(
            planner=planner or PlannerConfig(budget=WarmBudget(max_concurrent=2, tokens_per_second=1e6)),
            placement=placement or PlacementConfig(min_group_size=min_group),
            health_slow_polls_allowed=slow_polls_allowed,
            precall_lend_seconds=lend_seconds,
            gate=gate or GateConfig(),
            fleet_budget=fleet_budget or FleetBudget(),
        ),
        demand=demand,
        observer=observer,
    )
    return World(reconciler, engine, store, clock, source)


def replica_reconciler(
    engine: FakeEngine,
    store: SqlStore,
    clock: FakeClock,
    box_ids: Sequence[str],
    replicas: ReplicaGate,
    *,
    health_poll_seconds: float = 0.0,
) -> Reconciler:
    """One replica's real Reconciler over the fake fleet (agents sales and support, groups of 2), behind
    `replicas`: the wiring the replica tests and bench.holder_polls share."""
    return Reconciler(
        engine=engine,
        store=store,
        clock=clock,
        boxes=boxes(*box_ids),
        profiles={"m": PROFILE},
        agents={a: agent(a) for a in ("sales", "support")},
        prefix_source=FakePrefixSource(),
        config=ReconcilerConfig(
            planner=PlannerConfig(budget=WarmBudget(max_concurrent=2, tokens_per_second=1e6)),
            placement=PlacementConfig(min_group_size=2),
            health_poll_seconds=health_poll_seconds,
        ),
        replicas=replicas,
    )


async def settle(reconciler: Reconciler, rounds: int = 10) -> None:
    """Tick and let every started action finish, a bounded number of times (no sleeping)."""
    for _ in range(rounds):
        await reconciler.tick()
        await reconciler.wait_idle()
    await reconciler.tick()


def route_boxes(reconciler: Reconciler, agent_id: str) -> list[str]:
    """The agent's routed boxes in route order."""
    return [route.box_id for route in reconciler.snapshot().routes().get(agent_id, ())]


def routed_boxes(reconciler: Reconciler, agent_id: str) -> list[str]:
    """The agent's routed boxes, sorted."""
    return sorted(route_boxes(reconciler, agent_id))
