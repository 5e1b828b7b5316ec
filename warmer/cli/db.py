"""`warmer db ...`: database maintenance."""

from __future__ import annotations

import click

from warmer.cli.exits import Exit, fail
from warmer.cli.group import CliState, pass_state


@click.group("db")
def db() -> None:
    """The warm-state database (embedded SQLite by default, PostgreSQL by database.url)."""


@db.command("upgrade")
@pass_state
def upgrade(state: CliState) -> None:
    """Migrate the configured database to the newest schema (safe to repeat).

    `serve` does this by itself for the embedded SQLite file; a shared PostgreSQL is migrated with this
    command before rolling out a new version.
    """
    from warmer.root.database import upgrade_schema  # heavy (SQLAlchemy, Alembic): only when needed

    settings = state.load_settings()
    try:
        revision = upgrade_schema(settings)
    except Exception as exc:
        # The URL may carry a password: name the failure, never echo the URL.
        fail(Exit.UNAVAILABLE, f"Error: database upgrade failed: {type(exc).__name__}: {exc}")
    where = f"embedded sqlite in {settings.database.state_dir}" if settings.database.is_embedded else "server"
    click.echo(f"database at revision {revision} ({where})")
