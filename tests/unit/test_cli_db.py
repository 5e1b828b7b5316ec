"""`warmer db upgrade`: migrates the configured (here embedded SQLite) database, repeatably."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from click.testing import CliRunner

from warmer.adapters.store import head_revision
from warmer.cli import main
from warmer.cli.exits import Exit


def test_db_upgrade_creates_and_migrates_the_embedded_database(tmp_path: Path) -> None:
    env = {"WARMER_DATABASE__STATE_DIR": str(tmp_path / "state"), "WARMER_DATABASE__URL": ""}
    for _ in range(2):  # running it again is a no-op, not an error
        result = CliRunner().invoke(main, ["db", "upgrade"], env=env)
        assert result.exit_code == 0, result.output
        assert f"database at revision {head_revision()}" in result.output
    with sqlite3.connect(tmp_path / "state" / "warmer.db") as connection:
        (version,) = connection.execute("SELECT version_num FROM alembic_version").fetchone()
    assert version == head_revision()


def test_db_upgrade_failure_never_echoes_the_url(tmp_path: Path) -> None:
    env = {"WARMER_DATABASE__URL": "postgresql+psycopg://warmer:secret-pw-31@127.0.0.1:1/none"}
    result = CliRunner().invoke(main, ["db", "upgrade"], env=env)
    assert result.exit_code == Exit.UNAVAILABLE == 4
    assert "database upgrade failed" in result.output
    assert "secret-pw-31" not in result.output
