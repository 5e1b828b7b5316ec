"""A local fleet of real `llama-server` boxes on loopback ports, for integration tests and the demo.

Each box is one llama-server process with its own prefix cache. Flags that matter to warmer
(see llama.cpp `tools/server/README.md`, the server parameter table):

- `--metrics`: expose `/metrics` (`llamacpp:prompt_tokens_cached_total` and friends).
- `--parallel N` with `-c N*ctx_per_slot`: the context is split evenly across the slots.
- `--cache-ram 0`: disable the host-RAM prompt cache, so a prompt evicted from a slot is really gone
  (by default llama-server keeps evicted prompts in RAM and revives them, hiding evictions). The default
  here; `cache_ram_mib` > 0 gives each box a host prompt cache of that many MiB instead (common/arg.cpp:
  `--cache-ram N`, "maximum cache size in MiB"), a box that holds more prompts than it has slots.
- `-t`: threads per box; this bench runs on 2 cores, so a box gets 1 or 2.

Processes are tracked and stopped by PID only. A restart keeps the port and arguments, so the same
box comes back with an empty cache: a new engine epoch.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import httpx

_LOG_TAIL_LINES = 40


class FleetError(RuntimeError):
    """A box did not start or is unknown; the message names the box and carries its log tail."""


@dataclass(frozen=True)
class LlamaBox:
    """One running llama-server. `pid` changes when the box is restarted; `port` never does."""

    id: str
    port: int
    base_url: str
    pid: int
    log_path: Path
    slots: int


def free_loopback_port() -> int:
    """A free TCP port on 127.0.0.1 from the kernel (racy, so start-up retries on a bind failure)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class LlamaFleet:
    """Starts N llama-server boxes ("llama-0", "llama-1", ...) and stops them all, by PID, at the end."""

    def __init__(
        self,
        n: int,
        *,
        binary: Path,
        model: Path,
        slots: int = 1,
        ctx_per_slot: int = 4096,
        threads: int = 1,
        log_dir: Path | None = None,
        health_timeout: float = 120.0,
        stop_timeout: float = 10.0,
        cache_ram_mib: int = 0,
        extra_args: Sequence[str] = (),
    ) -> None:
        if n < 1:
            raise ValueError(f"n (number of boxes) must be >= 1, got {n}")
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        if ctx_per_slot < 16:
            raise ValueError(f"ctx_per_slot must be >= 16, got {ctx_per_slot}")
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if cache_ram_mib < 0:
            raise ValueError(f"cache_ram_mib must be >= 0, got {cache_ram_mib}")
        self.n = n
        self.binary = binary
        self.model = model
        self.slots = slots
        self.ctx_per_slot = ctx_per_slot
        self.threads = threads
        self.log_dir = log_dir
        self.health_timeout = health_timeout
        self.stop_timeout = stop_timeout
        self.cache_ram_mib = cache_ram_mib
        self.extra_args = tuple(extra_args)
        self._boxes: dict[str, LlamaBox] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._started = False

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> list[LlamaBox]:
        """Start every box and wait until each answers `/health` 200. On failure, stop what started."""
        if self._started:
            return self.boxes
        if self.log_dir is None:
            self.log_dir = Path(tempfile.mkdtemp(prefix="warmer-llama-fleet-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._started = True
        atexit.register(self.stop)  # never leave orphans behind if the caller forgets
        try:
            # Launch all first, then wait: the boxes load their models concurrently.
            for index in range(self.n):
                self._launch_on_free_port(f"llama-{index}")
            for box_id in list(self._boxes):
                self._wait_healthy_or_relaunch(box_id)
        except BaseException:
            self.stop()
            raise
        return self.boxes

    def stop(self) -> None:
        """Terminate every box by PID, then SIGKILL any that outlive `stop_timeout` seconds."""
        procs = list(self._procs.items())
        for _, proc in procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + self.stop_timeout
        for _, proc in procs:
            remaining = max(0.0, deadline - time.monotonic())
            try:
                proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()
        self._started = False
        atexit.unregister(self.stop)

    def restart(self, box_id: str) -> LlamaBox:
        """Stop the box and start a fresh process on the same port and args: an empty cache, a new epoch."""
        old = self.box(box_id)
        self._stop_one(box_id)
        for attempt in range(20):
            self._launch(box_id, old.port)
            try:
                self._wait_healthy(box_id)
                break
            except _BindFailed:
                # The old socket may linger a moment after the process exits; try the same port again.
                time.sleep(0.25 * (attempt + 1))
        else:
            raise FleetError(f"{box_id}: could not rebind port {old.port}\n{log_tail(old.log_path)}")
        return self._boxes[box_id]

    def kill(self, box_id: str) -> None:
        """SIGKILL the box (a crash, not a shutdown). `restart` brings it back on the same port."""
        self.box(box_id)
        proc = self._procs.get(box_id)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    def is_running(self, box_id: str) -> bool:
        proc = self._procs.get(box_id)
        return proc is not None and proc.poll() is None

    # -- lookup ------------------------------------------------------------------------------------

    @property
    def boxes(self) -> list[LlamaBox]:
        return list(self._boxes.values())

    def box(self, box_id: str) -> LlamaBox:
        try:
            return self._boxes[box_id]
        except KeyError:
            known = ", ".join(self._boxes) or "none"
            raise FleetError(f"unknown box id {box_id!r} (known: {known})") from None

    def command(self, port: int) -> list[str]:
        """The llama-server command line for a box on `port`."""
        return [
            str(self.binary),
            "--model", str(self.model),
            "--host", "127.0.0.1",
            "--port", str(port),
            "--metrics",
            "--parallel", str(self.slots),
            "--ctx-size", str(self.slots * self.ctx_per_slot),
            "--cache-ram", str(self.cache_ram_mib),
            "--threads", str(self.threads),
            *self.extra_args,
        ]  # fmt: skip

    def __enter__(self) -> LlamaFleet:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals ---------------------------------------------------------------------------------

    def _log_path(self, box_id: str) -> Path:
        assert self.log_dir is not None
        return self.log_dir / f"{box_id}.log"

    def _launch(self, box_id: str, port: int) -> None:
        log_path = self._log_path(box_id)
        with log_path.open("ab") as log:
            log.write(f"\n=== warmer testbed: starting {box_id} on port {port} ===\n".encode())
            log.flush()
            proc = subprocess.Popen(
                self.command(port),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Own process group: a terminal Ctrl-C reaches only the Python parent, which then
                # stops the boxes in order instead of racing them.
                start_new_session=True,
            )
        self._procs[box_id] = proc
        self._boxes[box_id] = LlamaBox(
            id=box_id,
            port=port,
            base_url=f"http://127.0.0.1:{port}",
            pid=proc.pid,
            log_path=log_path,
            slots=self.slots,
        )

    def _launch_on_free_port(self, box_id: str) -> None:
        self._launch(box_id, free_loopback_port())

    def _wait_healthy_or_relaunch(self, box_id: str) -> None:
        """A fresh port can be taken between picking and binding it; pick another a few times."""
        for _ in range(5):
            try:
                self._wait_healthy(box_id)
                return
            except _BindFailed:
                self._launch_on_free_port(box_id)
        self._wait_healthy(box_id)

    def _wait_healthy(self, box_id: str) -> None:
        box = self._boxes[box_id]
        proc = self._procs[box_id]
        deadline = time.monotonic() + self.health_timeout
        with httpx.Client(timeout=2.0) as client:
            while True:
                code = proc.poll()
                if code is not None:
                    tail = log_tail(box.log_path)
                    if _looks_like_bind_failure(tail):
                        raise _BindFailed(box_id)
                    raise FleetError(
                        f"{box_id}: llama-server exited with code {code} before becoming healthy "
                        f"(log {box.log_path}):\n{tail}"
                    )
                with contextlib.suppress(httpx.TransportError):
                    if client.get(f"{box.base_url}/health").status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise FleetError(
                        f"{box_id}: /health not 200 within {self.health_timeout:.0f} s "
                        f"(log {box.log_path}):\n{log_tail(box.log_path)}"
                    )
                time.sleep(0.1)

    def _stop_one(self, box_id: str) -> None:
        proc = self._procs.get(box_id)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class _BindFailed(Exception):
    """llama-server exited because its port was taken."""


def _looks_like_bind_failure(tail: str) -> bool:
    # llama-server logs "couldn't bind HTTP server socket, hostname: H, port: P" (tools/server/server.cpp).
    last_run = tail.rsplit("=== warmer testbed: starting", 1)[-1].lower()
    return "couldn't bind http server socket" in last_run


def pids_alive(pids: Sequence[int]) -> list[int]:
    """Which of these PIDs still exist (used by tests to check that stop() really stopped)."""
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            pass
        alive.append(pid)
    return alive


__all__ = ["FleetError", "LlamaBox", "LlamaFleet", "free_loopback_port", "log_tail", "pids_alive"]
