"""Fixtures shared by the unit tests that run the real store or read settings (several modules need them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from warmer.adapters.store import upgrade_database


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """A migrated SQLite file of this test's own: a real SqlStore without a server."""
    url = f"sqlite:///{tmp_path / 'warmer.db'}"
    upgrade_database(url)
    return url


@pytest.fixture
def no_warmer_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings from the test's own files only: no WARMER_* variable leaks in from the shell."""
    for name in list(os.environ):
        if name.startswith("WARMER_"):
            monkeypatch.delenv(name)
