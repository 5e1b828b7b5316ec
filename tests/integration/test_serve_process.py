"""The real `warmer serve` process: API up on the embedded database, clean exit 0 on SIGTERM, and a
non-zero exit with a message on a fatal configuration."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from testbed.fleet import free_loopback_port
from tests.integration.daemon_harness import REPO, Serve, clean_env, running_serve, warmer_script

pytestmark = pytest.mark.integration

EXAMPLE = REPO / "config" / "example.toml"
GRACE_SECONDS = 5
# Generous bounds for a loaded 2-core CI machine; these are timeouts, not performance assertions.
START_TIMEOUT_SECONDS = 120
STOP_TIMEOUT_SECONDS = GRACE_SECONDS + 30


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    port = free_loopback_port()
    env = clean_env(
        WARMER_API__PORT=str(port),
        WARMER_DATABASE__STATE_DIR=str(tmp_path / "state"),
        WARMER_RECONCILE__SHUTDOWN_GRACE_SECONDS=str(GRACE_SECONDS),
        WARMER_LOGGING__FORMAT="json",
    )
    with running_serve(EXAMPLE, port, tmp_path / "serve.log", env=env) as started:
        yield started


def wait_for_health(serve: Serve) -> None:
    serve.wait(
        "serve to answer /healthz",
        lambda: httpx.get(f"{serve.base_url}/healthz", timeout=2).status_code == 200,
        START_TIMEOUT_SECONDS,
    )


def test_serve_answers_and_stops_cleanly_on_sigterm(serve: Serve, tmp_path: Path) -> None:
    base_url = serve.base_url
    wait_for_health(serve)

    assert httpx.get(f"{base_url}/healthz", timeout=5).json() == {"status": "ok"}
    ready = httpx.get(f"{base_url}/readyz", timeout=5)
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
    metrics = httpx.get(f"{base_url}/metrics", timeout=5)
    assert metrics.status_code == 200
    assert "warmer_up 1.0" in metrics.text
    assert 'warmer_build_info{version="' in metrics.text
    # serve migrated the embedded SQLite file by itself.
    assert (tmp_path / "state" / "warmer.db").is_file()

    serve.stop(STOP_TIMEOUT_SECONDS)
    log = serve.log.read_text()
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


def test_a_second_serve_on_the_same_sqlite_file_refuses_to_start(serve: Serve, tmp_path: Path) -> None:
    wait_for_health(serve)
    database = tmp_path / "state" / "warmer.db"
    second_port = free_loopback_port()
    env = clean_env(
        WARMER_API__PORT=str(second_port),
        WARMER_DATABASE__STATE_DIR=str(tmp_path / "state"),
        WARMER_LOGGING__FORMAT="json",
    )
    done = subprocess.run(
        [warmer_script(), "--config", str(EXAMPLE), "serve"],
        capture_output=True,
        text=True,
        env=env,
        timeout=START_TIMEOUT_SECONDS,
    )
    assert done.returncode != 0, done.stderr
    assert f"database file {database.absolute()} is in use by another warmer serve" in done.stderr
    assert f"(pid {serve.process.pid})" in done.stderr
    # the first daemon never noticed, and once it is gone the file is free for the next one
    assert httpx.get(f"{serve.base_url}/readyz", timeout=5).status_code == 200
    serve.stop(STOP_TIMEOUT_SECONDS)
    with running_serve(EXAMPLE, second_port, tmp_path / "serve-2.log", env=env) as successor:
        wait_for_health(successor)
        successor.stop(STOP_TIMEOUT_SECONDS)


def test_a_real_serve_answers_hostile_bodies_with_400_and_413_and_keeps_serving(serve: Serve) -> None:
    """Over a real socket: the connection is answered, not dropped, and the daemon stays up."""
    wait_for_health(serve)
    deep = b"[" * 2000 + b"]" * 2000
    headers = {"content-type": "application/json"}
    with httpx.Client(base_url=serve.base_url, timeout=30) as client:
        for method, path in (("POST", "/v1/prewarm"), ("PUT", "/v1/campaigns/deep"), ("POST", "/v1/usage")):
            response = client.request(method, path, content=deep, headers=headers)
            assert response.status_code == 400, response.text
            assert response.json()["detail"] == "JSON nested deeper than 64 levels"
        huge = client.post("/v1/prewarm", content=b'{"agent": "' + b"a" * 100_000 + b'"}', headers=headers)
        assert huge.status_code == 413, huge.text
        listed = client.get("/v1/campaigns")
        assert (listed.status_code, listed.json()) == (200, {"campaigns": []})
        assert client.get("/healthz").status_code == 200
    serve.stop(STOP_TIMEOUT_SECONDS)
