"""Time to ready vs engine time: the daemon's own overhead, on real llama-server boxes.

Starts a fleet of llama-server boxes (testbed, generated tiny-demo model), runs the real reconciler wiring
(SqlStore on a temp SQLite file, the engine dispatcher, offline stable prefixes, APScheduler timers) with
the `outbound-sales` agent, and reports per box and epoch: wall time from health first seen up to ready,
the engine-reported time of its warm-up and prefix requests (critical path), and the overhead share
(polls, HTTP, database writes, scheduling). Then restarts each box once and measures again.

    .venv/bin/python -m bench.time_to_ready --boxes 2 --restarts 1
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from testbed.fleet import LlamaFleet
from testbed.llama_build import ensure_llama_server
from testbed.tiny_model import ensure_tiny_model
from warmer.adapters.store import SqlStore, upgrade_database
from warmer.config.agents import load_agent_specs
from warmer.config.profiles import load_profiles
from warmer.config.settings import Settings
from warmer.core.model import BoxSpec, EngineKind
from warmer.root.engines import SystemClock, build_engine_dispatcher, engine_http_client
from warmer.root.reconcile import OfflinePrefixSource, reconciler_config, run_timers
from warmer.service.reconciler import ReadyReport, Reconciler

REPO = Path(__file__).resolve().parents[1]


async def _measure(fleet: LlamaFleet, restarts: int, interval: float, workdir: Path) -> list[ReadyReport]:
    profiles = load_profiles(REPO / "models")
    agents = {k: v for k, v in load_agent_specs(REPO / "config" / "agents").items() if k == "outbound-sales"}
    boxes = [
        BoxSpec(id=b.id, base_url=b.base_url, engine=EngineKind.LLAMACPP, model="tiny-demo", slots=b.slots)
        for b in fleet.boxes
    ]
    settings = Settings(reconcile={"interval_seconds": interval, "health_poll_seconds": interval})
    url = f"sqlite:///{workdir / 'warmer.db'}"
    upgrade_database(url)
    store = SqlStore.from_url(url)
    reports: list[ReadyReport] = []
    async with engine_http_client(settings) as client:
        reconciler = Reconciler(
            engine=build_engine_dispatcher(settings, client, boxes=boxes, profiles=profiles),
            store=store,
            clock=SystemClock(),
            boxes=boxes,
            profiles=profiles,
            agents=agents,
            prefix_source=OfflinePrefixSource(),
            config=reconciler_config(settings),
        )
        stopping = asyncio.Event()
        tasks = [
            asyncio.create_task(reconciler.run(stopping)),
            asyncio.create_task(run_timers(settings, reconciler.poke, stopping)),
        ]

        async def all_ready(previous: dict[str, str | None]) -> None:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                live = reconciler.snapshot().live
                done = [
                    b.ready_report
                    for b in live.values()
                    if b.ready_report is not None
                    and b.ready_report.epoch != previous.get(b.ready_report.box_id)
                ]
                if len(done) == len(live):
                    reports.extend(r for r in done if r is not None)
                    return
                await asyncio.sleep(0.05)
            raise TimeoutError("boxes did not become ready")

        await all_ready({})
        for _ in range(restarts):
            previous = {box_id: (b.epoch) for box_id, b in reconciler.snapshot().live.items()}
            for box in fleet.boxes:
                await asyncio.to_thread(fleet.restart, box.id)
            await all_ready(previous)
        stopping.set()
        await asyncio.gather(*tasks)
    await store.close()
    return reports


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--boxes", type=int, default=2)
    parser.add_argument("--restarts", type=int, default=1, help="restart every box this many times")
    parser.add_argument("--interval", type=float, default=0.5, help="reconcile/health interval (seconds)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="warmer-bench-ttr-") as tmp:
        workdir = Path(tmp)
        fleet = LlamaFleet(
            args.boxes,
            binary=ensure_llama_server(),
            model=ensure_tiny_model(),
            slots=2,
            ctx_per_slot=4096,
            log_dir=workdir / "logs",
        )
        with fleet:
            reports = asyncio.run(_measure(fleet, args.restarts, args.interval, workdir))
    print(
        f"{'box':10} {'epoch':28} {'to ready':>9} {'engine':>8} {'warm-up':>8} {'prefix':>8} {'overhead':>8}"
    )
    for r in reports:
        print(
            f"{r.box_id:10} {r.epoch[-28:]:28} {r.time_to_ready_seconds:8.3f}s {r.engine_seconds:7.3f}s "
            f"{r.warmup_engine_seconds:7.3f}s {r.prefix_engine_seconds:7.3f}s {r.overhead_fraction:8.1%}"
        )
    overheads = [r.overhead_fraction for r in reports]
    print(
        f"overhead: median {statistics.median(overheads):.1%}, max {max(overheads):.1%} "
        f"over {len(reports)} box-epochs"
    )


if __name__ == "__main__":
    main()
