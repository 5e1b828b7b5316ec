"""The daemon's database, before anything serves: its lock (a SQLite file), its schema, the open store.

An embedded SQLite file is migrated by the daemon itself (nobody else will) and held under an exclusive
lock; a server database is shared by replicas and migrated deliberately (`warmer db upgrade`), so the
daemon only checks it is at head.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from warmer.adapters.store import SqlStore, current_revision, head_revision, upgrade_database
from warmer.adapters.store.engine import create_store_engine
from warmer.adapters.store.filelock import SqliteFileLock, sqlite_database_file
from warmer.config.settings import Settings
from warmer.core.errors import WarmerError
from warmer.ports import StorePort


class ManagedStore(StorePort, Protocol):
    """The store as the root holds it: the port, plus a health check and a close."""

    async def ping(self) -> None: ...

    async def close(self) -> None: ...


StoreFactory = Callable[[Settings], ManagedStore]
DatabasePreparer = Callable[[Settings], None]
# Takes this daemon's exclusive hold on its database, if it needs one (a SQLite file does); raises when
# another process holds it. Returns what to release at exit.
DatabaseLocker = Callable[[Settings], SqliteFileLock | None]


class DatabaseNotMigrated(WarmerError):
    """A server database whose schema is not at this version's head: `warmer db upgrade` first."""


def open_sql_store(settings: Settings) -> ManagedStore:
    """The SQL store for `settings.database` (embedded SQLite unless a URL is configured)."""
    url = settings.database_url()
    if settings.database.is_embedded:
        return SqlStore.from_url(url)
    engine = create_store_engine(
        url, pool_size=settings.database.pool_size, pool_timeout=settings.database.pool_timeout_seconds
    )
    return SqlStore(engine)


def upgrade_schema(settings: Settings) -> str:
    """Migrate the configured database to head; returns the head revision."""
    if settings.database.is_embedded:
        settings.database.state_dir.mkdir(parents=True, exist_ok=True)
    upgrade_database(settings.database_url())
    return head_revision()


def lock_sqlite_file(settings: Settings) -> SqliteFileLock | None:
    """Before anything touches a SQLite database file: hold its lock, or refuse to start (DatabaseInUse
    names the file). A server database is shared by replicas and needs none."""
    database = sqlite_database_file(settings.database_url())
    if database is None:
        return None
    lock = SqliteFileLock(database)
    lock.acquire()
    return lock


def prepare_database(settings: Settings) -> None:
    """Before serving: migrate the embedded SQLite file ourselves (nobody else will); a server database is
    shared by replicas and migrated deliberately, so only check it is at head."""
    if settings.database.is_embedded:
        upgrade_schema(settings)
        return
    current, head = current_revision(settings.database_url()), head_revision()
    if current != head:
        raise DatabaseNotMigrated(
            f"database schema is at {current or 'no revision'}, this warmer needs {head}: "
            "run `warmer db upgrade`"
        )
