"""Pre-call answers at dialer scale with many agents: `POST /v1/prewarm` through a real `warmer serve` over a
simulated fleet (testbed.simfleet) big enough to hold every agent warm, driven by wrk.

- `--agents` generated agents (small prompts, each its own stable prefix), written as spec files and loaded
  by the daemon like any operator's;
- `--sim-boxes` simulated llama.cpp boxes in one sim process, each configured with a `prefix_capacity`
  that holds its share of the agents (every agent starts on a placement group of two boxes);
- the daemon as a subprocess (embedded SQLite, a bearer token, default reconcile and health intervals);
  the bench waits (bounded) until every agent has a route;
- wrk (one thread, keep-alive) at each concurrency for `--seconds`, two scenarios on the same daemon, one
  after the other: `one agent` (every ask for the same agent, the figure `bench.precall_load` measured) and
  `many agents` (every ask for a random agent among all of them; `--many-first` runs it first, so runs can
  rotate the order); every ask has a fresh call id. Figures:
  req/s, p50, p99, non-2xx, the daemon's CPU per ask (its /proc utime+stime over the run);
- a check that the answers are real: a sample of asks (random agents, fresh call ids) must answer 200,
  `ready` true, a box among the agent's routes in `GET /v1/routes`, and the slot that route gives;
- the daemon's loop lag (`warmer_event_loop_lag_seconds`, a 100 ms timer's lateness) over the idle window
  and each load: how often the loop was held by other work for more than 20, 50, 100 and 250 ms.

Ratios are `many agents` against `one agent` in the same run. The machine is shared: load average is
printed before and after.

Run: python -m bench.precall_scale [--agents 2000] [--sim-boxes 500] [--seconds 10] [--json out.json]
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
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.precall_load import WRK_DONE, LoadResult, Serve, run_wrk, uptime
from testbed.fleet import free_loopback_port, log_tail
from testbed.simfleet import BoxConfig, SimEngine, SimFleet, running_simfleet
from warmer.core.placement.types import PlacementConfig

REPO = Path(__file__).resolve().parents[1]
MODEL = "tiny-demo"
TOKEN = "bench-token"
AGENT_FORMAT = "agent-%05d"
SAMPLE_ASKS = 300
# Room per prefix in a box's cache (a generated prompt is ~250 tokens of the tiny model's tokenizer).
TOKENS_PER_PREFIX = 600
# Placement's own cap (warmer.core.placement.types.PlacementConfig.max_agents_per_box, not configurable).
AGENTS_PER_BOX = PlacementConfig().max_agents_per_box

# Every ask: a random agent among the first `count` (`agent-%05d`), a fresh call id (tag-counter).
WRK_MANY = """
local counter = 0
local prefix = "x"
local count = COUNT
local headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer TOKEN"}
function init(args)
  prefix = args[1] or "x"
  math.randomseed(tonumber(args[2]) or 1)
end
request = function()
  counter = counter + 1
  local agent = string.format("AGENT_FORMAT", math.random(0, count - 1))
  local body = '{"agent":"' .. agent .. '","call_id":"' .. prefix .. "-" .. tostring(counter) .. '"}'
  return wrk.format("POST", "/v1/prewarm", headers, body)
end
"""


def say(message: str) -> None:
    print(f"[precall_scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def agent_id(index: int) -> str:
    return AGENT_FORMAT % index


def wrk_script(count: int) -> str:
    """The Lua script: asks spread over agents 0..count-1, fresh call ids, wrk's summary as JSON."""
    if count < 1:
        raise ValueError("count must be >= 1")
    return (
        WRK_MANY.replace("COUNT", str(count)).replace("TOKEN", TOKEN).replace("AGENT_FORMAT", AGENT_FORMAT)
        + WRK_DONE
    )


def write_agents(directory: Path, count: int) -> list[str]:
    """`count` small agent spec files, each with its own stable text (so its own prefix)."""
    directory.mkdir(parents=True, exist_ok=True)
    ids = [agent_id(i) for i in range(count)]
    for i, name in enumerate(ids):
        (directory / f"{name}.toml").write_text(
            f'model = "{MODEL}"\n\n[[blocks]]\nname = "persona"\n'
            f'text = """You are agent number {i} of the Northwind call centre.\n'
            f"Your line of work is queue {i % 97}, desk {i // 97}. Be brief, warm and exact.\n"
            f'Never read the call details out as a list."""\n\n'
            f'[dynamic]\nrole = "user"\ntemplate = "Call id: {{call_id}}. The call has connected."\n\n'
            f'[placeholders]\ncall_id = "uuid"\n',
            encoding="utf-8",
        )
    return ids


def prefix_capacity(agents: int, boxes: int) -> int:
    """Prefixes per box so every agent fits on a group of two boxes, with room to spare (x1.5, +2)."""
    return math.ceil(3 * agents / boxes) + 2


def write_config(workdir: Path, fleet: SimFleet, agents_dir: Path, port: int, capacity: int) -> Path:
    boxes = "\n".join(
        f'[[fleet.boxes]]\nid = "{box["id"]}"\nbase_url = "{box["base_url"]}"\nengine = "llamacpp"\n'
        f'model = "{MODEL}"\nslots = {fleet.config.slots}\nprefix_capacity = {capacity}\n'
        f"cache_capacity_tokens = {fleet.config.cache_tokens}\n"
        for box in fleet.boxes
    )
    config = workdir / "warmer.toml"
    config.write_text(
        f'[database]\nstate_dir = "{workdir / "state"}"\n\n'
        f'[api]\nhost = "127.0.0.1"\nport = {port}\ntokens = ["{TOKEN}"]\n\n'
        f"[reconcile]\nramp_seconds = 1.0\nshutdown_grace_seconds = 5.0\n\n"
        f"[engines]\nhealth_timeout_seconds = 10.0\n\n"
        f'[logging]\nformat = "json"\nlevel = "warning"\n\n'
        f'[fleet]\nmodels_dir = "{REPO / "models"}"\nagents_dir = "{agents_dir}"\n\n{boxes}'
    )
    return config


def start_serve(config: Path, workdir: Path, port: int) -> Serve:
    script = shutil.which("warmer", path=str(Path(sys.executable).parent))
    assert script is not None, "the `warmer` console script is installed next to the interpreter"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMER_")}
    env["PYTHONPATH"] = str(REPO)
    log = workdir / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [script, "--config", str(config), "serve"], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    return Serve(process, f"http://127.0.0.1:{port}", port, log, workdir / "state" / "warmer.db")


def routes(serve: Serve) -> dict[str, Any]:
    response = httpx.get(
        f"{serve.base_url}/v1/routes", headers={"authorization": f"Bearer {TOKEN}"}, timeout=30
    )
    response.raise_for_status()
    found: dict[str, Any] = response.json()["routes"]
    return found


def wait_all_routed(serve: Serve, agents: Sequence[str], bound: float) -> float:
    """Seconds until every agent has at least one route (bounded: raises past `bound`)."""
    started = time.monotonic()
    routed = 0
    while time.monotonic() - started < bound:
        if serve.process.poll() is not None:
            raise RuntimeError(f"serve exited with {serve.process.returncode}:\n{log_tail(serve.log)}")
        try:
            found = routes(serve)
        except (httpx.HTTPError, ValueError):
            time.sleep(1.0)
            continue
        routed = sum(1 for a in agents if found.get(a, {}).get("routes"))
        if routed == len(agents):
            return time.monotonic() - started
        say(f"routed {routed}/{len(agents)} agents after {time.monotonic() - started:.0f}s")
        time.sleep(5.0)
    raise RuntimeError(f"only {routed}/{len(agents)} agents routed within {bound:.0f}s")


LAG_BOUNDS = ("0.02", "0.05", "0.1", "0.25")  # seconds: the histogram buckets reported


def loop_lag_counts(serve: Serve) -> dict[str, float]:
    """The daemon's `warmer_event_loop_lag_seconds` histogram now: le -> timer samples at most that late
    ("+Inf": all of them)."""
    response = httpx.get(f"{serve.base_url}/metrics", timeout=30)
    response.raise_for_status()
    counts: dict[str, float] = {}
    for line in response.text.splitlines():
        if line.startswith('warmer_event_loop_lag_seconds_bucket{le="'):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            counts[bound] = float(line.rsplit(" ", 1)[1])
    return counts


@dataclass
class LoopLag:
    """Timers of the daemon's loop-lag sampler (every 100 ms) over one load, and how many fired late by
    more than each bound: how often the loop was held by other work while the asks waited."""

    timers: int
    late_over: dict[str, int]  # bound in seconds -> timers later than it


def loop_lag_between(before: dict[str, float], after: dict[str, float]) -> LoopLag:
    timers = int(after.get("+Inf", 0) - before.get("+Inf", 0))
    late = {b: timers - int(after.get(b, 0) - before.get(b, 0)) for b in LAG_BOUNDS}
    return LoopLag(timers, late)


@dataclass
class Sample:
    asks: int
    ok: int
    ready: int
    box_routed: int
    slot_valid: int  # None, or a slot of the box (routes do not name slots)
    distinct_boxes: int
    not_ready: dict[str, int]  # "state: detail" -> asks
    problems: list[str]


def check_answers(serve: Serve, agents: Sequence[str], asks: int, seed: int, slots: int) -> Sample:
    """Asks for random agents with fresh call ids; each answer against the agent's routes read just before."""
    rng = random.Random(seed)
    found = routes(serve)
    sample = Sample(asks, 0, 0, 0, 0, 0, {}, [])
    not_ready: Counter[str] = Counter()
    boxes: set[str] = set()
    headers = {"authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=serve.base_url, headers=headers, timeout=10) as client:
        for i in range(asks):
            agent = rng.choice(agents)
            try:
                response = client.post("/v1/prewarm", json={"agent": agent, "call_id": f"check-{seed}-{i}"})
            except httpx.HTTPError as error:  # a daemon that stops answering is a figure, not a crash
                sample.problems.append(f"{agent}: {type(error).__name__}")
                continue
            if response.status_code != 200:
                sample.problems.append(f"{agent}: HTTP {response.status_code} {response.text[:200]}")
                continue
            body = response.json()
            sample.ok += 1
            sample.ready += body["ready"] is True
            if body["ready"] is not True:
                not_ready[f"{body['state']}: {body['detail']}"[:120]] += 1
            by_box = {r["box_id"]: r for r in found.get(agent, {}).get("routes", [])}
            route = by_box.get(body["box_id"])
            if route is None:
                sample.problems.append(f"{agent}: box {body['box_id']} not among routes {sorted(by_box)}")
                continue
            sample.box_routed += 1
            boxes.add(body["box_id"])
            if body["slot"] is None or 0 <= body["slot"] < slots:
                sample.slot_valid += 1
            else:
                sample.problems.append(f"{agent}: slot {body['slot']} on a box of {slots} slots")
    sample.distinct_boxes = len(boxes)
    sample.not_ready = dict(not_ready.most_common(8))
    return sample


@dataclass
class Result:
    agents: int
    sim_boxes: int
    prefix_capacity: int
    routed_after_seconds: float
    idle_cpu_percent: float  # the daemon's own background work (passes, polls) with no asks, over a core
    load_before: str
    load_after: str
    loads: dict[str, list[LoadResult]]
    sample_before: Sample
    sample_after: Sample
    loop_lag: dict[str, LoopLag]  # "idle" and each load's tag -> the daemon's loop lag over it


def report(result: Result) -> None:
    print(f"load before: `{result.load_before}`; after: `{result.load_after}`\n")
    print(
        f"{result.agents} agents, {result.sim_boxes} sim boxes (prefix_capacity {result.prefix_capacity}),"
        f" every agent routed after {result.routed_after_seconds:.0f}s; idle daemon CPU "
        f"{result.idle_cpu_percent:.1f}% of a core (in the CPU per ask below: subtract it at low rates)\n"
    )
    print(
        "| scenario | concurrency | req/s | p50 ms | p99 ms | non-2xx | server CPU µs/req "
        "| req/s vs one | p99 vs one |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    base = {r.concurrency: r for r in result.loads["one agent"]}
    for scenario, loads in result.loads.items():
        for r in loads:
            b = base[r.concurrency]
            print(
                f"| {scenario} | {r.concurrency} | {r.rps:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | "
                f"{r.non2xx + r.socket_errors} | {r.server_cpu_us_per_request:,.0f} | "
                f"{r.rps / b.rps:.2f}× | {r.p99_ms / b.p99_ms:.2f}× |"
            )
    print("\n| window | loop-lag timers | late > 20 ms | > 50 ms | > 100 ms | > 250 ms |")
    print("|---|---|---|---|---|---|")
    for window, lag in result.loop_lag.items():
        late = " | ".join(str(lag.late_over[b]) for b in LAG_BOUNDS)
        print(f"| {window} | {lag.timers} | {late} |")
    for name, s in (("before load", result.sample_before), ("after load", result.sample_after)):
        print(
            f"\nanswer check {name}: {s.asks} asks, {s.ok} HTTP 200, {s.ready} ready, "
            f"{s.box_routed} on a routed box, {s.slot_valid} with a valid slot, "
            f"{s.distinct_boxes} distinct boxes; "
            f"not ready: {s.not_ready or 'none'}; problems: {s.problems[:5] or 'none'}"
        )


def run(args: argparse.Namespace) -> Result:
    levels = [int(c) for c in args.concurrency.split(",")]
    load_before = uptime()
    say(f"load before: {load_before}")
    capacity = prefix_capacity(args.agents, args.sim_boxes)
    box = BoxConfig(
        engine=SimEngine.LLAMACPP,
        slots=args.slots,
        context_tokens=4096,
        cache_tokens=max(8192, capacity * TOKENS_PER_PREFIX),
    )
    with (
        tempfile.TemporaryDirectory(prefix="precall-scale-") as tmp,
        running_simfleet(args.sim_boxes, box, nice=args.sim_nice) as fleet,
    ):
        workdir = Path(tmp)
        agents = write_agents(workdir / "agents", args.agents)
        port = free_loopback_port()
        config = write_config(workdir, fleet, workdir / "agents", port, capacity)
        serve = start_serve(config, workdir, port)
        try:
            routed_after = wait_all_routed(serve, agents, args.ready_bound)
            say(f"every agent routed after {routed_after:.0f}s")
            cpu0, t0, lag0 = serve.cpu_seconds(), time.monotonic(), loop_lag_counts(serve)
            time.sleep(args.idle_seconds)
            idle_cpu_percent = 100 * (serve.cpu_seconds() - cpu0) / (time.monotonic() - t0)
            lags = {"idle": loop_lag_between(lag0, loop_lag_counts(serve))}
            say(f"idle daemon CPU: {idle_cpu_percent:.1f}% of a core")
            sample_before = check_answers(serve, agents, SAMPLE_ASKS, 1, box.slots)
            scripts = {"one agent": 1, "many agents": len(agents)}
            if args.many_first:  # runs rotate which scenario comes first at each concurrency
                scripts = {"many agents": len(agents), "one agent": 1}
            loads: dict[str, list[LoadResult]] = {name: [] for name in scripts}
            paths = {}
            for name, count in scripts.items():
                paths[name] = workdir / f"{name.replace(' ', '-')}.lua"
                paths[name].write_text(wrk_script(count))
            run_wrk(serve, "warmup", paths["many agents"], "/v1/prewarm", max(levels), 3, "warmup")
            for concurrency in levels:
                for name in scripts:
                    tag = f"{name.replace(' ', '-')}-c{concurrency}"
                    lag0 = loop_lag_counts(serve)
                    result = run_wrk(serve, name, paths[name], "/v1/prewarm", concurrency, args.seconds, tag)
                    lags[tag] = loop_lag_between(lag0, loop_lag_counts(serve))
                    loads[name].append(result)
                    say(f"{name} c={concurrency}: {result.rps:,.0f} req/s, p99 {result.p99_ms:.1f} ms, "
                        f"{result.server_cpu_us_per_request:.0f} µs CPU/req")  # fmt: skip
            sample_after = check_answers(serve, agents, SAMPLE_ASKS, 2, box.slots)
        finally:
            serve.process.terminate()
            try:
                serve.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                serve.process.kill()
                serve.process.wait()
    return Result(
        args.agents, args.sim_boxes, capacity, routed_after, idle_cpu_percent, load_before, uptime(), loads,
        sample_before, sample_after, lags,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=2000)
    parser.add_argument("--sim-boxes", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=10.0, help="wrk duration per concurrency")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--ready-bound", type=float, default=900.0, help="seconds to wait for every route")
    parser.add_argument(
        "--slots",
        type=int,
        default=AGENTS_PER_BOX,
        help="slots per sim box (default: placement's cap of agents per box, so each prefix a box keeps has "
        "a slot of its own); with fewer slots than prefixes per box, calls of different agents share a slot "
        "and an ask whose slot served another agent's call is verified (a probe) before it is ready",
    )
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="idle CPU window before load")
    parser.add_argument("--sim-nice", type=int, default=0, help="nice for the sim process")
    parser.add_argument(
        "--many-first", action="store_true", help="at each concurrency, many agents before one agent"
    )
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args(argv)
    if args.agents < 1 or args.sim_boxes < 2:
        raise SystemExit("--agents must be >= 1 and --sim-boxes >= 2")
    if args.sim_boxes * AGENTS_PER_BOX < args.agents:
        raise SystemExit(f"placement gives a box at most {AGENTS_PER_BOX} agents: --sim-boxes >= agents / 8")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    result = run(args)
    report(result)
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(result), indent=2) + "\n")


if __name__ == "__main__":
    main()
