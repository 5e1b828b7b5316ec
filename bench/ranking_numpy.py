"""What numpy buys placement: the ranking kernel alone, pure Python against numpy, identical keys.

Placement's cold cost at fleet scale was mostly hashing: every agent scores the 64 hash buckets, then the
boxes of its first bucket (`warmer.core.placement.ranking`). One agent at a time the core computes those
SplitMix64 scores with big-int "lanes"; a whole placement's agents are hashed at once with numpy
(`BoxIndex.prime`). This measures the same kernel — each agent's first bucket, then the sorted member keys
of that bucket — both ways, checks the keys are equal, and prints CPU seconds.

Run: python -m bench.ranking_numpy [--boxes 5000] [--agents 20000] [--buckets 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable

import numpy as np

from warmer.core.placement.hashing import (
    Lanes,
    best_members,
    ranked_key_rows,
    seed_array,
    stable_seed,
)


def with_numpy(agent_seeds: list[int], bucket_seeds: list[int], members: list[list[int]]) -> list[list[int]]:
    """The core's numpy kernel (`BoxIndex.prime` runs it): every agent's first bucket, then per bucket the
    sorted member keys of the agents that chose it."""
    seeds = seed_array(agent_seeds)
    first = np.array(best_members(seeds, seed_array(bucket_seeds)))
    out: list[list[int]] = [[] for _ in agent_seeds]
    for bucket in range(len(bucket_seeds)):
        rows = np.nonzero(first == bucket)[0]
        if not len(rows) or not members[bucket]:
            continue
        keys = ranked_key_rows(seeds[rows], seed_array(members[bucket]))
        for row, ranked in zip(rows.tolist(), keys.tolist(), strict=True):
            out[row] = ranked
    return out


def with_lanes(agent_seeds: list[int], bucket_seeds: list[int], members: list[list[int]]) -> list[list[int]]:
    bucket_lanes = Lanes(bucket_seeds)
    member_lanes = [Lanes(m) for m in members]
    out: list[list[int]] = []
    for seed in agent_seeds:
        lanes = member_lanes[bucket_lanes.best(seed)]
        out.append(lanes.ranked_keys(seed) if len(lanes) else [])
    return out


def best_of(fn: Callable[[], list[list[int]]], repeats: int) -> tuple[list[list[int]], float]:
    times, result = [], []
    for _ in range(repeats):
        gc.collect()
        started = time.process_time()
        result = fn()
        times.append(time.process_time() - started)
    return result, min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--boxes", type=int, default=5000)
    parser.add_argument("--agents", type=int, default=20000)
    parser.add_argument("--buckets", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    bucket_seeds = [stable_seed("bucket", str(i)) for i in range(args.buckets)]
    members: list[list[int]] = [[] for _ in bucket_seeds]
    for i in range(args.boxes):
        box_id = f"box-{i:05d}"
        members[stable_seed("box-bucket", box_id) % args.buckets].append(stable_seed("box", box_id))
    agent_seeds = [stable_seed("agent", f"agent-{i:05d}") for i in range(args.agents)]
    lanes, lanes_s = best_of(lambda: with_lanes(agent_seeds, bucket_seeds, members), args.repeats)
    vectors, numpy_s = best_of(lambda: with_numpy(agent_seeds, bucket_seeds, members), args.repeats)
    assert lanes == vectors, "numpy keys differ from the big-int lanes"
    print(f"agents={args.agents} boxes={args.boxes} buckets={args.buckets}; keys checked equal")
    print(f"| {'ranking kernel':<30} | {'CPU s':>7} | {'ratio':>6} |")
    print(f"|{'-' * 32}|{'-' * 9}|{'-' * 8}|")
    print(f"| {'pure Python (big-int lanes)':<30} | {lanes_s:>7.3f} | {1.0:>6.2f} |")
    print(f"| {'numpy (uint64 arrays)':<30} | {numpy_s:>7.3f} | {numpy_s / lanes_s:>6.2f} |")


if __name__ == "__main__":
    main()
