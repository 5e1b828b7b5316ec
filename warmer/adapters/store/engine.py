"""Engines for the store and its migrations: URL normalisation and the SQLite pragmas that make it a
safe embedded database (WAL, busy timeout, foreign keys, real transactions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection, make_url

SQLITE_FILE_NAME = "warmer.db"
# How long a SQLite writer waits for another writer before "database is locked" (milliseconds).
SQLITE_BUSY_TIMEOUT_MS = 10_000
# Connection execution option that marks a transaction as a writer (SQLite: BEGIN IMMEDIATE).
WRITE_OPTION = "warmer_write"


def sqlite_url_for(state_dir: Path) -> str:
    """The embedded database URL for a state directory (absolute, so the working directory never matters)."""
    return URL.create("sqlite", database=str((state_dir / SQLITE_FILE_NAME).resolve())).render_as_string()


def normalize_database_url(url: str) -> str:
    """Route bare PostgreSQL URLs to psycopg 3, the driver we ship (SQLAlchemy would pick psycopg2)."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def _ensure_sqlite_parent(url: URL) -> None:
    """A fresh machine has no state directory yet; SQLite will not create one."""
    database = url.database
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).parent.mkdir(parents=True, exist_ok=True)


def create_store_engine(url: str, *, foreign_keys: bool = True, **engine_kwargs: Any) -> Engine:
    """An engine with our per-backend settings.

    SQLite: WAL so readers never block the writer, a busy timeout so two writers queue instead of
    failing, foreign keys on (SQLite defaults them off), and SQLAlchemy-emitted BEGIN so DDL and reads
    are transactional; writers use BEGIN IMMEDIATE so a read-then-write never dies on a lock upgrade.
    Migrations pass `foreign_keys=False`: batch mode rebuilds tables, which with foreign keys on would
    cascade-delete child rows.
    """
    parsed = make_url(normalize_database_url(url))
    if parsed.get_backend_name() != "sqlite":
        return create_engine(parsed, pool_pre_ping=True, **engine_kwargs)

    _ensure_sqlite_parent(parsed)
    engine = create_engine(parsed, **engine_kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (see _on_begin)
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = NORMAL")  # durable across process crashes in WAL mode
            cursor.execute(f"PRAGMA foreign_keys = {'ON' if foreign_keys else 'OFF'}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        writer = bool(connection.get_execution_options().get(WRITE_OPTION))
        connection.exec_driver_sql("BEGIN IMMEDIATE" if writer else "BEGIN")

    return engine
