"""The warm-state store: SQLAlchemy tables, their Alembic migrations, and `SqlStore` (the StorePort)."""

from warmer.adapters.store.engine import normalize_database_url, sqlite_url_for
from warmer.adapters.store.history import read_prefix_token_history
from warmer.adapters.store.migrate import (
    current_revision,
    downgrade_database,
    head_revision,
    upgrade_database,
)
from warmer.adapters.store.store import SqlStore

__all__ = [
    "SqlStore",
    "current_revision",
    "downgrade_database",
    "head_revision",
    "normalize_database_url",
    "read_prefix_token_history",
    "sqlite_url_for",
    "upgrade_database",
]
