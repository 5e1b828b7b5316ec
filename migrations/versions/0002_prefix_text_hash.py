"""Prefix versions remember the prefix TEXT's hash, so tokenizer drift can be looked up.

`prefix_versions.prefix_hash` is over the token ids when they are known, and those change exactly when
the tokenizer does; the text hash stays put, so (model, text_hash) finds the same prompt's token counts
under every engine version. Rows written before this revision keep NULL (their text is not stored).

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Batch mode: SQLite cannot alter a table in place beyond ADD COLUMN; PostgreSQL runs plain ALTERs.
    with op.batch_alter_table("prefix_versions") as batch:
        batch.add_column(sa.Column("text_hash", sa.String(length=64), nullable=True))
        batch.create_index("ix_prefix_versions_model_text_hash", ["model", "text_hash"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("prefix_versions") as batch:
        batch.drop_index("ix_prefix_versions_model_text_hash")
        batch.drop_column("text_hash")
