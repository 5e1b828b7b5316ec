"""The real `warmer serve` process: API up on the embedded database, clean exit 0 on SIGTERM, and a
non-zero exit with a message on a fatal configuration."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "config" / "example.toml"
GRACE_SECONDS = 5
# Generous bounds for a loaded 2-core CI machine; these are timeouts, not performance assertions.
START_TIMEOUT_SECONDS = 120
STOP_TIMEOUT_SECONDS = GRACE_SECONDS + 30


def warmer_script() -> str:
    script = shutil.which("warmer", path=str(Path(sys.executable).parent))
    assert script is not None, "the `warmer` console script is installed next to the interpreter"
    return script


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(**overrides: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("WARMER_")}
    env.update(overrides)
    return env


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    port = free_port()
    state_dir = tmp_path / "state"
    log_path = tmp_path / "serve.log"
    env = clean_env(
        WARMER_API__PORT=str(port),
        WARMER_DATABASE__STATE_DIR=str(state_dir),
        WARMER_RECONCILE__SHUTDOWN_GRACE_SECONDS=str(GRACE_SECONDS),
        WARMER_LOGGING__FORMAT="json",
    )
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [warmer_script(), "--config", str(EXAMPLE), "serve"],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
    try:
        yield process, f"http://127.0.0.1:{port}", log_path
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def wait_for_health(process: subprocess.Popen[str], base_url: str, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        assert process.poll() is None, f"serve exited with {process.returncode}:\n{log_path.read_text()}"
        try:
            if httpx.get(f"{base_url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"serve did not answer /healthz:\n{log_path.read_text()}")


def test_serve_answers_and_stops_cleanly_on_sigterm(
    serve: tuple[subprocess.Popen[str], str, Path], tmp_path: Path
) -> None:
    process, base_url, log_path = serve
    wait_for_health(process, base_url, log_path)

    assert httpx.get(f"{base_url}/healthz", timeout=5).json() == {"status": "ok"}
    ready = httpx.get(f"{base_url}/readyz", timeout=5)
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
    metrics = httpx.get(f"{base_url}/metrics", timeout=5)
    assert metrics.status_code == 200
    assert "warmer_up 1.0" in metrics.text
    assert 'warmer_build_info{version="' in metrics.text
    # serve migrated the embedded SQLite file by itself.
    assert (tmp_path / "state" / "warmer.db").is_file()

    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=STOP_TIMEOUT_SECONDS) == 0, log_path.read_text()
    log = log_path.read_text()
    assert '"event": "stopping"' in log
    assert "SIGTERM" in log
    assert '"event": "warmer stopped"' in log


def test_serve_with_a_fatal_config_exits_nonzero_with_the_reason(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[api]\nport = "eighty"\n')
    done = subprocess.run(
        [warmer_script(), "--config", str(bad), "serve"],
        capture_output=True,
        text=True,
        env=clean_env(WARMER_DATABASE__STATE_DIR=str(tmp_path / "state")),
        timeout=120,
    )
    assert done.returncode != 0
    assert "api.port: " in done.stderr


def test_serve_exits_nonzero_when_its_port_is_taken(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [warmer_script(), "--config", str(EXAMPLE), "serve"],
            capture_output=True,
            text=True,
            env=clean_env(
                WARMER_API__PORT=str(port),
                WARMER_DATABASE__STATE_DIR=str(tmp_path / "state"),
                WARMER_LOGGING__FORMAT="json",
            ),
            timeout=120,
        )
    assert done.returncode != 0
    assert "root task failed" in done.stderr or "root task ended" in done.stderr, done.stderr
