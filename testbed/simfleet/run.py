"""Running a simulated fleet: one process serving a range of boxes (`serve`), several of them as
subprocesses (`running_simfleet`, a context manager for tests and benches), and the fleet file warmer reads.

Each process binds its own loopback port and prints one JSON line (its `/_sim/fleet` answer plus its pid
and port) on stdout once it accepts connections; the parent reads that line, so nothing polls for
readiness. `SimFleet` then drives the boxes through their process's control routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from testbed.simfleet.app import SimFleetApp
from testbed.simfleet.box import BoxConfig
from testbed.simfleet.tokens import DEFAULT_TOKENIZER, SimTokenizer

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_SECONDS = 60.0


def bind_loopback(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(4096)
    sock.set_inheritable(True)
    return sock


def _server(app: SimFleetApp) -> Any:
    import uvicorn

    return uvicorn.Server(
        uvicorn.Config(
            app,
            loop="none",
            http="httptools",
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_keep_alive=60,
            backlog=4096,
        )
    )


async def serve(
    config: BoxConfig,
    *,
    count: int,
    first: int = 0,
    host: str = "127.0.0.1",
    port: int = 0,
    id_prefix: str = "sim-",
    tokenizer: Path = DEFAULT_TOKENIZER,
) -> None:
    """Serve boxes `first .. first + count - 1` until cancelled or signalled; announce them on stdout."""
    sock = bind_loopback(host, port)
    bound = sock.getsockname()[1]
    app = SimFleetApp(
        config,
        count=count,
        first=first,
        id_prefix=id_prefix,
        base_url=f"http://{host}:{bound}",
        tokenizer=SimTokenizer(tokenizer),
    )
    # The socket listens already: connections made from now on wait in its backlog until uvicorn accepts.
    print(json.dumps({**app.fleet(), "pid": os.getpid(), "port": bound}), flush=True)
    await _server(app).serve(sockets=[sock])


@contextlib.asynccontextmanager
async def simfleet_in_process(
    boxes: int,
    config: BoxConfig | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    id_prefix: str = "sim-",
) -> AsyncIterator[SimFleetApp]:
    """`boxes` boxes served on a loopback socket by this process's running event loop (for tests and benches
    that want the app's state at hand); `app.base_url` is where they listen. Stopped on exit."""
    sock = bind_loopback(host, port)
    app = SimFleetApp(
        config or BoxConfig(),
        count=boxes,
        id_prefix=id_prefix,
        base_url=f"http://{host}:{sock.getsockname()[1]}",
    )
    server = _server(app)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield app
    finally:
        server.should_exit = True
        await task
        sock.close()


def fleet_toml(boxes: Sequence[dict[str, Any]], *, engine: str, model: str, slots: int) -> str:
    """`[[fleet.boxes]]` entries for warmer's config (warmer/config/fleet_settings.py `BoxSettings`)."""
    return "\n".join(
        f'[[fleet.boxes]]\nid = "{box["id"]}"\nbase_url = "{box["base_url"]}"\nengine = "{engine}"\n'
        f'model = "{model}"\nslots = {slots}\n'
        for box in boxes
    )


@dataclass(frozen=True)
class SimProcess:
    pid: int
    port: int
    first: int
    count: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class SimFleet:
    """A running simulated fleet (see `running_simfleet`): its boxes, processes and control calls."""

    config: BoxConfig
    boxes: list[dict[str, Any]]  # {"id", "base_url"} in index order
    processes: list[SimProcess]
    client: httpx.Client

    def box_ids(self) -> list[str]:
        return [box["id"] for box in self.boxes]

    def toml(self) -> str:
        return fleet_toml(
            self.boxes, engine=self.config.engine.value, model=self.config.model, slots=self.config.slots
        )

    def _process(self, index: int) -> SimProcess:
        for process in self.processes:
            if process.first <= index < process.first + process.count:
                return process
        raise KeyError(f"no box {index} in this fleet")

    def _post(self, url: str, body: dict[str, Any]) -> Any:
        response = self.client.post(url, json=body)
        response.raise_for_status()
        return response.json()

    def restart(self, indices: Sequence[int], *, down_seconds: float = 0.0) -> None:
        """Restart these boxes at once (one control request per process)."""
        for process in self.processes:
            mine = [i for i in indices if process.first <= i < process.first + process.count]
            if mine:
                self._post(f"{process.url}/_sim/restart", {"boxes": mine, "down_seconds": down_seconds})

    def set_health(self, indices: Sequence[int], mode: str, *, delay_seconds: float = 0.0) -> None:
        for process in self.processes:
            mine = [i for i in indices if process.first <= i < process.first + process.count]
            if mine:
                body = {"boxes": mine, "mode": mode, "delay_seconds": delay_seconds}
                self._post(f"{process.url}/_sim/health", body)

    def box_state(self, index: int) -> dict[str, Any]:
        response = self.client.get(f"{self._process(index).url}/_sim/box/{index}")
        response.raise_for_status()
        state: dict[str, Any] = response.json()
        return state

    def cached_tokens(self, index: int, tokens: Sequence[int]) -> int:
        """Leading `tokens` the box holds now (its recency untouched)."""
        body = self._post(f"{self._process(index).url}/_sim/box/{index}/lookup", {"tokens": list(tokens)})
        return int(body["cached_tokens"])

    def stats(self) -> dict[str, Any]:
        """Requests by class per box and in total, merged over the processes."""
        boxes: dict[str, dict[str, int]] = {}
        totals: Counter[str] = Counter()
        routes: Counter[str] = Counter()
        for process in self.processes:
            response = self.client.get(f"{process.url}/_sim/stats")
            response.raise_for_status()
            part = response.json()
            boxes.update(part["boxes"])
            totals.update(part["totals"])
            routes.update(part["routes"])
        return {"boxes": boxes, "totals": dict(totals), "routes": dict(routes)}


def _child_command(
    config: BoxConfig, *, first: int, count: int, port: int, id_prefix: str, tokenizer: Path
) -> list[str]:
    options = asdict(config)
    command = [
        sys.executable,
        "-m",
        "testbed",
        "simfleet",
        "--boxes",
        str(count),
        "--first",
        str(first),
        "--port",
        str(port),
        "--id-prefix",
        id_prefix,
        "--tokenizer",
        str(tokenizer),
        "--serve-only",
    ]
    for name, value in options.items():
        command += [f"--{name.replace('_', '-')}", str(value)]
    return command


def split(boxes: int, processes: int) -> list[tuple[int, int]]:
    """(first, count) of each process: boxes spread as evenly as they go."""
    if boxes < 1 or processes < 1:
        raise ValueError("boxes and processes must be >= 1")
    processes = min(processes, boxes)
    base, extra = divmod(boxes, processes)
    ranges, first = [], 0
    for k in range(processes):
        count = base + (1 if k < extra else 0)
        ranges.append((first, count))
        first += count
    return ranges


@contextlib.contextmanager
def running_simfleet(
    boxes: int,
    config: BoxConfig | None = None,
    *,
    processes: int = 1,
    port: int = 0,
    id_prefix: str = "sim-",
    tokenizer: Path = DEFAULT_TOKENIZER,
    nice: int = 0,
) -> Iterator[SimFleet]:
    """`boxes` simulated boxes in `processes` subprocesses on loopback; stopped (by pid) on exit.
    `port` 0: free ports; else process k listens on `port + k`."""
    config = config or BoxConfig()
    children: list[subprocess.Popen[str]] = []
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    try:
        for k, (first, count) in enumerate(split(boxes, processes)):
            command = _child_command(
                config,
                first=first,
                count=count,
                port=port + k if port else 0,
                id_prefix=id_prefix,
                tokenizer=tokenizer,
            )
            if nice:
                command = ["nice", "-n", str(nice), *command]
            children.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO))
        announced = [_announcement(child) for child in children]
        fleet = SimFleet(
            config=config,
            boxes=[box for part in announced for box in part["boxes"]],
            processes=[
                SimProcess(part["pid"], part["port"], first, count)
                for part, (first, count) in zip(announced, split(boxes, processes), strict=True)
            ],
            client=httpx.Client(timeout=30),
        )
        try:
            yield fleet
        finally:
            fleet.client.close()
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            if child.stdout is not None:
                child.stdout.close()


def _announcement(child: subprocess.Popen[str]) -> dict[str, Any]:
    assert child.stdout is not None
    line = child.stdout.readline()  # the child prints it once listening, or exits (EOF)
    if not line:
        raise RuntimeError(f"simfleet process {child.pid} exited with {child.wait()} before listening")
    announced: dict[str, Any] = json.loads(line)
    return announced
