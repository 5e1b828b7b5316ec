"""Programmatic Alembic: the installed daemon upgrades its own database, no alembic.ini needed."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text
from sqlalchemy.exc import OperationalError
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_random_exponential

from warmer.adapters.store.engine import WRITE_OPTION, create_store_engine
from warmer.shipped import shipped_dir

# Arbitrary constant: replicas starting together on one PostgreSQL take turns migrating.
_PG_MIGRATION_LOCK_KEY = 0x7761726D  # "warm"


def alembic_config() -> Config:
    """An Alembic config pointing at the shipped migrations (inside the wheel, or the checkout's root)."""
    config = Config()
    config.set_main_option("script_location", str(shipped_dir("migrations")))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError("the migrations directory has no revisions")
    return head


def _sqlite_locked(exc: BaseException) -> bool:
    """SQLite may answer "database is locked" at once, without waiting out the busy timeout, while another
    connection is turning a fresh file into WAL mode; the migration is one transaction, so it can retry."""
    return isinstance(exc, OperationalError) and "database is locked" in str(exc.orig)


@retry(
    retry=retry_if_exception(_sqlite_locked),
    stop=stop_after_attempt(8),
    wait=wait_random_exponential(multiplier=0.05, max=1.0),
    reraise=True,
)
def _run(url: str, revision: str, *, upgrade: bool) -> None:
    engine = create_store_engine(url, foreign_keys=False)
    try:
        # One transaction, taken as a writer up front: two daemons starting together on one database
        # migrate one after the other (SQLite: BEGIN IMMEDIATE; PostgreSQL: an advisory lock), and the
        # second finds the work done.
        with engine.execution_options(**{WRITE_OPTION: True}).begin() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK_KEY}
                )
            config = alembic_config()
            config.attributes["connection"] = connection
            if upgrade:
                command.upgrade(config, revision)
            else:
                command.downgrade(config, revision)
    finally:
        engine.dispose()


def upgrade_database(url: str, revision: str = "head") -> None:
    """Bring the database at `url` up to `revision` (default: the newest). Safe to call on every start."""
    _run(url, revision, upgrade=True)


def downgrade_database(url: str, revision: str) -> None:
    """Step the database at `url` back to `revision` ("base" drops every table we own)."""
    _run(url, revision, upgrade=False)


def current_revision(url: str) -> str | None:
    """The revision the database is at, or None when it was never migrated."""
    engine = create_store_engine(url, foreign_keys=False)
    try:
        with engine.connect() as connection:
            return _current_revision(connection)
    finally:
        engine.dispose()


def _current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()
