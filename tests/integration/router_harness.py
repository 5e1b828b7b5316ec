"""A real sglang-router (PyPI wheel, runs on CPU) for integration tests, started with no workers."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from testbed.fleet import free_loopback_port, log_tail

START_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True)
class Router:
    url: str
    metrics_url: str  # its Prometheus exporter


@contextmanager
def running_router(log_path: Path, extra_args: Sequence[str] = ()) -> Iterator[Router]:
    """sglang-router on free loopback ports, round robin, 1 s health checks (and `extra_args`, as a user
    would add them); answering `/workers` before it is yielded, stopped by PID (terminate, then kill)."""
    port, metrics_port = free_loopback_port(), free_loopback_port()
    command = [
        sys.executable, "-m", "sglang_router.launch_router",
        "--host", "127.0.0.1", "--port", str(port),
        "--policy", "round_robin",
        "--health-check-interval-secs", "1",
        "--log-level", "warn",
        # its Prometheus exporter binds a port of its own (default 29000): give it a free one too
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        *extra_args,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"sglang-router exited with {proc.returncode}:\n{log_tail(log_path)}")
            try:
                if httpx.get(f"{url}/workers", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"sglang-router did not answer /workers:\n{log_tail(log_path)}")
            time.sleep(0.2)
        yield Router(url, f"http://127.0.0.1:{metrics_port}/metrics")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
