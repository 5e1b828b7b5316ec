"""Pre-call answers at dialer scale: `POST /v1/prewarm` through a real `warmer serve`, over real llama-server
boxes, driven by a compiled load generator (wrk) on the same machine.

Everything is real: the llama-server fleet (testbed.fleet.LlamaFleet, the generated tiny model), the daemon
as a subprocess with its embedded SQLite file, the HTTP over loopback sockets. Each server variant runs in
the same session, one after the other, over the same fleet:

- `baseline`: the code of `--baseline-ref` (default: the last commit before the pre-call front door),
  extracted with `git archive` and served the same way: the previous code path and server stack;
- `asyncio+h11`: this tree with `api.event_loop = "asyncio"` and `api.http_parser = "h11"`: the code path
  of this tree on the pure-Python server stack;
- `current`: this tree with its defaults (uvloop, httptools, access log off);
- `access log on`: this tree with `api.access_log = true` (concurrency 64 only).

For each variant, once the agent is warm and routed on every box: wrk at each concurrency for `--seconds`
(keep-alive connections, every ask a distinct call id), giving req/s, p50 and p99 (wrk's own latency
record), non-2xx answers and the server's CPU per ask (its /proc utime+stime over the run), then
`GET /healthz` at the highest concurrency (the server's ceiling for a route that does nothing). Then, on
`baseline` and `current`:

- spread and stickiness (first, while the call ledger is empty): 1,000 asks with distinct call ids at
  concurrency 16 (the box each was given), then one more ask for every 10th of them (each must get its
  first box again);
- release latency: every box is restarted (new epochs, empty caches: the agent is cold); once the daemon
  has seen it (the agent has no route left), `--cold-asks` asks are sent at once with `wait_ms` 60 s, and
  each answer's arrival is set against the moment the agent's warm was first verified (the
  `warm_transition` event to `warm` in the daemon's own database).
- connection burst (`current`, then `current` with `api.backlog = 64`): `--cold-asks` new connections at
  once, each one ask for the warm agent; time until all are answered.

Ratios are against the baseline measured in this run; the machine is shared, so absolute figures move
with its load (printed before and after, from `uptime`).

Run: python -m bench.precall_load [--boxes 3] [--seconds 10] [--cold-asks 1000] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

import httpx

from testbed.fleet import LlamaFleet, free_loopback_port, log_tail

REPO = Path(__file__).resolve().parents[1]
AGENT = "outbound-sales"
MODEL = "tiny-demo"
TOKEN = "bench-token"
# The last commit before the pre-call front door: the previous code path and server stack.
DEFAULT_BASELINE_REF = "230dce3"
READY_TIMEOUT_SECONDS = 300.0
COLD_WAIT_MS = 60_000
SPREAD_CALLS = 1000

WRK_DONE = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('RESULT {"requests": %d, "micros": %d, "p50_us": %d, "p99_us": %d, ',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99)))
  io.write(string.format('"max_us": %d, "socket_errors": %d, "non2xx": %d}\\n',
    latency.max, e.connect + e.read + e.write + e.timeout, e.status))
end
"""
WRK_POST = """
local counter = 0
local prefix = "x"
local body_head = '{"agent":"AGENT","call_id":"'
local headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer TOKEN"}
function init(args)
  prefix = args[1] or "x"
end
request = function()
  counter = counter + 1
  local body = body_head .. prefix .. "-" .. tostring(counter) .. '"}'
  return wrk.format("POST", "/v1/prewarm", headers, body)
end
"""


def say(message: str) -> None:
    print(f"[precall_load {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


# ---------------------------------------------------------------------------------------------- variants


@dataclass(frozen=True)
class Variant:
    name: str
    tree: Path  # put first on PYTHONPATH: the warmer package this variant runs
    api_lines: str = ""  # extra `[api]` settings (only trees that know them)


def extract_tree(ref: str, into: Path) -> Path:
    """The repository's files at `ref` (read-only use of the repository: `git archive`)."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", ref], capture_output=True, check=True
    ).stdout
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


# ------------------------------------------------------------------------------------------ the daemon


@dataclass
class Serve:
    process: subprocess.Popen[bytes]
    base_url: str
    port: int
    log: Path
    database: Path

    def cpu_seconds(self) -> float:
        """utime + stime of the daemon process (all its threads) so far."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")


def write_config(workdir: Path, fleet: LlamaFleet, port: int, api_lines: str) -> Path:
    agents = workdir / "agents"
    agents.mkdir()
    shutil.copy(REPO / "config" / "agents" / f"{AGENT}.toml", agents)
    shutil.copy(REPO / "config" / "agents" / f"{AGENT}.tools.json", agents)
    shutil.copytree(REPO / "config" / "agents" / AGENT, agents / AGENT)
    boxes = "\n".join(
        f'[[fleet.boxes]]\nid = "{box.id}"\nbase_url = "{box.base_url}"\nengine = "llamacpp"\n'
        f'model = "{MODEL}"\nslots = {fleet.slots}\n'
        for box in fleet.boxes
    )
    config = workdir / "warmer.toml"
    config.write_text(
        f"""
[database]
state_dir = "{workdir / "state"}"

[api]
host = "127.0.0.1"
port = {port}
tokens = ["{TOKEN}"]
{api_lines}

[reconcile]
ramp_seconds = 1.0
shutdown_grace_seconds = 5.0

[engines]
# The machine is shared and loaded: a 3 s health timeout lets a slow answer bounce a box (a new epoch,
# then a restart warm-up) in the middle of a run.
health_timeout_seconds = 10.0

[dialer]
prewarm_max_wait_seconds = 60.0

[logging]
format = "json"

[fleet]
models_dir = "{REPO / "models"}"
agents_dir = "{agents}"

{boxes}
"""
    )
    return config


@contextlib.contextmanager
def serving(variant: Variant, fleet: LlamaFleet, workdir: Path) -> Iterator[Serve]:
    workdir.mkdir(parents=True)
    port = free_loopback_port()
    config = write_config(workdir, fleet, port, variant.api_lines)
    env = {key: value for key, value in os.environ.items() if not key.startswith("WARMER_")}
    env["PYTHONPATH"] = str(variant.tree)
    log = workdir / "serve.log"
    script = shutil.which("warmer", path=str(Path(sys.executable).parent))
    assert script is not None, "the `warmer` console script is installed next to the interpreter"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [script, "--config", str(config), "serve"], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    serve = Serve(process, f"http://127.0.0.1:{port}", port, log, workdir / "state" / "warmer.db")
    try:
        yield serve
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def routed_boxes(serve: Serve) -> list[str]:
    response = httpx.get(
        f"{serve.base_url}/v1/routes", headers={"authorization": f"Bearer {TOKEN}"}, timeout=10
    )
    response.raise_for_status()
    entry = response.json()["routes"].get(AGENT)
    return [] if entry is None else sorted(route["box_id"] for route in entry["routes"])


def wait_routed(serve: Serve, boxes: Sequence[str], timeout: float = READY_TIMEOUT_SECONDS) -> list[str]:
    """The agent's routed boxes once they are at least two (its placement group starts at two boxes and
    widens with call volume) and have not changed for 3 s, past the 1 s ramp."""
    started = time.monotonic()
    last: list[str] = []
    since = started
    while time.monotonic() - started < timeout:
        if serve.process.poll() is not None:
            raise RuntimeError(f"serve exited with {serve.process.returncode}:\n{log_tail(serve.log)}")
        with contextlib.suppress(httpx.TransportError, httpx.HTTPStatusError):
            routed = routed_boxes(serve)
            if routed != last:
                last, since = routed, time.monotonic()
            elif len(routed) >= min(2, len(boxes)) and time.monotonic() - since >= 3.0:
                return routed
        time.sleep(0.25)
    raise RuntimeError(f"agent not routed within {timeout:.0f}s (last {last}):\n{log_tail(serve.log)}")


# -------------------------------------------------------------------------------------------- wrk runs


@dataclass
class LoadResult:
    variant: str
    route: str
    concurrency: int
    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    socket_errors: int
    non2xx: int
    server_cpu_us_per_request: float


def run_wrk(
    serve: Serve, variant: str, script: Path, path: str, concurrency: int, seconds: float, tag: str
) -> LoadResult:
    cpu_before = serve.cpu_seconds()
    command = [
        "wrk", "-t1", f"-c{concurrency}", f"-d{seconds:g}s", "--timeout", "5s", "-s", str(script),
        f"{serve.base_url}{path}", "--", tag,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    cpu = serve.cpu_seconds() - cpu_before
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no result:\n{done.stdout}\n{done.stderr}")
    raw = json.loads(line.removeprefix("RESULT "))
    secs = raw["micros"] / 1e6
    return LoadResult(
        variant=variant,
        route=path,
        concurrency=concurrency,
        requests=raw["requests"],
        seconds=secs,
        rps=raw["requests"] / secs,
        p50_ms=raw["p50_us"] / 1000,
        p99_ms=raw["p99_us"] / 1000,
        max_ms=raw["max_us"] / 1000,
        socket_errors=raw["socket_errors"],
        non2xx=raw["non2xx"],
        server_cpu_us_per_request=cpu / max(1, raw["requests"]) * 1e6,
    )


# ------------------------------------------------------------------------ a minimal HTTP/1.1 client


class Connection:
    """One keep-alive HTTP/1.1 connection: cheap per answer, so a burst's answers are timed as they come."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int) -> None:
        self._reader, self._writer, self._port = reader, writer, port

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer, port)

    async def ask(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        payload = json.dumps(body).encode()
        self._writer.write(
            b"POST /v1/prewarm HTTP/1.1\r\nhost: 127.0.0.1:%d\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer %s\r\ncontent-length: %d\r\n\r\n%s"
            % (self._port, TOKEN.encode(), len(payload), payload)
        )
        head = await self._reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        answer = await self._reader.readexactly(length)
        return status, json.loads(answer)

    def close(self) -> None:
        self._writer.close()


def ask_body(call_id: str, wait_ms: int = 0) -> dict[str, Any]:
    return {"agent": AGENT, "call_id": call_id, "wait_ms": wait_ms}


@dataclass
class Spread:
    calls: int
    by_box: dict[str, int]
    not_ready: int
    non200: int
    retried: int
    kept_box: int


async def spread_and_stickiness(serve: Serve, tag: str, concurrency: int = 16) -> Spread:
    calls = [f"{tag}-{i}" for i in range(SPREAD_CALLS)]
    given: dict[str, str] = {}
    statuses: Counter[int] = Counter()
    not_ready = 0
    queue = list(reversed(calls))

    async def worker() -> None:
        nonlocal not_ready
        connection = await Connection.open(serve.port)
        try:
            while queue:
                call = queue.pop()
                status, body = await connection.ask(ask_body(call))
                statuses[status] += 1
                if status == 200:
                    given[call] = body["box_id"]
                    not_ready += not body["ready"]
        finally:
            connection.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    retried = calls[::10]
    connection = await Connection.open(serve.port)
    kept = 0
    try:
        for call in retried:
            status, body = await connection.ask(ask_body(call))
            kept += status == 200 and body["box_id"] == given.get(call)
    finally:
        connection.close()
    return Spread(
        calls=len(calls),
        by_box=dict(sorted(Counter(given.values()).items())),
        not_ready=not_ready,
        non200=sum(n for code, n in statuses.items() if code != 200),
        retried=len(retried),
        kept_box=kept,
    )


@dataclass
class Burst:
    asks: int
    answered: int
    ready: int
    statuses: dict[int, int]
    answered_at: list[float] = field(default_factory=list, repr=False)  # wall clock, seconds


async def burst(serve: Serve, asks: int, tag: str, wait_ms: int) -> Burst:
    """`asks` new connections at once, one ask each; the arrival time of every answer."""
    result = Burst(asks=asks, answered=0, ready=0, statuses={})
    statuses: Counter[int] = Counter()
    gate = asyncio.Event()

    async def one(i: int) -> None:
        await gate.wait()
        connection = await Connection.open(serve.port)
        try:
            status, body = await connection.ask(ask_body(f"{tag}-{i}", wait_ms))
        finally:
            connection.close()
        result.answered_at.append(time.time())
        statuses[status] += 1
        if status == 200:
            result.answered += 1
            result.ready += bool(body["ready"])

    tasks = [asyncio.create_task(one(i)) for i in range(asks)]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(*tasks)
    result.statuses = dict(statuses)
    return result


@dataclass
class Release:
    asks: int
    answered_ready: int
    verified_at: float | None
    first_release_ms: float | None
    p50_release_ms: float | None
    p99_release_ms: float | None
    last_release_ms: float | None
    warms_after_restart: int


def first_verification(database: Path, since: float) -> tuple[float | None, int]:
    """(when the agent's prefix was first verified warm after `since`, warms started since), from the
    daemon's own event history."""
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        rows = db.execute(
            "SELECT at, detail FROM events WHERE kind = 'warm_transition' AND at >= ? ORDER BY at", (since,)
        ).fetchall()
    verified = [at for at, detail in rows if json.loads(detail).get("to") == "warm"]
    started = [at for at, detail in rows if json.loads(detail).get("to") == "warming"]
    return (verified[0] if verified else None), len(started)


def cold_release(serve: Serve, fleet: LlamaFleet, asks: int, tag: str) -> Release:
    """Restart every box (the agent goes cold), ask `asks` times at once with a long wait, and time each
    answer from the agent's first verified warm."""
    since = time.time()
    for box in fleet.boxes:
        fleet.restart(box.id)
    # Until its health poll sees the new epochs the daemon still routes the old ones: ask once it has.
    deadline = time.monotonic() + 120
    while routed_boxes(serve) and time.monotonic() < deadline:
        time.sleep(0.1)
    answered = asyncio.run(burst(serve, asks, tag, COLD_WAIT_MS))
    time.sleep(1.0)  # the event row is written as the record changes; give the store a moment
    verified_at, warms = first_verification(serve.database, since)
    delays = sorted((t - verified_at) * 1000 for t in answered.answered_at) if verified_at else []

    def pick(q: float) -> float | None:
        return delays[min(len(delays) - 1, int(q * len(delays)))] if delays else None

    return Release(
        asks=asks,
        answered_ready=answered.ready,
        verified_at=verified_at,
        first_release_ms=delays[0] if delays else None,
        p50_release_ms=pick(0.5),
        p99_release_ms=pick(0.99),
        last_release_ms=delays[-1] if delays else None,
        warms_after_restart=warms,
    )


@dataclass
class ConnectionBurst:
    variant: str
    asks: int
    ready: int
    seconds: float
    statuses: dict[int, int]


async def connection_burst(serve: Serve, variant: str, asks: int, tag: str) -> ConnectionBurst:
    started = time.time()
    result = await burst(serve, asks, tag, 0)
    return ConnectionBurst(variant, asks, result.ready, max(result.answered_at) - started, result.statuses)


# ------------------------------------------------------------------------------------------------ run


@dataclass
class VariantResult:
    variant: str
    ready_seconds: float
    routed_at_start: list[str]
    loads: list[LoadResult]
    spread: Spread | None = None
    release: Release | None = None
    # warning lines the daemon logged during the load runs, by message (e.g. a health poll that timed out
    # while the loop was saturated takes a box out of every route)
    warnings_under_load: dict[str, int] = field(default_factory=dict)


def warnings(serve: Serve, skip_lines: int) -> dict[str, int]:
    found: Counter[str] = Counter()
    for line in serve.log.read_bytes().splitlines()[skip_lines:]:
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if record.get("level") in ("warning", "error"):
                found[f"{record.get('event')} ({record.get('box', '')})"] += 1
    return dict(found)


def run_variant(
    variant: Variant,
    fleet: LlamaFleet,
    workdir: Path,
    args: argparse.Namespace,
    *,
    levels: Sequence[int],
    probes: bool,
) -> tuple[VariantResult, list[ConnectionBurst]]:
    post = workdir / "post.lua"
    post.write_text(WRK_POST.replace("AGENT", AGENT).replace("TOKEN", TOKEN) + WRK_DONE)
    get = workdir / "get.lua"
    get.write_text(WRK_DONE)
    tag = variant.name.replace(" ", "_").replace("+", "_")
    box_ids = [box.id for box in fleet.boxes]
    bursts: list[ConnectionBurst] = []
    with serving(variant, fleet, workdir / tag) as serve:
        started = time.monotonic()
        routed = wait_routed(serve, box_ids)
        ready = time.monotonic() - started
        say(f"{variant.name}: routed on {routed} after {ready:.1f}s")
        spread = asyncio.run(spread_and_stickiness(serve, f"{tag}-spread")) if probes else None
        logged_before = len(serve.log.read_bytes().splitlines())
        run_wrk(serve, variant.name, post, "/v1/prewarm", max(levels), 2, f"{tag}-warmup")
        loads = []
        for concurrency in levels:
            loads.append(
                run_wrk(
                    serve,
                    variant.name,
                    post,
                    "/v1/prewarm",
                    concurrency,
                    args.seconds,
                    f"{tag}-c{concurrency}",
                )
            )
            say(f"{variant.name}: c={concurrency}: {loads[-1].rps:,.0f} req/s, p99 {loads[-1].p99_ms:.1f} ms")
        loads.append(run_wrk(serve, variant.name, get, "/healthz", max(levels), args.seconds, "healthz"))
        result = VariantResult(
            variant.name, ready, routed, loads, warnings_under_load=warnings(serve, logged_before)
        )
        if spread is not None:
            result.spread = spread
            say(f"{variant.name}: spread {spread.by_box}, kept {spread.kept_box}")
            bursts.append(asyncio.run(connection_burst(serve, variant.name, args.cold_asks, f"{tag}-conn")))
            result.release = cold_release(serve, fleet, args.cold_asks, f"{tag}-cold")
            say(f"{variant.name}: release {result.release}")
            wait_routed(serve, box_ids)
    return result, bursts


def backlog_burst(fleet: LlamaFleet, workdir: Path, tree: Path, asks: int, backlog: int) -> ConnectionBurst:
    name = f"current, backlog {backlog}"
    variant = Variant(name, tree, f"backlog = {backlog}")
    with serving(variant, fleet, workdir / f"backlog-{backlog}") as serve:
        wait_routed(serve, [box.id for box in fleet.boxes])
        return asyncio.run(connection_burst(serve, name, asks, f"backlog{backlog}"))


def ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}×" if base else "n/a"


def report(results: Sequence[VariantResult], bursts: Sequence[ConnectionBurst], baseline: str) -> None:
    base = {(r.route, r.concurrency): r for v in results if v.variant == baseline for r in v.loads}
    print(
        "| variant | route | concurrency | req/s | p50 ms | p99 ms | non-2xx | server CPU µs/req "
        "| req/s vs baseline | p99 vs baseline |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for v in results:
        for r in v.loads:
            b = base.get((r.route, r.concurrency))
            print(
                f"| {r.variant} | {r.route} | {r.concurrency} | {r.rps:,.0f} | {r.p50_ms:.2f} "
                f"| {r.p99_ms:.2f} | "
                f"{r.non2xx + r.socket_errors} | {r.server_cpu_us_per_request:,.0f} | "
                f"{ratio(r.rps, b.rps) if b else 'n/a'} | {ratio(r.p99_ms, b.p99_ms) if b else 'n/a'} |"
            )
    print()
    print("| variant | warnings logged under load |")
    print("|---|---|")
    for v in results:
        print(f"| {v.variant} | {v.warnings_under_load or 'none'} |")
    print()
    print("| variant | routed boxes | calls | by box | not ready | retried | kept their box |")
    print("|---|---|---|---|---|---|---|")
    for v in results:
        if v.spread is not None:
            s = v.spread
            print(
                f"| {v.variant} | {', '.join(v.routed_at_start)} | {s.calls} | {s.by_box} | {s.not_ready} "
                f"| {s.retried} | {s.kept_box} |"
            )
    print()
    print(
        "| variant | asks waiting | answered ready | warms started | first ms | p50 ms | p99 ms | last ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for v in results:
        if v.release is not None:
            r = v.release

            def ms(x: float | None) -> str:
                return "n/a" if x is None else f"{x:,.0f}"

            print(
                f"| {v.variant} | {r.asks} | {r.answered_ready} | {r.warms_after_restart} | "
                f"{ms(r.first_release_ms)} | {ms(r.p50_release_ms)} | {ms(r.p99_release_ms)} | "
                f"{ms(r.last_release_ms)} |"
            )
    print()
    print("| variant | new connections at once | answered ready | seconds until all answered | statuses |")
    print("|---|---|---|---|---|")
    for b in bursts:
        print(f"| {b.variant} | {b.asks} | {b.ready} | {b.seconds:.2f} | {b.statuses} |")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--boxes", type=int, default=3)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0, help="wrk duration per concurrency")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--cold-asks", type=int, default=1000)
    parser.add_argument("--baseline-ref", default=DEFAULT_BASELINE_REF)
    parser.add_argument("--no-baseline", action="store_true", help="skip the baseline variant")
    parser.add_argument("--variants", default="baseline,asyncio+h11,current,access log on,backlog")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: the daemon and the llama-server boxes are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    from testbed.llama_build import ensure_llama_server
    from testbed.tiny_model import ensure_tiny_model

    levels = [int(c) for c in args.concurrency.split(",")]
    wanted = {name.strip() for name in args.variants.split(",")}
    if args.no_baseline:
        wanted.discard("baseline")
    load_before = uptime()
    say(f"load before: {load_before}")
    results: list[VariantResult] = []
    bursts: list[ConnectionBurst] = []
    with tempfile.TemporaryDirectory(prefix="precall-load-") as tmp:
        workdir = Path(tmp)
        fleet = LlamaFleet(
            args.boxes,
            binary=ensure_llama_server(),
            model=ensure_tiny_model(),
            slots=args.slots,
            ctx_per_slot=4096,
            log_dir=workdir / "fleet",
        )
        with fleet:
            variants: list[tuple[Variant, Sequence[int], bool]] = []
            if "baseline" in wanted:
                tree = extract_tree(args.baseline_ref, workdir / "baseline-tree")
                variants.append((Variant("baseline", tree), levels, True))
            if "asyncio+h11" in wanted:
                stack = 'event_loop = "asyncio"\nhttp_parser = "h11"'
                variants.append((Variant("asyncio+h11", REPO, stack), levels, False))
            if "current" in wanted:
                variants.append((Variant("current", REPO), levels, True))
            if "access log on" in wanted:
                variants.append((Variant("access log on", REPO, "access_log = true"), [max(levels)], False))
            for variant, variant_levels, probes in variants:
                result, found = run_variant(
                    variant, fleet, workdir, args, levels=variant_levels, probes=probes
                )
                results.append(result)
                bursts.extend(found)
            if "backlog" in wanted:
                bursts.append(backlog_burst(fleet, workdir, REPO, args.cold_asks, 64))
    load_after = uptime()
    say(f"load after: {load_after}")
    print(f"load before: `{load_before}`; after: `{load_after}`\n")
    baseline = "baseline" if "baseline" in wanted else (results[0].variant if results else "")
    report(results, bursts, baseline)
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "load_before": load_before,
                    "load_after": load_after,
                    "variants": [asdict(r) for r in results],
                    "bursts": [asdict(b) for b in bursts],
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
