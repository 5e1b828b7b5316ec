"""A local fleet of real vLLM CPU servers ("vllm-0", "vllm-1", ...) for the fleet bench's vLLM shape.

Each box is one `VllmServer` (testbed/vllm_server.py: the OpenAI server and its engine-core child, with
`--enable-prefix-caching` and `--enable-prompt-tokens-details`) on the tiny HF model, with a KV pool
pinned small by `--num-gpu-blocks-override` so it binds, and one compute thread: several of these share
a 2-core machine. Threads (vLLM 0.32.0 `vllm/utils/ompmultiprocessing.py`, `_parse_omp_threads_bind_env`
/ `configure_omp_envs`): the default `VLLM_CPU_OMP_THREADS_BIND=auto` binds the engine to every core of
the NUMA node and sets `OMP_NUM_THREADS` to their count; `nobind` skips that, so `OMP_NUM_THREADS=1`
holds for the engine core and the API server alike.

The interface is `testbed.fleet.LlamaFleet`'s (`start`, `stop`, `restart(box_id)`, `boxes`, `box`):
a restart keeps the port, so the same box comes back with an empty cache, a new epoch.
"""

from __future__ import annotations

import atexit
import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from testbed.fleet import FleetError
from testbed.vllm_server import VllmServer

ONE_THREAD_ENV: tuple[tuple[str, str], ...] = (
    ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
    ("OMP_NUM_THREADS", "1"),
    ("MKL_NUM_THREADS", "1"),
)


@dataclass(frozen=True)
class VllmBox:
    """One running vLLM server; `pid` changes when the box is restarted, `port` never does."""

    id: str
    port: int
    base_url: str
    pid: int | None
    log_path: Path


class VllmFleet:
    """N vLLM CPU servers with `gpu_blocks` KV blocks of `block_size` tokens each, stopped together."""

    def __init__(
        self,
        n: int,
        *,
        model_dir: Path,
        log_dir: Path,
        gpu_blocks: int,
        block_size: int,
        max_model_len: int,
        startup_timeout_s: float = 400.0,
    ) -> None:
        if n < 1:
            raise ValueError(f"n (number of boxes) must be >= 1, got {n}")
        if gpu_blocks * block_size < max_model_len:
            raise ValueError(
                f"a pool of {gpu_blocks} x {block_size} tokens cannot hold one {max_model_len}-token request"
            )
        self.n = n
        self.log_dir = log_dir
        self._servers = {
            f"vllm-{index}": VllmServer(
                model_dir,
                workdir=log_dir / f"vllm-{index}",
                max_model_len=max_model_len,
                extra_args=(
                    "--num-gpu-blocks-override",
                    str(gpu_blocks),
                    "--block-size",
                    str(block_size),
                ),
                extra_env=ONE_THREAD_ENV,
                startup_timeout_s=startup_timeout_s,
            )
            for index in range(n)
        }

    def start(self) -> list[VllmBox]:
        """Start every box at once (their start-ups overlap) and wait until each answers /health."""
        atexit.register(self.stop)  # never leave orphans behind if the caller forgets
        try:
            with ThreadPoolExecutor(max_workers=self.n) as pool:
                for started in [pool.submit(s.start) for s in self._servers.values()]:
                    started.result()
        except BaseException:
            self.stop()
            raise
        return self.boxes

    def stop(self) -> None:
        for server in self._servers.values():
            with contextlib.suppress(OSError):
                server.stop()
        atexit.unregister(self.stop)

    def restart(self, box_id: str) -> VllmBox:
        """A new process on the same port: an empty prefix cache, a new epoch."""
        self._server(box_id).restart()
        return self.box(box_id)

    @property
    def boxes(self) -> list[VllmBox]:
        return [self.box(box_id) for box_id in self._servers]

    def box(self, box_id: str) -> VllmBox:
        server = self._server(box_id)
        return VllmBox(box_id, server.port, server.base_url, server.pid, server.log_path)

    def startup_seconds(self) -> dict[str, list[float]]:
        return {box_id: list(s.startup_seconds) for box_id, s in self._servers.items()}

    def _server(self, box_id: str) -> VllmServer:
        try:
            return self._servers[box_id]
        except KeyError:
            raise FleetError(f"unknown box id {box_id!r} (known: {', '.join(self._servers)})") from None

    def __enter__(self) -> VllmFleet:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


__all__ = ["ONE_THREAD_ENV", "VllmBox", "VllmFleet"]
