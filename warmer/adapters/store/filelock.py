"""One daemon per SQLite file: an OS lock on `<db>.lock`, held for the daemon's whole life.

Two `warmer serve` processes on one SQLite file would both warm every box (duplicate warm-ups, twice the
load) and race on the same rows, and SQLite offers no way for either to notice. PostgreSQL is how several
replicas share state; an embedded file belongs to one process.

`fcntl.flock` rather than the `filelock` package: it is the same system call `filelock` makes on Unix, the
standard library has it, and the kernel drops the lock when the process dies for any reason (SIGKILL
included), so a crashed daemon never leaves a stale lock to clean up. The lock file is never deleted:
unlinking a lock file races with the next process opening it. It holds the holder's pid, for the message.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from sqlalchemy.engine import make_url

from warmer.core.errors import WarmerError

LOCK_SUFFIX = ".lock"


class DatabaseInUse(WarmerError):
    """Another process holds the SQLite file's lock: this daemon must not start."""


def sqlite_database_file(url: str) -> Path | None:
    """The file a `sqlite:///...` URL names; None for a server database or an in-memory SQLite."""
    parsed = make_url(url)
    if not parsed.drivername.startswith("sqlite"):
        return None
    database = parsed.database or ""
    if not database or database == ":memory:" or database.startswith("file::memory:"):
        return None
    return Path(database).absolute()


class SqliteFileLock:
    """An exclusive, non-blocking lock on `<database>.lock`; `acquire()` raises DatabaseInUse if taken."""

    def __init__(self, database: Path) -> None:
        self.database = database
        self.path = database.with_name(database.name + LOCK_SUFFIX)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # close-on-exec: children never hold it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise DatabaseInUse(
                f"database file {self.database} is in use by another warmer serve{holder} "
                f"(lock {self.path}): one daemon per SQLite file; run several replicas on PostgreSQL "
                "(database.url)"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return ""
    return f" (pid {text})" if text.isdigit() else ""
