"""A region restart, modelled: how soon is 99% of the call volume routed warm again, paced vs. unpaced?

`python -m bench.region_restart [--boxes 1000] [--agents 4000] [--rate 200000] [--in-flight 64]`

The model (no engines, no daemon: the admission rule is the real one, `warmer.core.fleet_pacing`):
* `boxes` boxes restart at once; each needs its restart warm-up (a long prefill of `--warmup-tokens` plus the
  recipe's short prompts, as `restart_warmup_cost` counts them) before its agents' prefix warms;
* `agents` agents, each on one box (a stable hash), with Zipf call volumes (s=1.1) and prefixes of 1,000 to
  8,000 tokens; an agent is routed warm once its box is warmed up and its prefix warm there;
* the fleet's prefill is one shared capacity of `--rate` uncached tokens per second, shared equally by the
  work running at once (processor sharing: what a shared prefill budget means when work piles onto it);
* unpaced (the behaviour before fleet pacing, the baseline): every warm-up starts at once, and each box's
  warms start as soon as its warm-up is done (at most 2 per box, the per-box concurrency);
* paced: `FleetAdmission` with the budget `--rate` and `--in-flight`, the same per-box concurrency, most
  valuable first (value: calls/minute x prefix tokens; a warm-up is worth its box's agents).

The lower bound: any schedule that routes 99% of the volume warm computes at least the fractional knapsack
of the agents' costs — each agent's prefix plus its share of its box's warm-up (a box's warm-up is paid once
for all its agents, so any set of agents costs at least the sum of these shares) — at `--rate`.

Writes a summary JSON under bench/results/ and prints the table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

from warmer.core.fleet_pacing import FleetAdmission, FleetBudget, Ticket, WorkKind, restart_warmup_cost
from warmer.core.model import EngineKind, ModelProfile, RestartRecipe

RESULTS = Path(__file__).resolve().parent / "results"
PER_BOX = 2
COVER = 0.99
LEVELS = (0.5, 0.9, 0.99)  # shares of the call volume routed warm, reported


@dataclass(frozen=True, slots=True)
class World:
    box_of: dict[str, str]  # agent -> its box
    volume: dict[str, float]  # agent -> calls/minute
    tokens: dict[str, int]  # agent -> prefix tokens
    warmup: dict[str, float]  # box -> restart warm-up tokens


def build(boxes: int, agents: int, warmup_tokens: int, seed: int) -> World:
    rng = random.Random(seed)
    box_ids = [f"b{i:05d}" for i in range(boxes)]
    agent_ids = [f"a{i:05d}" for i in range(agents)]
    box_of = {
        a: box_ids[int.from_bytes(hashlib.blake2b(a.encode(), digest_size=8).digest(), "little") % boxes]
        for a in agent_ids
    }
    volume = {a: 100.0 / (rank + 1) ** 1.1 for rank, a in enumerate(rng.sample(agent_ids, len(agent_ids)))}
    tokens = {a: rng.randint(1_000, 8_000) for a in agent_ids}
    profile = ModelProfile(
        name="m", engine=EngineKind.VLLM, slots=8, context_length=32_768, restart=RestartRecipe()
    )
    warmup = {b: restart_warmup_cost(profile, warmup_tokens, slots=8) for b in box_ids}
    return World(box_of, volume, tokens, warmup)


def lower_bound(world: World, rate: float, cover: float = COVER) -> float:
    """Seconds: the fractional knapsack of agent costs (prefix + share of the box's warm-up) to `cover`."""
    on_box: dict[str, int] = {}
    for box in world.box_of.values():
        on_box[box] = on_box.get(box, 0) + 1
    cost = {a: world.tokens[a] + world.warmup[b] / on_box[b] for a, b in world.box_of.items()}
    need = cover * sum(world.volume.values())
    spent = 0.0
    for agent in sorted(cost, key=lambda a: -world.volume[a] / cost[a]):
        take = min(1.0, need / world.volume[agent])
        spent += take * cost[agent]
        need -= take * world.volume[agent]
        if need <= 1e-9:
            break
    return spent / rate


def simulate(world: World, rate: float, admission: FleetAdmission, *, valued: bool) -> dict[str, float]:
    """Processor sharing of `rate` among the admitted work; returns when 99% of the volume was routed."""
    agents_of: dict[str, list[str]] = {}
    for agent, box in world.box_of.items():
        agents_of.setdefault(box, []).append(agent)
    box_value = {b: sum(world.volume[a] * world.tokens[a] for a in agents) for b, agents in agents_of.items()}
    kind_of: dict[str, tuple[WorkKind, str]] = {}
    for box in world.warmup:
        key = f"warmup:{box}"
        kind_of[key] = (WorkKind.RESTART_WARMUP, box)
        value = box_value.get(box, 0.0) if valued else 0.0
        admission.enqueue(Ticket(key, WorkKind.RESTART_WARMUP, box, value, world.warmup[box], 0.0))
    now, routed, total = 0.0, 0.0, sum(world.volume.values())
    running: dict[str, float] = {}
    peak, cover_at = 0, dict.fromkeys(LEVELS, math.nan)
    while True:
        for ticket in admission.admit(now):
            running[ticket.key] = ticket.cost_tokens
        peak = max(peak, len(running))
        if not running:
            check = admission.next_check_at(now)
            if check is None:
                break
            now = max(check, now + 1e-9)
            continue
        each = rate / len(running)
        step = min(running.values()) / each
        check = admission.next_check_at(now)
        if check is not None and check > now:
            step = min(step, check - now)
        now += step
        done = [key for key in running if running[key] - step * each <= 1e-6]
        for key in running:
            running[key] -= step * each
        for key in done:
            del running[key]
            admission.release(key)
            kind, box = kind_of.pop(key)
            if kind is WorkKind.RESTART_WARMUP:
                for agent in agents_of.get(box, []):
                    warm = f"warm:{agent}"
                    kind_of[warm] = (WorkKind.WARM, agent)
                    value = world.volume[agent] * world.tokens[agent] if valued else 0.0
                    admission.enqueue(Ticket(warm, WorkKind.WARM, box, value, world.tokens[agent], now))
            else:
                routed += world.volume[box]  # for a warm, `box` holds the agent id
                for level in LEVELS:
                    if math.isnan(cover_at[level]) and routed >= level * total - 1e-9:
                        cover_at[level] = now
    return {
        **{f"seconds_to_{round(level * 100)}pct_volume_warm": at for level, at in cover_at.items()},
        "seconds_all_done": now,
        "peak_in_flight": peak,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--boxes", type=int, default=1000)
    parser.add_argument("--agents", type=int, default=4000)
    parser.add_argument("--rate", type=float, default=200_000.0, help="fleet prefill, uncached tokens/s")
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--warmup-tokens", type=int, default=8_192)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    world = build(args.boxes, args.agents, args.warmup_tokens, args.seed)
    started = time.perf_counter()
    unpaced_budget = FleetBudget(tokens_per_second=1e18, max_in_flight=10**9, max_wait_seconds=1e18)
    unpaced = simulate(
        world, args.rate, FleetAdmission(unpaced_budget, 1e18, lambda _b: PER_BOX), valued=False
    )
    paced_budget = FleetBudget(tokens_per_second=args.rate, max_in_flight=args.in_flight)
    paced = simulate(
        world, args.rate, FleetAdmission(paced_budget, args.rate, lambda _b: PER_BOX), valued=True
    )
    bounds = {
        f"seconds_to_{round(level * 100)}pct_volume_warm": lower_bound(world, args.rate, level)
        for level in LEVELS
    }
    bound = bounds["seconds_to_99pct_volume_warm"]
    summary = {
        "bench": "region_restart",
        "config": vars(args),
        "lower_bound": bounds,
        "unpaced": unpaced,
        "paced": paced,
        "paced_over_unpaced": {k: paced[k] / unpaced[k] for k in bounds},
        "paced_over_lower_bound_99pct": paced["seconds_to_99pct_volume_warm"] / bound,
        "cpu_seconds": time.perf_counter() - started,
    }
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = RESULTS / f"region-restart-{args.boxes}x{args.agents}-{stamp}.json"
    out.write_text(json.dumps(summary, indent=2) + "\n")
    heads = " ".join(f"{f'{level} warm (s)':>13}" for level in ("50%", "90%", "99%"))
    print(f"{'arm':<12} {heads} {'all (s)':>9} {'peak':>6}")
    for name, arm in (("unpaced", unpaced), ("paced", paced), ("lower bound", bounds)):
        cells = " ".join(f"{arm[key]:>13.1f}" for key in bounds)
        tail = (
            f"{arm['seconds_all_done']:>9.1f} {arm['peak_in_flight']:>6.0f}"
            if "peak_in_flight" in arm
            else ""
        )
        print(f"{name:<12} {cells} {tail}")
    print(f"written {out.relative_to(RESULTS.parent.parent)}")


if __name__ == "__main__":
    main()
