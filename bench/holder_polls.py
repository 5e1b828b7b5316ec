"""Engine control traffic with several replicas: health and epoch requests per box per poll interval, with
every replica polling every box (the baseline: each replica's health timer and each of its passes poll)
against polling by the lease holder only, in the same run, on one real PostgreSQL database per arm.

Each arm runs `--replicas` in-process Reconcilers (real `BoxOwnership` heartbeats, `SqlCoordination`,
`SqlHealthExchange`) over one FakeEngine each replica counts its own requests to; per interval: a
heartbeat, the health timer's poll and one pass on every replica (a fake clock moves `POLL_SECONDS`).
Reported: health + epoch requests per box per interval across all replicas, the observation rows and
stamps written per interval, and whether every replica calls every box ready at the end.

Run: python -m bench.holder_polls [--boxes 300] [--replicas 3] [--intervals 4] [--out bench/results/...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from bench.fleet_scale import fresh_database
from tests.unit.reconciler_fakes import (
    CountingEngine,
    FakeClock,
    FakeEngine,
    replica_reconciler,
)
from warmer.adapters.store import SqlStore
from warmer.adapters.store.coordination import SqlCoordination
from warmer.adapters.store.observations import SqlHealthExchange
from warmer.core.leases import LeaseConfig
from warmer.core.observations import HealthObservation, StoredObservation
from warmer.service.reconciler import Reconciler
from warmer.service.replicas.ownership import BoxOwnership
from warmer.service.replicas.replica_gate import ReplicaGate

POLL_SECONDS = 5.0
# Heartbeats run between passes here, not in a task of their own: a lease long enough that a slow pass on
# a loaded machine never lets one expire mid-run (a lapse would move boxes and blur the count).
LEASES = LeaseConfig(lease_seconds=600.0, renew_seconds=5.0)


class CountedExchange:
    """SqlHealthExchange, counting the rows and stamps it writes."""

    def __init__(self, inner: SqlHealthExchange) -> None:
        self._inner = inner
        self.rows = 0
        self.stamps = 0

    async def publish(
        self, replica_id: str, changed: Mapping[str, HealthObservation], *, stamp: bool
    ) -> frozenset[str]:
        written = await self._inner.publish(replica_id, changed, stamp=stamp)
        self.rows += len(written)
        self.stamps += int(stamp)
        return written

    async def read(self, box_ids: Collection[str]) -> dict[str, StoredObservation]:
        return await self._inner.read(box_ids)


@dataclass
class Replica:
    reconciler: Reconciler
    engine: CountingEngine
    ownership: BoxOwnership
    exchange: CountedExchange | None


def replica(
    url: str, name: str, box_ids: tuple[str, ...], engine: FakeEngine, clock: FakeClock, *, holder_only: bool
) -> Replica:
    store = SqlStore.from_url(url, now=clock.now)
    coordination = SqlCoordination(store)
    wired: list[Reconciler] = []
    ownership = BoxOwnership(
        coordination=coordination,
        clock=clock,
        config=LEASES,
        fleet=lambda: box_ids,
        replica_id=name,
        on_change=lambda gained, lost: wired[0].replicas.leases_changed(gained, lost) if wired else None,
    )
    exchange = CountedExchange(SqlHealthExchange(store)) if holder_only else None
    counting = CountingEngine(engine)
    gate = ReplicaGate(ownership=ownership, coordination=coordination, health=exchange)
    poll_seconds = POLL_SECONDS if holder_only else 0.0  # baseline: every pass polls too
    reconciler = replica_reconciler(counting, store, clock, box_ids, gate, health_poll_seconds=poll_seconds)
    wired.append(reconciler)
    return Replica(reconciler, counting, ownership, exchange)


async def interval(replicas: list[Replica], clock: FakeClock) -> None:
    clock.t += POLL_SECONDS
    for each in replicas:
        await each.ownership.beat()
    for each in replicas:
        await each.reconciler.poll_health()
    for each in replicas:
        await each.reconciler.tick()
        await each.reconciler.wait_idle()


def requests(replicas: list[Replica]) -> int:
    return sum(sum(r.engine.polls.values()) for r in replicas)


async def run_arm(url: str, args: argparse.Namespace, *, holder_only: bool) -> dict[str, object]:
    box_ids = tuple(f"b{n}" for n in range(args.boxes))
    engine, clock = FakeEngine(box_ids), FakeClock()
    engine.clock = clock
    names = [f"r{n}" for n in range(args.replicas)]
    replicas = [replica(url, name, box_ids, engine, clock, holder_only=holder_only) for name in names]
    for _ in range(2):
        for each in replicas:
            await each.ownership.beat()
    for _ in range(2):
        await interval(replicas, clock)
    sent = requests(replicas)
    rows = sum(r.exchange.rows for r in replicas if r.exchange is not None)
    stamps = sum(r.exchange.stamps for r in replicas if r.exchange is not None)
    started = time.perf_counter()
    for _ in range(args.intervals):
        await interval(replicas, clock)
    wall = time.perf_counter() - started
    per_interval = args.boxes * args.intervals
    ready = all(r.reconciler.ready_box_ids() == set(box_ids) for r in replicas)
    exchanges = [r.exchange for r in replicas if r.exchange is not None]
    for each in replicas:
        await each.reconciler.close()
    return {
        "arm": "holder-only" if holder_only else "every-replica",
        "health_epoch_requests_per_box_per_interval": (requests(replicas) - sent) / per_interval,
        "observation_rows_per_interval": (sum(e.rows for e in exchanges) - rows) / args.intervals,
        "stamps_per_interval": (sum(e.stamps for e in exchanges) - stamps) / args.intervals,
        "all_ready_on_every_replica": ready,
        "wall_seconds_per_interval": wall / args.intervals,
    }


def with_database(args: argparse.Namespace, holder_only: bool) -> dict[str, object]:
    with fresh_database("holder_polls") as (url, _):
        return asyncio.run(run_arm(url, args, holder_only=holder_only))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--boxes", type=int, default=300)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--intervals", type=int, default=4)
    parser.add_argument("--out", default=None, help="write the summary JSON here")
    args = parser.parse_args()
    arms = [with_database(args, holder_only=False), with_database(args, holder_only=True)]
    base, new = (float(a["health_epoch_requests_per_box_per_interval"]) for a in arms)  # type: ignore[arg-type]
    summary = {
        "boxes": args.boxes,
        "replicas": args.replicas,
        "intervals": args.intervals,
        "poll_seconds": POLL_SECONDS,
        "arms": arms,
        "ratio_holder_only_to_every_replica": new / base,
    }
    text_out = json.dumps(summary, indent=2)
    print(text_out)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text_out + "\n")


if __name__ == "__main__":
    main()
