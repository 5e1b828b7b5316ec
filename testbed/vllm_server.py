"""Run a real vLLM OpenAI-compatible server (CPU build) on the tiny generated model, for integration tests.

Start-up is slow (~30 s with `--enforce-eager` on an idle 2-core box, 70-140 s when it is busy), so
tests share one server per session. The port is chosen once and kept across `restart()`, so a restarted
server is the same box to the daemon, only with a new process (new epoch) and an empty cache.

Flags and environment, checked against vLLM 0.32.0 (`vllm/engine/arg_utils.py`,
`vllm/entrypoints/launchers/cli_args.py`, `vllm/envs.py`) and
https://docs.vllm.ai/en/latest/configuration/engine_args/ :
- `--enable-prefix-caching` keeps finished prompts' KV blocks for reuse;
- `--enable-prompt-tokens-details` adds `usage.prompt_tokens_details.cached_tokens` to responses;
- `--enforce-eager` skips torch.compile / graph capture (start-up ~31 s instead of 40-75 s);
- `VLLM_CPU_KVCACHE_SPACE` is the CPU KV cache size in GiB; `VLLM_CACHE_ROOT` holds compile caches.
The module is started as `python -m vllm.entrypoints.openai.api_server`: the `vllm` script does not work
because the distribution is named `vllm-cpu`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx

from testbed.vllm_install import ensure_vllm

SERVED_MODEL_NAME = "tiny"
# vLLM's CPU platform forces this KV block size unless one is given (vllm/platforms/cpu.py):
# `cached_tokens` is always a whole number of these blocks.
CPU_BLOCK_SIZE = 128


class VllmServerError(RuntimeError):
    """The server did not come up (or died); the message carries the tail of its log."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def kv_events_args(pub_port: int, replay_port: int) -> tuple[str, ...]:
    """`--kv-events-config` publishing vLLM's KV cache events over ZeroMQ on two ports of the machine."""
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{pub_port}",
        "replay_endpoint": f"tcp://*:{replay_port}",
    }
    return ("--kv-events-config", json.dumps(config))


@dataclass
class VllmServer:
    """One `vllm.entrypoints.openai.api_server` process serving `model_dir` as `served_model_name`."""

    model_dir: Path
    workdir: Path | None = None
    port: int = field(default_factory=free_port)
    host: str = "127.0.0.1"
    served_model_name: str = SERVED_MODEL_NAME
    max_model_len: int = 2048
    kv_cache_gib: int = 1
    enforce_eager: bool = True
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()  # e.g. (("PYTHONHASHSEED", "0"),)
    startup_timeout_s: float = 300.0
    python: Path | None = None
    startup_seconds: list[float] = field(default_factory=list)  # one entry per (re)start, for reports
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _own_workdir: bool = field(default=False, init=False, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    @property
    def log_path(self) -> Path:
        return self._workdir() / "vllm-server.log"

    def _workdir(self) -> Path:
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="warmer-vllm-"))
            self._own_workdir = True
        return self.workdir

    def command(self) -> list[str]:
        python = self.python or ensure_vllm()
        args = [
            str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--served-model-name", self.served_model_name,
            "--max-model-len", str(self.max_model_len),
            "--enable-prompt-tokens-details",
            "--enable-prefix-caching",
            "--host", self.host,
            "--port", str(self.port),
        ]  # fmt: skip
        if self.enforce_eager:
            args.append("--enforce-eager")
        return [*args, *self.extra_args]

    def environment(self) -> dict[str, str]:
        work = self._workdir()
        (work / "tmp").mkdir(parents=True, exist_ok=True)
        return {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
            "VLLM_CACHE_ROOT": str(work / "vllm-cache"),
            "TMPDIR": str(work / "tmp"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",  # no phone-home from test machines
            "DO_NOT_TRACK": "1",
            **dict(self.extra_env),
        }

    def start(self) -> VllmServer:
        """Start the process and block until `/health` answers 200; raise with the log tail if it dies."""
        if self.pid is not None:
            return self
        command, env = self.command(), self.environment()
        began = time.monotonic()
        with self.log_path.open("ab") as log:
            log.write(f"\n=== starting: {' '.join(command)}\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self._workdir(),
                start_new_session=True,  # its own process group: stop() also ends the engine-core child
            )
        self._wait_healthy(began)
        self.startup_seconds.append(time.monotonic() - began)
        return self

    def _wait_healthy(self, began: float) -> None:
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() - began < self.startup_timeout_s:
                process = self._process
                if process is None or process.poll() is not None:
                    code = None if process is None else process.returncode
                    raise VllmServerError(f"vLLM exited during start-up (code {code}):\n{self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        return
                time.sleep(0.5)
        self.stop()
        raise VllmServerError(f"vLLM not healthy after {self.startup_timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the whole process group, SIGKILL it if it lingers."""
        process, self._process = self._process, None
        if process is None:
            return
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            try:
                process.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        # Children (the engine core) may outlive the leader by a moment; make sure the group is gone.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)

    def restart(self) -> VllmServer:
        """A new process on the same port: new epoch, empty prefix cache."""
        self.stop()
        return self.start()

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def close(self) -> None:
        self.stop()
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


if __name__ == "__main__":
    from testbed.tiny_hf_model import ensure_tiny_hf_model

    with VllmServer(ensure_tiny_hf_model()) as server:
        print(f"vLLM up at {server.base_url} (pid {server.pid}) in {server.startup_seconds[-1]:.1f} s")
        print(f"log: {server.log_path}; Ctrl-C to stop")
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
