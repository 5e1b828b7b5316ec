"""Planning at scale: placement + one full plan for 5,000 boxes and 20,000 agents, incremental re-placement
and re-planning after one edit, peak memory, and how much of the placement moves when one box is added or
removed (ideal: 1/N).

Every figure is a ratio against a baseline measured in the same run, on the same inputs: the algorithms as
they were before (`bench.baseline_placement`, `bench.baseline_planner`, kept verbatim), or a full
re-placement / full plan for the incremental steps. CPU seconds are `process_time` (robust on a shared
machine), the minimum over `--repeats` runs alternating with the baseline. Results are checked equal to the
baseline's before any figure is printed. Peak RSS comes from `resource.getrusage` in a fresh subprocess per
variant; traced peak from `tracemalloc` (run separately: tracing slows allocation-heavy code several-fold).

`--caps kv` runs the same steps on a fleet where prefix and token caps bind, as on llama.cpp boxes: each box
runs `--parallel` 8, 12 or 16 slots (`prefix_capacity`, in turn by box) sharing one 32,768-token KV pool
(`cache_capacity_tokens`). A box holds ~8 agents of ~3,500 prefix tokens on average (~28,600 tokens), so the
token cap refuses the busier boxes and the 8-slot cap a third of them, while every agent still finds its whole
group: the single pass with every cap checked (`capped.capped_pass`), not the pass by counts. Its placement
baseline is the placement as it was before the capped pass (`bench.baseline_greedy`, kept verbatim), checked
equal. `--caps slots` gives each box llama.cpp's usual 2, 3 or 4 slots (in turn) and no token cap: 5,000 boxes
then hold 15,000 prefixes for 20,000 agents with their own prefixes wanting 40,800 memberships, so the fleet
is short and coverage comes first (`greedy.coverage_first`): every agent that can get a box gets one, the
rest are reported unplaced; `PlacementState` re-places in full after every edit there.

Run: python -m bench.plan_scale [--boxes 5000] [--agents 20000] [--models 1] [--repeats 3] [--caps kv]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import resource
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TypeVar

from bench.baseline_greedy import place as baseline_greedy_place
from bench.baseline_placement import baseline_place
from bench.baseline_planner import baseline_plan
from warmer.core.model import BoxSpec, EngineKind, ModelProfile, WarmRecord, WarmState
from warmer.core.placement import (
    AgentDemand,
    Placement,
    PlacementConfig,
    PlacementState,
    handover,
    movement,
    place,
)
from warmer.core.placement.greedy import place_indexed
from warmer.core.placement.ranking import BoxIndex
from warmer.core.planner import (
    BoxObservation,
    Desired,
    Observed,
    PlannerConfig,
    PrefixRef,
    WarmupStatus,
    index_plan,
    plan,
    plan_boxes,
)

T = TypeVar("T")
CONFIG = PlacementConfig(
    max_agents_per_box=16, min_group_size=2, max_group_size=6, calls_per_minute_per_box=30.0
)
NOW = 10_000.0


KV_SLOTS = (8, 12, 16)  # --caps kv: llama.cpp --parallel per box, in turn
KV_POOL_TOKENS = 32_768  # --caps kv: one llama.cpp KV pool (--ctx-size), shared by the box's slots


def new_box(i: int | str, model: str, caps: str = "none") -> BoxSpec:
    box_id = f"box-{i:05d}" if isinstance(i, int) else i
    if caps == "slots":
        slots = 2 + (i if isinstance(i, int) else 0) % 3
        return BoxSpec(
            id=box_id,
            base_url="http://10.0.0.1:8080",
            engine=EngineKind.LLAMACPP,
            model=model,
            slots=slots,
            prefix_capacity=slots,
        )
    if caps == "kv":
        slots = KV_SLOTS[i % len(KV_SLOTS)] if isinstance(i, int) else KV_SLOTS[0]
        return BoxSpec(
            id=box_id,
            base_url="http://10.0.0.1:8080",
            engine=EngineKind.LLAMACPP,
            model=model,
            slots=slots,
            prefix_capacity=slots,
            cache_capacity_tokens=KV_POOL_TOKENS,
        )
    return BoxSpec(
        id=box_id,
        base_url="http://10.0.0.1:8000",
        engine=EngineKind.VLLM,
        model=model,
        slots=8,
        cache_capacity_tokens=200_000,
    )


def fleet(
    n_boxes: int, n_agents: int, n_models: int, caps: str = "none"
) -> tuple[list[BoxSpec], list[AgentDemand]]:
    models = [f"model-{m}" for m in range(n_models)]
    boxes = [new_box(i, models[i % len(models)], caps) for i in range(n_boxes)]
    agents = [
        AgentDemand(
            f"agent-{i:05d}",
            models[i % len(models)],
            prefix_tokens=2000 + (i % 7) * 500,
            calls_per_minute=(120.0 if i % 50 == 0 else 5.0),
        )
        for i in range(n_agents)
    ]
    return boxes, agents


class OneAtATime(BoxIndex):
    """The index without its numpy batch: every agent ranked by its own walk (pure-Python big-int lanes),
    as placement hashed before numpy became a dependency."""

    def prime(self, agents: Iterable[tuple[str, int, str]]) -> None:
        return None


def place_one_at_a_time(boxes: list[BoxSpec], agents: list[AgentDemand]) -> Placement:
    index = OneAtATime(CONFIG.hash_buckets, keep=False)
    for box in boxes:
        index.add(box.id, box.model)
    placement, _ = place_indexed({b.id: b for b in boxes}, index, agents, CONFIG, None)
    return placement


def world(
    boxes: list[BoxSpec], agents: list[AgentDemand], groups: dict[str, tuple[str, ...]]
) -> tuple[Desired, Observed]:
    """Half the (box, prefix) pairs warm (some due for keepalive), the rest cold: a realistic busy tick."""
    models = {b.model for b in boxes}
    profiles = {m: ModelProfile(name=m, engine=EngineKind.VLLM, keepalive_seconds=240.0) for m in models}
    prefixes = {a.agent_id: PrefixRef(f"p-{a.agent_id}", a.prefix_tokens) for a in agents}
    warm: dict[tuple[str, str, str], WarmRecord] = {}
    for n, (agent_id, group) in enumerate(sorted(groups.items())):
        for box_id in group[: len(group) // 2 + 1] if n % 2 else ():
            verified = NOW - (n % 300)
            ref = prefixes[agent_id]
            warm[(box_id, "e1", ref.hash)] = WarmRecord(
                box_id, "e1", ref.hash, WarmState.WARM, ref.tokens, verified, verified, verified
            )
    desired = Desired(
        boxes={b.id: b for b in boxes},
        profiles=profiles,
        agents=prefixes,
        assignment=groups,
        last_activity=dict.fromkeys(prefixes, NOW),
    )
    observed = Observed(
        boxes={b.id: BoxObservation(True, "e1", WarmupStatus.DONE, 0.0) for b in boxes}, warm=warm
    )
    return desired, observed


def cpu(fn: Callable[[], T]) -> tuple[T, float]:
    gc.collect()
    started = time.process_time()
    result = fn()
    return result, time.process_time() - started


def paired(new: Callable[[], T], old: Callable[[], object], repeats: int) -> tuple[T, float, float]:
    """Minimum CPU seconds of each over `repeats` alternating runs (noise on a shared machine only adds)."""
    news, olds, result = [], [], None
    for _ in range(repeats):
        result, seconds = cpu(new)
        news.append(seconds)
        olds.append(cpu(old)[1])
    assert result is not None
    return result, min(news), min(olds)


def traced(fn: Callable[[], object]) -> float:
    gc.collect()
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def rss_child(args: argparse.Namespace, variant: str) -> float:
    """Peak RSS (MiB) of a fresh interpreter that builds the inputs and runs one variant. Run before this
    process builds anything: Linux carries the parent's RSS at fork into the child's `ru_maxrss`."""
    command = [sys.executable, "-m", "bench.plan_scale", "--rss-variant", variant]
    command += ["--boxes", str(args.boxes), "--agents", str(args.agents), "--models", str(args.models)]
    command += ["--caps", args.caps]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return float(json.loads(out)["maxrss_mib"])


def run_variant(args: argparse.Namespace) -> None:
    boxes, agents = fleet(args.boxes, args.agents, args.models, args.caps)
    kept: list[object] = []
    if args.rss_variant == "baseline":
        placed = previous_place(args.caps)(boxes, agents, CONFIG)
        kept.append(baseline_plan(*world(boxes, agents, dict(placed.groups)), NOW, PlannerConfig()))
    elif args.rss_variant == "current":
        state = PlacementState(boxes, agents, CONFIG)  # kept: rankings, steps, takers
        desired, observed = world(boxes, agents, dict(state.placement().groups))
        index = index_plan(desired, observed, NOW, PlannerConfig())
        kept += [state, index, plan_boxes(desired, observed, NOW, PlannerConfig(), desired.boxes, index)]
    maxrss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    with open("/proc/self/status") as status:  # the kernel's own high-water mark, to cross-check
        hwm = next((line.split()[1] for line in status if line.startswith("VmHWM:")), "0")
    print(json.dumps({"maxrss_mib": maxrss_kib / 1024, "hwm_mib": int(hwm) / 1024, "kept": len(kept)}))


Row = tuple[str, float, float, str]  # step, CPU s, baseline CPU s, what the baseline is


def previous_place(caps: str) -> Callable[[list[BoxSpec], list[AgentDemand], PlacementConfig], Placement]:
    """The placement baseline: before the planning-at-scale work, or (caps binding) before the capped pass."""
    return baseline_greedy_place if caps != "none" else baseline_place


def full_steps(
    boxes: list[BoxSpec], agents: list[AgentDemand], repeats: int, caps: str
) -> tuple[list[Row], Placement]:
    baseline = previous_place(caps)
    placement, new_s, old_s = paired(
        lambda: place(boxes, agents, CONFIG), lambda: baseline(boxes, agents, CONFIG), repeats
    )
    assert placement == baseline(boxes, agents, CONFIG), "placement differs from the baseline"
    _, batched_s, lazy_s = paired(
        lambda: place(boxes, agents, CONFIG), lambda: place_one_at_a_time(boxes, agents), repeats
    )
    assert place_one_at_a_time(boxes, agents) == placement, "the numpy ranking changed the placement"
    state, state_s, _ = paired(lambda: PlacementState(boxes, agents, CONFIG), lambda: None, repeats)
    assert state.placement() == placement
    _, rebuild_s, _ = paired(state.rebuild, lambda: None, repeats)
    desired, observed = world(boxes, agents, dict(placement.groups))
    planned, plan_s, old_plan_s = paired(
        lambda: plan(desired, observed, NOW, PlannerConfig()),
        lambda: baseline_plan(desired, observed, NOW, PlannerConfig()),
        repeats,
    )
    assert planned == baseline_plan(desired, observed, NOW, PlannerConfig()), "plan differs from the baseline"
    prefix_of = {a: p.hash for a, p in desired.agents.items()}
    warm_pairs = {(k[0], k[2]) for k in observed.warm}
    _, handover_s = cpu(lambda: handover(placement.groups, placement.groups, prefix_of, warm_pairs))
    rows: list[Row] = [
        ("placement (place)", new_s, old_s, "previous place()"),
        ("placement, agents ranked in one numpy batch", batched_s, lazy_s, "one agent at a time"),
        ("placement, keeping state (PlacementState)", state_s, old_s, "previous place()"),
        ("re-place over kept rankings (rebuild)", rebuild_s, old_s, "previous place()"),
        (f"one full plan ({len(planned.actions):,} actions)", plan_s, old_plan_s, "previous plan()"),
        ("placement + full plan", new_s + plan_s, old_s + old_plan_s, "previous both"),
        ("re-place over kept rankings + full plan", rebuild_s + plan_s, old_s + old_plan_s, "previous both"),
        ("handover (move-before-switch)", handover_s, handover_s, "unchanged"),
    ]
    return rows, placement


def edit_steps(boxes: list[BoxSpec], agents: list[AgentDemand], full_s: float, caps: str) -> list[Row]:
    """One edit at a time on a kept state, each checked against a full `place` of the edited inputs."""
    state = PlacementState(boxes, agents, CONFIG)
    assert state.incremental or caps == "slots", (
        "every agent has a box: edits re-run only the agents they touch"
    )
    boxes, agents = list(boxes), list(agents)
    extra = new_box("box-new", boxes[0].model, caps)
    gone = boxes[len(boxes) // 3].id
    busier = dataclasses.replace(agents[7], calls_per_minute=150.0)
    newcomer = AgentDemand("agent-new", agents[0].model, 2500, calls_per_minute=45.0)
    edits: list[tuple[str, Callable[[], frozenset[str]], Callable[[], None]]] = [
        ("add one box", lambda: state.add_box(extra), lambda: boxes.append(extra)),
        (
            "remove one box",
            lambda: state.remove_box(gone),
            lambda: boxes.remove(next(b for b in boxes if b.id == gone)),
        ),
        ("add one agent", lambda: state.set_agent(newcomer), lambda: agents.append(newcomer)),
        (
            "one agent busier (group 2 -> 5)",
            lambda: state.set_agent(busier),
            lambda: agents.__setitem__(7, busier),
        ),
    ]
    rows: list[Row] = []
    for name, edit, mirror in edits:
        changed, seconds = cpu(edit)
        mirror()
        assert state.placement() == place(boxes, agents, CONFIG), f"{name}: incremental differs from full"
        rows.append((f"incremental: {name} ({len(changed)} agents moved)", seconds, full_s, "full place()"))
    # the reconciler's shape: every input rebuilt, one agent quieter, and the routing as the placement
    routing = dict(state.placement().groups)
    state.set_previous(routing)  # settled: routing is the placement (not timed: every agent re-runs once)
    agents[50] = dataclasses.replace(agents[50], calls_per_minute=5.0)
    changed, seconds = cpu(lambda: state.update(list(boxes), list(agents), previous=routing))
    assert state.placement() == place(boxes, agents, CONFIG, previous=routing)
    rows.append(
        (f"update(): diff all inputs, 1 edit found ({len(changed)} moved)", seconds, full_s, "full place()")
    )
    return rows


def replan_step(placement: Placement, boxes: list[BoxSpec], agents: list[AgentDemand], full_s: float) -> Row:
    """A pre-call ask for one agent: re-derive its boxes' wants and plan those boxes alone."""
    desired, observed = world(boxes, agents, dict(placement.groups))
    index = index_plan(desired, observed, NOW, PlannerConfig())
    asked = dataclasses.replace(desired, precall=frozenset({"agent-00011"}))

    def replan() -> object:
        again = index.refresh_agents(asked, NOW, PlannerConfig(), ["agent-00011"])
        return plan_boxes(asked, observed, NOW, PlannerConfig(), again, index)

    alone, seconds = cpu(replan)
    full = plan(asked, observed, NOW, PlannerConfig())
    boxes_of = set(placement.groups["agent-00011"])
    assert alone.actions == tuple(a for a in full.actions if a.box_id in boxes_of)  # type: ignore[attr-defined]
    return ("incremental: plan one agent's boxes (pre-call ask)", seconds, full_s, "full plan()")


def rss_rows(args: argparse.Namespace) -> list[tuple[str, float, float]]:
    inputs = rss_child(args, "inputs")
    current, baseline = rss_child(args, "current"), rss_child(args, "baseline")
    return [
        ("peak RSS, fresh process: inputs + placement + plan", current, baseline),
        ("peak RSS, fresh process: the inputs alone", inputs, inputs),
    ]


def memory_rows(boxes: list[BoxSpec], agents: list[AgentDemand], caps: str) -> list[tuple[str, float, float]]:
    baseline_place = previous_place(caps)
    placed = place(boxes, agents, CONFIG)
    desired, observed = world(boxes, agents, dict(placed.groups))
    return [
        (
            "traced peak: placement",
            traced(lambda: place(boxes, agents, CONFIG)),
            traced(lambda: baseline_place(boxes, agents, CONFIG)),
        ),
        (
            "traced peak: PlacementState",
            traced(lambda: PlacementState(boxes, agents, CONFIG)),
            traced(lambda: baseline_place(boxes, agents, CONFIG)),
        ),
        (
            "traced peak: full plan",
            traced(lambda: plan(desired, observed, NOW, PlannerConfig())),
            traced(lambda: baseline_plan(desired, observed, NOW, PlannerConfig())),
        ),
    ]


def stability(
    boxes: list[BoxSpec], agents: list[AgentDemand], placement: Placement, per_model: float, caps: str
) -> None:
    removed_id = boxes[len(boxes) // 3].id
    without = place([b for b in boxes if b.id != removed_id], agents, CONFIG)
    with_extra = place([*boxes, new_box("box-new", boxes[0].model, caps)], agents, CONFIG)
    remove_move = movement(placement.groups, without.groups)
    add_move = movement(placement.groups, with_extra.groups)
    removed_share = sum(removed_id in g for g in placement.groups.values()) / remove_move.memberships_before
    print(f"| {'fleet change':<22} | {'moved':>8} | {'ideal':>8} | {'agents changed':>14} |")
    print(f"|{'-' * 24}|{'-' * 10}|{'-' * 10}|{'-' * 16}|")
    for name, moved, ideal in (
        ("remove one box", remove_move, removed_share),
        ("add one box", add_move, 1 / (per_model + 1)),
    ):
        print(f"| {name:<22} | {moved.fraction_moved:>8.5f} | {ideal:>8.5f} | {moved.agents_changed:>14} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--boxes", type=int, default=5000)
    parser.add_argument("--agents", type=int, default=20000)
    parser.add_argument("--models", type=int, default=1, help="models the fleet is split over")
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per figure (the minimum)")
    parser.add_argument(
        "--caps", choices=["none", "kv", "slots"], default="none", help="caps that bind (docstring)"
    )
    parser.add_argument("--rss-variant", choices=["inputs", "baseline", "current"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_variant:
        run_variant(args)
        return
    rss = rss_rows(args)
    boxes, agents = fleet(args.boxes, args.agents, args.models, args.caps)
    rows, placement = full_steps(boxes, agents, args.repeats, args.caps)
    full_place_s, full_plan_s = rows[0][1], rows[4][1]
    rows += edit_steps(boxes, agents, full_place_s, args.caps)
    rows.append(replan_step(placement, boxes, agents, full_plan_s))
    load = Counter(b for g in placement.groups.values() for b in g)
    memberships = sum(load.values())
    print(
        f"boxes={args.boxes} agents={args.agents} models={args.models} caps={args.caps}"
        f" memberships={memberships}"
        f" unplaced={len(placement.unplaced)} short={len(placement.short())}"
        f" agents/box max={max(load.values())} mean={memberships / len(load):.1f}; results checked equal"
    )
    print()
    print(f"| {'step':<58} | {'CPU ms':>9} | {'baseline ms':>11} | {'ratio':>6} | baseline |")
    print(f"|{'-' * 60}|{'-' * 11}|{'-' * 13}|{'-' * 8}|----------|")
    for name, seconds, base, what in rows:
        print(
            f"| {name:<58} | {seconds * 1e3:>9.1f} | {base * 1e3:>11.1f} | {seconds / base:>6.3f} | {what} |"
        )
    print()
    print(f"| {'memory':<52} | {'MiB':>7} | {'baseline MiB':>12} | {'ratio':>6} |")
    print(f"|{'-' * 54}|{'-' * 9}|{'-' * 14}|{'-' * 8}|")
    for name, mib, base_mib in rss + memory_rows(boxes, agents, args.caps):
        print(f"| {name:<52} | {mib:>7.1f} | {base_mib:>12.1f} | {mib / base_mib:>6.2f} |")
    print()
    stability(boxes, agents, placement, args.boxes / args.models, args.caps)


if __name__ == "__main__":
    main()
