"""What one simulated-fleet process (testbed/simfleet) costs, so a many-box bench knows the sim is not its
bottleneck.

Three measurements, each from the sim process's own /proc utime+stime over a window:

- `max`: a load generator process (plain asyncio sockets, keep-alive, `--connections` connections) sends
  GET /health and GET /props round-robin over the N boxes as fast as the sim answers: the sim's CPU
  milliseconds per request. One core divided by that cost is what one sim process can serve.
- `paced`: the same at the rate warmer polls today at its default interval (4 control requests per box per
  5 s: the health timer and every reconcile pass each ask /health and /props): the sim's CPU share at N boxes.
- `warmer`: N sim boxes polled by a real `warmer serve` at its DEFAULT reconcile and health intervals, one
  agent: after `--settle` seconds, a `--window`-second window gives the sim's CPU share, the requests it
  answered per second (control and work apart, from its own counters) and control requests per box per
  minute, with the daemon's CPU share beside it (on a loaded 2-core machine the daemon, not the sim, sets
  the pace: compare its request rate with `paced`).

Run: python -m bench.simfleet_load [--boxes 1000] [--settle 90] [--window 60] [--only max|paced|warmer]
     [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from testbed.fleet import free_loopback_port
from testbed.simfleet import BoxConfig, SimEngine, SimFleet, running_simfleet

REPO = Path(__file__).resolve().parents[1]
AGENT = "outbound-sales"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def totals(fleet: SimFleet) -> dict[str, int]:
    return dict(fleet.stats()["totals"])


def write_config(tmp: Path, fleet: SimFleet, port: int) -> Path:
    agents = tmp / "agents"
    agents.mkdir()
    source = REPO / "config" / "agents"
    shutil.copy(source / f"{AGENT}.toml", agents)
    shutil.copy(source / f"{AGENT}.tools.json", agents)
    shutil.copytree(source / AGENT, agents / AGENT)
    config = tmp / "warmer.toml"
    config.write_text(
        f'[database]\nstate_dir = "{tmp / "state"}"\n\n[api]\nhost = "127.0.0.1"\nport = {port}\n\n'
        f'[logging]\nformat = "json"\nlevel = "warning"\n\n'
        f'[fleet]\nmodels_dir = "{REPO / "models"}"\nagents_dir = "{agents}"\n\n{fleet.toml()}'
    )
    return config


@contextmanager
def warmer_serve(config: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    script = shutil.which("warmer", path=str(Path(sys.executable).parent)) or "warmer"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMER_")}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [script, "--config", str(config), "serve"], stdout=out, stderr=out, env=env
        )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def measure_with_warmer(boxes: int, settle: float, window: float) -> dict[str, Any]:
    config = BoxConfig(engine=SimEngine.LLAMACPP, slots=2, context_tokens=4096, cache_tokens=8192)
    with running_simfleet(boxes, config) as fleet, tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        port = free_loopback_port()
        with warmer_serve(write_config(tmp, fleet, port), tmp / "serve.log") as serve:
            time.sleep(settle)
            if serve.poll() is not None:
                raise RuntimeError(f"warmer serve exited: {(tmp / 'serve.log').read_text()[-3000:]}")
            sim_pid = fleet.processes[0].pid
            sim0, serve0, counts0, t0 = (
                cpu_seconds(sim_pid),
                cpu_seconds(serve.pid),
                totals(fleet),
                time.monotonic(),
            )
            time.sleep(window)
            sim1, serve1, counts1, t1 = (
                cpu_seconds(sim_pid),
                cpu_seconds(serve.pid),
                totals(fleet),
                time.monotonic(),
            )
    elapsed = t1 - t0
    delta = {k: counts1.get(k, 0) - counts0.get(k, 0) for k in ("control", "work", "tokenize")}
    requests = sum(delta.values())
    return {
        "boxes": boxes,
        "window_seconds": round(elapsed, 1),
        "sim_cpu_percent": round(100 * (sim1 - sim0) / elapsed, 1),
        "serve_cpu_percent": round(100 * (serve1 - serve0) / elapsed, 1),
        "sim_requests_per_second": round(requests / elapsed, 1),
        "by_class_per_second": {k: round(v / elapsed, 1) for k, v in delta.items()},
        "control_requests_per_box_per_minute": round(delta["control"] / boxes / elapsed * 60, 2),
        "sim_cpu_ms_per_request": round(1000 * (sim1 - sim0) / requests, 3) if requests else None,
    }


# A load generator in a process of its own: keep-alive connections, raw HTTP/1.1, requests spread round-robin
# over the boxes and the paths; with a rate, each connection sends on its own schedule (rate / connections).
LOADGEN = r"""
import asyncio, sys, time
port, boxes, connections, seconds = (int(a) for a in sys.argv[1:5])
rate, paths = float(sys.argv[5]), sys.argv[6].split(",")
done = 0
async def worker(k):
    global done
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.monotonic()
    stop, gap, n = start + seconds, (connections / rate if rate > 0 else 0.0), 0
    while time.monotonic() < stop:
        if gap:
            await asyncio.sleep(max(0.0, start + n * gap - time.monotonic()))
        i = k + n * connections
        path = paths[(i // boxes) % len(paths)]
        writer.write(f"GET /box/{i % boxes}{path} HTTP/1.1\r\nHost: sim\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        done += 1
        n += 1
    writer.close()
async def main():
    await asyncio.gather(*(worker(k) for k in range(connections)))
asyncio.run(main())
print(done)
"""

# What warmer sends a llama.cpp box per poll interval today (issue 22: the health timer and every reconcile
# pass each poll health and epoch): /health and /props, twice.
POLL_PATHS = "/health,/props"
POLL_REQUESTS_PER_BOX = 4
POLL_SECONDS = 5.0


def measure_load(boxes: int, connections: int, seconds: float, rate: float) -> dict[str, Any]:
    """The sim under the load generator; `rate` 0: as fast as it answers."""
    with running_simfleet(boxes, BoxConfig(engine=SimEngine.LLAMACPP)) as fleet:
        process = fleet.processes[0]
        sim0, t0 = cpu_seconds(process.pid), time.monotonic()
        command = [sys.executable, "-c", LOADGEN, str(process.port), str(boxes), str(connections)]
        command += [str(int(seconds)), str(rate), POLL_PATHS]
        out = subprocess.run(command, capture_output=True, text=True, check=True)
        sim1, t1 = cpu_seconds(process.pid), time.monotonic()
        answered = int(out.stdout.strip())
        counted = sum(totals(fleet).values())
    elapsed = t1 - t0
    return {
        "boxes": boxes,
        "connections": connections,
        "target_rate": rate or None,
        "requests": answered,
        "sim_counted_requests": counted,
        "requests_per_second": round(answered / elapsed, 1),
        "sim_cpu_percent": round(100 * (sim1 - sim0) / elapsed, 1),
        "sim_cpu_ms_per_request": round(1000 * (sim1 - sim0) / answered, 4),
        "requests_per_cpu_second": round(answered / (sim1 - sim0), 1) if sim1 > sim0 else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boxes", type=int, default=1000)
    parser.add_argument(
        "--settle", type=float, default=90.0, help="seconds after serve starts, before the window"
    )
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--connections", type=int, default=32, help="load generator connections")
    parser.add_argument("--only", choices=["max", "paced", "warmer"], default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))  # so every process started is stopped
    result: dict[str, Any] = {"load_before": load()}
    if args.only in (None, "max"):
        result["max"] = measure_load(args.boxes, args.connections, min(args.window, 20.0), 0.0)
        print(json.dumps({"max": result["max"]}), flush=True)
    if args.only in (None, "paced"):
        rate = args.boxes * POLL_REQUESTS_PER_BOX / POLL_SECONDS
        result["paced"] = measure_load(args.boxes, args.connections, args.window, rate)
        print(json.dumps({"paced": result["paced"]}), flush=True)
    if args.only in (None, "warmer"):
        result["warmer"] = measure_with_warmer(args.boxes, args.settle, args.window)
        print(json.dumps({"warmer": result["warmer"]}), flush=True)
    result["load_after"] = load()
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
