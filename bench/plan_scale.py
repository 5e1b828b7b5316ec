"""Planning at scale: placement + one full plan for 5,000 boxes and 20,000 agents; time, peak memory,
and how much of the placement moves when one box is added or removed (ideal: 1/N).

Run: python -m bench.plan_scale [--boxes 5000] [--agents 20000] [--models 1]
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

from warmer.core.model import BoxSpec, EngineKind, ModelProfile, WarmRecord, WarmState
from warmer.core.placement import AgentDemand, Placement, PlacementConfig, handover, movement, place
from warmer.core.planner import (
    BoxObservation,
    Desired,
    Observed,
    PlannerConfig,
    PrefixRef,
    WarmupStatus,
    plan,
)

T = TypeVar("T")


def measure(fn: Callable[[], T]) -> tuple[T, float, float]:
    """CPU seconds of one plain call (robust on a shared machine), and peak traced MiB of a second call
    under tracemalloc (tracing slows allocation-heavy code several-fold, so the two are measured apart)."""
    gc.collect()
    started = time.process_time()
    result = fn()
    seconds = time.process_time() - started
    gc.collect()
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return result, seconds, peak / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--boxes", type=int, default=5000)
    parser.add_argument("--agents", type=int, default=20000)
    parser.add_argument("--models", type=int, default=1, help="models the fleet is split over")
    args = parser.parse_args()

    models = [f"model-{m}" for m in range(args.models)]
    boxes = [
        BoxSpec(
            id=f"box-{i:05d}",
            base_url=f"http://10.{i // 250}.{i % 250}.1:8000",
            engine=EngineKind.VLLM,
            model=models[i % len(models)],
            slots=8,
            cache_capacity_tokens=200_000,
        )
        for i in range(args.boxes)
    ]
    agents = [
        AgentDemand(
            f"agent-{i:05d}",
            models[i % len(models)],
            prefix_tokens=2000 + (i % 7) * 500,
            calls_per_minute=(120.0 if i % 50 == 0 else 5.0),
        )
        for i in range(args.agents)
    ]
    config = PlacementConfig(
        max_agents_per_box=16, min_group_size=2, max_group_size=6, calls_per_minute_per_box=30.0
    )

    placement, place_s, place_mib = measure(lambda: place(boxes, agents, config))

    profiles = {m: ModelProfile(name=m, engine=EngineKind.VLLM, keepalive_seconds=240.0) for m in models}
    prefixes = {a.agent_id: PrefixRef(f"p-{a.agent_id}", a.prefix_tokens) for a in agents}
    now = 10_000.0
    # Half the (box, prefix) pairs are warm (some due for keepalive), the rest cold: a realistic busy tick.
    warm: dict[tuple[str, str, str], WarmRecord] = {}
    for n, (agent_id, group) in enumerate(placement.groups.items()):
        for box_id in group[: len(group) // 2 + 1] if n % 2 else ():
            verified = now - (n % 300)
            warm[(box_id, "e1", prefixes[agent_id].hash)] = WarmRecord(
                box_id,
                "e1",
                prefixes[agent_id].hash,
                WarmState.WARM,
                prefixes[agent_id].tokens,
                updated_at=verified,
                warmed_at=verified,
                verified_at=verified,
            )
    desired = Desired(
        boxes={b.id: b for b in boxes},
        profiles=profiles,
        agents=prefixes,
        assignment=placement.groups,
        last_activity=dict.fromkeys(prefixes, now),
    )
    observed = Observed(
        boxes={b.id: BoxObservation(True, "e1", WarmupStatus.DONE, 0.0) for b in boxes}, warm=warm
    )
    planned, plan_s, plan_mib = measure(lambda: plan(desired, observed, now, PlannerConfig()))

    warm_pairs = {(k[0], k[2]) for k in warm}
    moved_handover, handover_s, handover_mib = measure(
        lambda: handover(
            placement.groups, placement.groups, {a: p.hash for a, p in prefixes.items()}, warm_pairs
        ),
    )
    assert moved_handover.routing == {a: tuple(g) for a, g in placement.groups.items()}

    # Stability: placement is capped, so measure on the same fleet with one box more / one box less.
    removed_id = boxes[len(boxes) // 3].id
    without: Placement = place([b for b in boxes if b.id != removed_id], agents, config)
    extra = BoxSpec(
        id="box-new",
        base_url="http://10.99.0.1:8000",
        engine=EngineKind.VLLM,
        model=models[0],
        slots=8,
        cache_capacity_tokens=200_000,
    )
    with_extra: Placement = place([*boxes, extra], agents, config)
    per_model = args.boxes / len(models)
    remove_move = movement(placement.groups, without.groups)
    add_move = movement(placement.groups, with_extra.groups)
    # the ideal: only the removed box's memberships move / the new box takes its fair share of one model
    removed_share = sum(removed_id in g for g in placement.groups.values()) / remove_move.memberships_before
    load = Counter(b for g in placement.groups.values() for b in g)

    memberships = sum(len(g) for g in placement.groups.values())
    print(
        f"boxes={args.boxes} agents={args.agents} models={len(models)} memberships={memberships}"
        f" unplaced={len(placement.unplaced)} short={len(placement.short())}"
        f" agents/box max={max(load.values())} mean={memberships / len(load):.1f}"
    )
    print()
    print(f"| {'step':<34} | {'CPU s':>8} | {'peak MiB':>8} |")
    print(f"|{'-' * 36}|{'-' * 10}|{'-' * 10}|")
    print(f"| {'placement (place)':<34} | {place_s:>8.2f} | {place_mib:>8.1f} |")
    print(f"| {f'one full plan ({len(planned.actions)} actions)':<34} | {plan_s:>8.2f} | {plan_mib:>8.1f} |")
    print(f"| {'handover (move-before-switch)':<34} | {handover_s:>8.2f} | {handover_mib:>8.1f} |")
    print()
    print(f"| {'fleet change':<22} | {'moved':>8} | {'ideal':>8} | {'agents changed':>14} |")
    print(f"|{'-' * 24}|{'-' * 10}|{'-' * 10}|{'-' * 16}|")
    print(
        f"| {'remove one box':<22} | {remove_move.fraction_moved:>8.5f} | {removed_share:>8.5f} |"
        f" {remove_move.agents_changed:>14} |"
    )
    print(
        f"| {'add one box':<22} | {add_move.fraction_moved:>8.5f} | {1 / (per_model + 1):>8.5f} |"
        f" {add_move.agents_changed:>14} |"
    )


if __name__ == "__main__":
    main()
