"""deploy/probes/engine-readiness.sh, run as a kubelet would, against loopback servers that answer as an
engine and warmer do: ready only when the engine is healthy and warmer admits the box; warmer held (503)
keeps it out; warmer gone, or not knowing the box, leaves the engine's own health to decide."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from testbed.fleet import free_loopback_port

PROBE = Path(__file__).resolve().parents[2] / "deploy" / "probes" / "engine-readiness.sh"


class Answers(ThreadingHTTPServer):
    codes: dict[str, int]


class Handler(BaseHTTPRequestHandler):
    server: Answers

    def do_GET(self) -> None:
        code = self.server.codes.get(self.path, 404)
        self.send_response(code)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:
        return None


@pytest.fixture
def server() -> Iterator[Answers]:
    answers = Answers(("127.0.0.1", 0), Handler)
    answers.codes = {}
    thread = threading.Thread(target=answers.serve_forever, daemon=True)
    thread.start()
    yield answers
    answers.shutdown()
    answers.server_close()


def probe(engine: str, admit: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "ENGINE_HEALTH_URL": engine,
        "WARMER_ADMIT_URL": admit,
        "PROBE_TIMEOUT": "2",
    }
    return subprocess.run(["/bin/sh", str(PROBE)], env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize(
    ("engine_code", "admit_code", "ready"),
    [
        (200, 200, True),  # warm, or let in by the gate's bounds
        (200, 503, False),  # held while it warms
        (200, 404, True),  # warmer does not know the box: the engine decides
        (200, 500, True),  # warmer broken: fail open
        (503, 200, False),  # the engine itself is not up
    ],
)
def test_the_probe_follows_the_engine_and_warmers_gate(
    server: Answers, engine_code: int, admit_code: int, ready: bool
) -> None:
    server.codes = {"/health": engine_code, "/v1/boxes/llm-0/admit": admit_code}
    base = f"http://127.0.0.1:{server.server_address[1]}"
    result = probe(f"{base}/health", f"{base}/v1/boxes/llm-0/admit")
    assert (result.returncode == 0) is ready, result.stderr


def test_warmer_unreachable_keeps_a_healthy_engine_in_service(server: Answers) -> None:
    server.codes = {"/health": 200}
    engine = f"http://127.0.0.1:{server.server_address[1]}/health"
    nobody = f"http://127.0.0.1:{free_loopback_port()}/v1/boxes/llm-0/admit"  # warmer killed
    assert probe(engine, nobody).returncode == 0
    down = f"http://127.0.0.1:{free_loopback_port()}/health"
    assert probe(down, nobody).returncode == 1  # ...but never an engine that is down itself


def test_the_probe_names_what_it_needs() -> None:
    result = subprocess.run(
        ["/bin/sh", str(PROBE)], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "WARMER_ADMIT_URL" in result.stderr
