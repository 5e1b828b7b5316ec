"""What a warmer fleet costs as boxes grow: simulated llama.cpp boxes (testbed/simfleet), `--replicas` real
`warmer serve` processes on one fresh PostgreSQL database, steady state then a box restart wave.

Per box count:
1. start the sim fleet (cache for every agent), write each replica's config (the sim's fleet file,
   `--agents` copies of config/agents/outbound-sales with distinct personas, default intervals), start the
   replicas, wait (bounded by `--ready-timeout`) until every box is ready on every replica;
2. steady window (`--steady` s): each replica's CPU share (/proc utime+stime) and RSS; engine control
   requests per box per minute from the sim's own counters, next to warmer_engine_control_requests_total
   summed over the replicas (and its health + epoch share per box per poll interval); transactions and rows
   written per second in that database (pg_stat_database deltas); each replica's pass duration p50/p99
   (warmer_reconcile_pass_seconds, full passes and health polls apart);
3. restart `--restart` of the boxes at once (the sim's bulk restart route; every routed box first, the
   rest drawn at random, so the wave hits routing): per restarted box, the time
   until it is out of every replica's routes and not ready on any (p50/p99/max over the boxes that were
   routed; their readiness read every round, `POLL_SECONDS`, one light request per box and replica), the
   time until every agent is routed again on every replica with as many routes as before, and until every
   restarted box is ready again everywhere (from every box's full view, read every `VIEW_SECONDS`); next
   to the shortest time the fleet warm budget (warmer_fleet_warm_budget_tokens_per_second) allows for the
   tokens the restarted boxes held; and whether the replicas' route tables were equal right before the
   wave and at its end (read one after the other, so a pass between two reads can tell them apart).

warmer has no call volumes here (no usage records are fed), so "routed warm again" is "every agent routed
with its pre-restart number of routes on every replica", not "99% of call volume".

Run: python -m bench.fleet_scale [--boxes 500,1000] [--replicas 3] [--agents 4] [--steady 60]
     [--restart 0.2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, make_url, text

from bench.fleet_scale_figures import (
    PG_COUNTERS,
    bucket_quantile,
    cpu_seconds,
    histogram_buckets,
    loglog_slope,
    metric_sum,
    percentile,
    pg_rates,
    rss_mib,
    warm_budget_seconds,
)
from testbed.fleet import free_loopback_port
from testbed.simfleet import BoxConfig, SimEngine, SimFleet, running_simfleet
from warmer.adapters.store import upgrade_database

REPO = Path(__file__).resolve().parents[1]
SOURCE_AGENT = "outbound-sales"
ADMIN_URL = os.environ.get(
    "WARMER_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
POLL_SECONDS = 0.5
VIEW_SECONDS = 5.0  # the restart wave reads every box's full view this often (per-box readiness each round)
CONTROL = "warmer_engine_control_requests_total"
HEALTH_POLL_SECONDS = 5.0  # reconcile.health_poll_seconds: the replicas run the default
PASS = "warmer_reconcile_pass_seconds"


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


@contextmanager
def fresh_database(label: str) -> Iterator[tuple[str, str]]:
    """A new PostgreSQL database with warmer's schema: (its URL, its name); dropped on exit."""
    admin_url = make_url(ADMIN_URL)
    name = f"fleet_scale_{label}_{int(time.time())}_{os.getpid()}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        url = admin_url.set(database=name).render_as_string(hide_password=False)
        upgrade_database(url)
        yield url, name
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def pg_counters(name: str) -> dict[str, int]:
    admin = create_engine(make_url(ADMIN_URL), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            row = connection.execute(
                text(f"SELECT {', '.join(PG_COUNTERS)} FROM pg_stat_database WHERE datname = :name"),  # noqa: S608 (fixed column names)
                {"name": name},
            ).one()
        return {k: int(v) for k, v in row._mapping.items()}
    finally:
        admin.dispose()


def write_agents(directory: Path, count: int) -> list[str]:
    """`count` copies of the example agent, each with its own persona name (so its own prefix)."""
    source = REPO / "config" / "agents"
    directory.mkdir()
    shutil.copy(source / f"{SOURCE_AGENT}.tools.json", directory)
    shutil.copytree(source / SOURCE_AGENT, directory / SOURCE_AGENT)
    original = (source / f"{SOURCE_AGENT}.toml").read_text()
    if "You are Maya," not in original:
        raise RuntimeError("the example agent's persona changed; update bench.fleet_scale")
    names = []
    for k in range(count):
        name = f"agent-{k}"
        (directory / f"{name}.toml").write_text(original.replace("You are Maya,", f"You are Maya {k},", 1))
        names.append(name)
    return names


def write_config(home: Path, fleet: SimFleet, agents_dir: Path, url: str, replica: str, port: int) -> Path:
    config = home / "warmer.toml"
    config.write_text(
        f'[database]\nurl = "{url}"\nstate_dir = "{home / "state"}"\n\n'
        f'[api]\nhost = "127.0.0.1"\nport = {port}\n\n'
        f'[logging]\nformat = "json"\nlevel = "warning"\n\n'
        f'[replicas]\nreplica_id = "{replica}"\n\n'
        f'[fleet]\nmodels_dir = "{REPO / "models"}"\nagents_dir = "{agents_dir}"\n\n{fleet.toml()}'
    )
    return config


class Replica:
    def __init__(self, name: str, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.name, self.process, self.log = name, process, log
        self.url = f"http://127.0.0.1:{port}"
        self.client = httpx.Client(timeout=60)

    def alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"replica {self.name} exited: {self.log.read_text()[-3000:]}")

    def boxes(self) -> dict[str, dict[str, Any]]:
        response = self.client.get(f"{self.url}/v1/boxes")
        response.raise_for_status()
        return {box["id"]: box for box in response.json()["boxes"]}

    def ready(self, box_id: str) -> tuple[bool, float | None]:
        """The box's readiness here and since when (`GET /v1/boxes/{id}/ready`: 200 ready, 503 not)."""
        response = self.client.get(f"{self.url}/v1/boxes/{box_id}/ready")
        if response.status_code not in (200, 503):
            response.raise_for_status()
        body = response.json()
        return bool(body["ready"]), body.get("since")

    def route_table(self) -> dict[str, Any]:
        response = self.client.get(f"{self.url}/v1/routes")
        response.raise_for_status()
        table: dict[str, Any] = response.json()["routes"]
        return table

    def routes(self) -> dict[str, set[str]]:
        """Agent -> its routed boxes."""
        return {a: {route["box_id"] for route in e["routes"]} for a, e in self.route_table().items()}

    def metrics(self) -> str:
        response = self.client.get(f"{self.url}/metrics")
        response.raise_for_status()
        return response.text


@contextmanager
def running_replicas(
    tmp: Path, fleet: SimFleet, agents_dir: Path, url: str, count: int
) -> Iterator[list[Replica]]:
    script = shutil.which("warmer", path=str(Path(sys.executable).parent)) or "warmer"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMER_")}
    replicas: list[Replica] = []
    try:
        for k in range(count):
            name, port = f"r{k + 1}", free_loopback_port()
            home = tmp / name
            home.mkdir()
            config = write_config(home, fleet, agents_dir, url, name, port)
            log = home / "serve.log"
            with log.open("wb") as out:
                process = subprocess.Popen(
                    [script, "--config", str(config), "serve"], stdout=out, stderr=out, env=env
                )
            replicas.append(Replica(name, process, port, log))
        yield replicas
    finally:
        for replica in replicas:
            replica.client.close()
            if replica.process.poll() is None:
                replica.process.terminate()
        for replica in replicas:
            try:
                replica.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                replica.process.kill()
                replica.process.wait()


def is_ready(box: dict[str, Any]) -> bool:
    """A box of `GET /v1/boxes`: its `ready` is an object (ready, reasons, since, weight)."""
    return bool(box["ready"]["ready"])


def ready_counts(replicas: list[Replica]) -> list[int]:
    return [sum(1 for box in r.boxes().values() if is_ready(box)) for r in replicas]


def wait_ready(replicas: list[Replica], boxes: int, timeout: float, min_share: float) -> dict[str, Any]:
    """Seconds until every box is ready on every replica. Past `timeout`, the counts and why the boxes
    left are not ready (a few per replica) when every replica has at least `min_share` of the boxes ready,
    so the rest of the run still measures; else RuntimeError with the counts."""
    start = time.monotonic()
    counts: list[int] = []
    while time.monotonic() - start < timeout:
        for replica in replicas:
            replica.alive()
        try:
            counts = ready_counts(replicas)
        except httpx.TransportError:
            counts = []
        if counts and all(c == boxes for c in counts):
            return {"ready_seconds": round(time.monotonic() - start, 1)}
        time.sleep(2.0)
    if not counts or min(counts) < min_share * boxes:
        raise RuntimeError(
            f"not every box ready on every replica after {timeout:.0f}s: ready counts {counts}"
        )
    not_ready = [
        {b: box["ready"]["reasons"][:1] for b, box in sorted(r.boxes().items()) if not is_ready(box)}
        for r in replicas
    ]
    return {
        "ready_seconds": None,
        "ready_counts_at_timeout": counts,
        "not_ready_at_timeout": [dict(list(found.items())[:10]) for found in not_ready],
    }


def steady(fleet: SimFleet, replicas: list[Replica], db_name: str, seconds: float) -> dict[str, Any]:
    pids = [r.process.pid for r in replicas]
    sim_pids = [p.pid for p in fleet.processes]

    def snapshot() -> tuple[float, list[float], list[float], dict[str, int], dict[str, int], list[str]]:
        return (
            time.monotonic(),
            [cpu_seconds(p) for p in pids],
            [cpu_seconds(p) for p in sim_pids],
            dict(fleet.stats()["totals"]),
            pg_counters(db_name),
            [r.metrics() for r in replicas],
        )

    t0, cpu0, sim0, sim_counts0, pg0, metrics0 = snapshot()
    time.sleep(seconds)
    t1, cpu1, sim1, sim_counts1, pg1, metrics1 = snapshot()
    control0, control1 = (sum(metric_sum(m, CONTROL) for m in ms) for ms in (metrics0, metrics1))
    polls0, polls1 = (
        sum(metric_sum(m, CONTROL, {"kind": kind}) for m in ms for kind in ("health", "epoch"))
        for ms in (metrics0, metrics1)
    )
    elapsed = t1 - t0
    boxes = len(fleet.boxes)
    control = sim_counts1.get("control", 0) - sim_counts0.get("control", 0)
    rates = pg_rates(pg0, pg1, elapsed)
    return {
        "window_seconds": round(elapsed, 1),
        "replica_cpu_percent": [round(100 * (b - a) / elapsed, 1) for a, b in zip(cpu0, cpu1, strict=True)],
        "replica_rss_mib": [round(rss_mib(p), 1) for p in pids],
        "sim_cpu_percent": round(100 * (sum(sim1) - sum(sim0)) / elapsed, 1),
        "control_per_box_per_minute_sim": round(control / boxes / elapsed * 60, 2),
        "control_per_box_per_minute_warmer": round((control1 - control0) / boxes / elapsed * 60, 2),
        # the bound: health and epoch requests per box per health poll interval, all replicas
        "health_epoch_per_box_per_interval": round(
            (polls1 - polls0) / boxes / elapsed * HEALTH_POLL_SECONDS, 2
        ),
        "work_requests_per_second_sim": round(
            (sim_counts1.get("work", 0) - sim_counts0.get("work", 0)) / elapsed, 2
        ),
        "db_transactions_per_second": round(rates["transactions"], 1),
        "db_rows_written_per_second": round(rates["rows_written"], 1),
        "db_rows_fetched_per_second": round(rates["tup_fetched"], 1),
        "db_rows_by_kind_per_second": {
            k: round(rates[k], 1) for k in ("tup_inserted", "tup_updated", "tup_deleted")
        },
        "pass_seconds": pass_quantiles(metrics0, metrics1),
    }


def pass_quantiles(before: list[str], after: list[str]) -> dict[str, dict[str, list[float | None]]]:
    """Per kind of pass (full, health), each replica's p50 and p99 pass duration over the window, from
    warmer_reconcile_pass_seconds (upper bounds of the histogram's buckets)."""
    out: dict[str, dict[str, list[float | None]]] = {}
    for kind in ("full", "health"):
        pairs = [
            (histogram_buckets(b, PASS, {"kind": kind}), histogram_buckets(a, PASS, {"kind": kind}))
            for b, a in zip(before, after, strict=True)
        ]
        out[kind] = {
            f"p{round(share * 100)}": [bucket_quantile(b, a, share) for b, a in pairs]
            for share in (0.5, 0.99)
        }
    return out


def restart_wave(
    fleet: SimFleet, replicas: list[Replica], share: float, timeout: float, seed: int
) -> dict[str, Any]:
    boxes = len(fleet.boxes)
    before = [r.routes() for r in replicas]
    index = {box["id"]: i for i, box in enumerate(fleet.boxes)}
    routed = sorted({index[b] for routes in before for bs in routes.values() for b in bs})
    wanted = max(1, round(share * boxes))
    others = [i for i in range(boxes) if i not in set(routed)]
    picked = sorted(routed[:wanted] + random.Random(seed).sample(others, max(0, wanted - len(routed))))
    ids = {fleet.boxes[i]["id"]: i for i in picked}
    held = sum(int(fleet.box_state(i)["cache"]["held_tokens"]) for i in picked)  # type: ignore[index]
    epochs = {b: box["epoch"] for b, box in replicas[0].boxes().items()}
    prefix_tokens = {a: int(e["prefix_tokens"] or 0) for a, e in replicas[0].route_table().items()}
    rewarm = sum(prefix_tokens[a] * len(b & set(ids)) for a, b in before[0].items())
    routed_restarted = set().union(*(b for routes in before for b in routes.values())) & set(ids)
    agents_before = {agent: len(b) for agent, b in before[0].items()}
    budget = max(metric_sum(r.metrics(), "warmer_fleet_warm_budget_tokens_per_second") for r in replicas)

    start, started_wall = time.monotonic(), time.time()
    fleet.restart(picked)
    out_at: dict[tuple[int, str], float] = {}  # (replica, box): first seen not ready or not routed there
    gone_at: dict[str, float] = {}  # every replica has taken the box out (the last of them)
    back_at: dict[str, float] = {}  # ready again on every replica, after that
    routed_again: float | None = None
    polls, poll_seconds = 0, []
    views: list[dict[str, dict[str, Any]]] = []
    viewed_at = -math.inf
    while time.monotonic() - start < timeout:
        for replica in replicas:
            replica.alive()
        t_poll = time.monotonic()
        # Each round: the routes, and the readiness of each routed restarted box not yet out everywhere, one
        # light request each; every box's full view (heavy at 1,000 boxes) only every VIEW_SECONDS.
        watched = sorted(b for b in routed_restarted if b not in gone_at)
        try:
            routes = [r.routes() for r in replicas]
            readiness = [{b: r.ready(b) for b in watched} for r in replicas]
            if t_poll - viewed_at >= VIEW_SECONDS:
                views, viewed_at = [r.boxes() for r in replicas], t_poll
        except httpx.TransportError:
            continue
        now = time.monotonic() - start
        polls += 1
        poll_seconds.append(time.monotonic() - t_poll)
        for k, (seen, table) in enumerate(zip(readiness, routes, strict=True)):
            routed_here = set().union(*table.values())
            for box_id, (ready, since) in seen.items():
                # out: not ready, ready again since the wave (out and back between two rounds), or unrouted
                back = since is not None and since >= started_wall
                if (not ready or back or box_id not in routed_here) and (k, box_id) not in out_at:
                    out_at[(k, box_id)] = now
        for k, view in enumerate(views if viewed_at == t_poll else []):
            for box_id in ids:
                out = not is_ready(view[box_id]) or view[box_id]["epoch"] != epochs[box_id]
                if out and (k, box_id) not in out_at:
                    out_at[(k, box_id)] = now
        for box_id in ids:
            if box_id not in gone_at and all((k, box_id) in out_at for k in range(len(replicas))):
                gone_at[box_id] = max(out_at[(k, box_id)] for k in range(len(replicas)))
            if (
                viewed_at == t_poll
                and box_id in gone_at
                and box_id not in back_at
                and all(is_ready(v[box_id]) and v[box_id]["epoch"] != epochs[box_id] for v in views)
            ):
                back_at[box_id] = now
        if (
            routed_again is None
            and len(gone_at) == len(ids)
            and all(len(table.get(agent, ())) >= n for table in routes for agent, n in agents_before.items())
        ):
            routed_again = now
        if len(back_at) == len(ids) and routed_again is not None:
            break
        time.sleep(POLL_SECONDS)
    gone = [gone_at[b] for b in routed_restarted if b in gone_at]
    back = list(back_at.values())
    try:
        after = [r.routes() for r in replicas]
    except httpx.TransportError:
        after = []
    return {
        "restarted": len(ids),
        "restarted_routed": len(routed_restarted),
        # the replicas' route tables (agent -> boxes) read one after the other right before the wave and
        # once more at its end: equal when the replicas agree on placement and on what is warm
        "routes_agree_before": all(table == before[0] for table in before),
        "routed_boxes_before_per_replica": [len(set().union(*table.values())) for table in before],
        "routes_agree_after": bool(after) and all(table == after[0] for table in after),
        "poll_round_seconds_p50": _round(percentile(poll_seconds, 0.5)),
        "polls": polls,
        "routes_gone_everywhere_seconds": {
            "p50": _round(percentile(gone, 0.5)),
            "p99": _round(percentile(gone, 0.99)),
            "max": _round(max(gone, default=None)),
            "missed": len(routed_restarted) - len(gone),
        },
        "every_agent_routed_again_seconds": _round(routed_again),
        "restarted_ready_everywhere_seconds": {
            "p50": _round(percentile(back, 0.5)),
            "p99": _round(percentile(back, 0.99)),
            "max": _round(max(back, default=None)),
            "missed": len(ids) - len(back),
        },
        "tokens_held_by_restarted": held,
        "fleet_warm_budget_tokens_per_second": budget,
        "prefix_tokens_to_rewarm": rewarm,
        "budget_floor_seconds_held": _round(warm_budget_seconds(held, budget)) if budget > 0 else None,
        "budget_floor_seconds_prefixes": _round(warm_budget_seconds(rewarm, budget)) if budget > 0 else None,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def run_one(boxes: int, args: argparse.Namespace) -> dict[str, Any]:
    print(f"# {boxes} boxes, load {load()}", file=sys.stderr, flush=True)
    result: dict[str, Any] = {"boxes": boxes, "replicas": args.replicas, "agents": args.agents}
    result["load_before"] = load()
    config = BoxConfig(
        engine=SimEngine.LLAMACPP, slots=2, context_tokens=4096, cache_tokens=4096 * max(2, args.agents)
    )
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        fleet = stack.enter_context(running_simfleet(boxes, config, processes=args.sim_processes))
        url, db_name = stack.enter_context(fresh_database(str(boxes)))
        agents_dir = tmp / "agents"
        write_agents(agents_dir, args.agents)
        replicas = stack.enter_context(running_replicas(tmp, fleet, agents_dir, url, args.replicas))
        result.update(wait_ready(replicas, boxes, args.ready_timeout, args.min_ready_share))
        print(f"# ready after {result['ready_seconds']}s, load {load()}", file=sys.stderr, flush=True)
        result["steady"] = steady(fleet, replicas, db_name, args.steady)
        result["load_after_steady"] = load()
        print(json.dumps(result["steady"]), file=sys.stderr, flush=True)
        if args.restart > 0:
            result["restart"] = restart_wave(fleet, replicas, args.restart, args.restart_timeout, boxes)
            print(json.dumps(result["restart"]), file=sys.stderr, flush=True)
        result["load_after"] = load()
    return result


def slopes(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Log-log slope of each cost against boxes over the runs."""
    xs = [float(run["boxes"]) for run in runs]
    costs = {
        "replica_cpu_percent_sum": lambda r: sum(r["steady"]["replica_cpu_percent"]),
        "replica_rss_mib_max": lambda r: max(r["steady"]["replica_rss_mib"]),
        "control_requests_per_minute": lambda r: r["steady"]["control_per_box_per_minute_sim"] * r["boxes"],
        "db_transactions_per_second": lambda r: r["steady"]["db_transactions_per_second"],
        "db_rows_written_per_second": lambda r: r["steady"]["db_rows_written_per_second"],
        "ready_seconds": lambda r: r["ready_seconds"],
        "routes_gone_p99_seconds": lambda r: (
            (r.get("restart") or {}).get("routes_gone_everywhere_seconds", {}).get("p99")
        ),
    }
    out: dict[str, float | None] = {}
    for name, cost in costs.items():
        ys = [cost(run) for run in runs]
        out[name] = None if any(y is None for y in ys) else _round3(loglog_slope(xs, [float(y) for y in ys]))
    return out


def _round3(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boxes", default="500,1000", help="comma-separated box counts")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--steady", type=float, default=60.0, help="steady window seconds")
    parser.add_argument("--restart", type=float, default=0.2, help="share of boxes restarted at once")
    parser.add_argument("--ready-timeout", type=float, default=900.0)
    parser.add_argument(
        "--min-ready-share",
        type=float,
        default=0.99,
        help="past --ready-timeout, measure on if every replica has this share of the boxes ready",
    )
    parser.add_argument("--restart-timeout", type=float, default=600.0)
    parser.add_argument("--sim-processes", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.replicas < 1 or args.agents < 1 or not 0 <= args.restart <= 1 or args.steady <= 0:
        parser.error("--replicas and --agents must be >= 1, --restart in [0, 1], --steady > 0")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))  # so every process started is stopped
    counts = [int(b) for b in args.boxes.split(",")]
    runs: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"cpus": os.cpu_count(), "load_before": load(), "runs": runs}
    for boxes in counts:
        try:
            runs.append(run_one(boxes, args))
        except RuntimeError as exc:  # say what happened at this size, keep the sizes that worked
            runs.append({"boxes": boxes, "error": str(exc)[-2000:], "load": load()})
            print(f"# {boxes} boxes failed: {exc}", file=sys.stderr, flush=True)
        if args.json is not None:  # after every size, so a run cut short keeps what it measured
            args.json.write_text(json.dumps(summary, indent=2) + "\n")
    measured = [run for run in runs if "error" not in run]
    summary["slopes_vs_boxes"] = slopes(measured) if len(measured) >= 2 else None
    summary["load_after"] = load()
    print(json.dumps(summary, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if measured else 1


if __name__ == "__main__":
    sys.exit(main())
