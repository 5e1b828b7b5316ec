"""A private PostgreSQL server for one test, from the installed binaries: initdb in a temporary directory,
its own loopback port, trust auth. A test may stop it, kill it and start it again at will; the shared
cluster on 5432 that other tests and helpers use never notices.

PostgreSQL refuses to run as root, so as root the server runs as the `postgres` system user (`runuser`).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from testbed.fleet import free_loopback_port

PG_BIN_CANDIDATES = ("/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin", "/usr/local/bin", "/usr/bin")
SERVER_USER = "postgres"


def pg_bin(name: str) -> str:
    for directory in PG_BIN_CANDIDATES:
        candidate = Path(directory) / name
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    assert found is not None, f"PostgreSQL's {name} is installed (looked in {PG_BIN_CANDIDATES} and PATH)"
    return found


class PrivatePostgres:
    """`start()`, `stop()` (fast shutdown), `crash()` (immediate shutdown), `url`."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="warmer-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_loopback_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        self._as_root = os.geteuid() == 0
        if self._as_root:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self._run(
            pg_bin("initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )

    def _run(self, *command: str) -> None:
        prefix = ["runuser", "-u", SERVER_USER, "--"] if self._as_root else []
        result = subprocess.run([*prefix, *command], capture_output=True, text=True, timeout=120, check=False)
        assert result.returncode == 0, (
            f"{command[0]} failed:\n{result.stdout}\n{result.stderr}\n{self.log_tail()}"
        )

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return "(no server log)"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")

    def stop(self) -> None:
        self._run(pg_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def crash(self) -> None:
        """Immediate shutdown: no checkpoint, every connection cut, recovery from the WAL on the next start
        (as after a crash; a SIGKILLed postmaster would linger as a zombie where nothing reaps it)."""
        self._run(pg_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def running(self) -> bool:
        pid_file = self.data / "postmaster.pid"
        if not pid_file.exists():
            return False
        try:
            os.kill(int(pid_file.read_text().splitlines()[0]), 0)
        except (ProcessLookupError, ValueError):
            return False
        return True

    def cleanup(self) -> None:
        if self.running():
            self.crash()
        shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()
