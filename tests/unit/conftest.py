"""Fixtures shared by the unit tests that run the real store (several test modules need the same one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from warmer.adapters.store import upgrade_database


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """A migrated SQLite file of this test's own: a real SqlStore without a server."""
    url = f"sqlite:///{tmp_path / 'warmer.db'}"
    upgrade_database(url)
    return url
