"""Daemons starting on one fresh SQLite file: a transient "database is locked" is retried, nothing else is."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from warmer.adapters.store import current_revision, head_revision, migrate, upgrade_database


def test_a_transient_sqlite_lock_is_retried_and_the_upgrade_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'warmer.db'}"
    real_upgrade = migrate.command.upgrade
    calls: list[str] = []

    def locked_once(config: object, revision: str) -> None:
        calls.append(revision)
        if len(calls) == 1:
            raise OperationalError("PRAGMA journal_mode = WAL", {}, Exception("database is locked"))
        real_upgrade(config, revision)  # type: ignore[arg-type]

    monkeypatch.setattr(migrate.command, "upgrade", locked_once)
    upgrade_database(url)
    assert calls == ["head", "head"]
    assert current_revision(url) == head_revision()


def test_other_database_errors_are_not_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'warmer.db'}"
    calls: list[str] = []

    def broken(config: object, revision: str) -> None:
        calls.append(revision)
        raise OperationalError("CREATE TABLE boxes", {}, Exception("disk I/O error"))

    monkeypatch.setattr(migrate.command, "upgrade", broken)
    with pytest.raises(OperationalError, match="disk I/O error"):
        upgrade_database(url)
    assert calls == ["head"]
