"""A read-only look at the prefix token history, for one-off tools (`warmer lint`) rather than the daemon.

Never creates or migrates anything: a SQLite file that does not exist, a server that does not answer within
the timeout, or a database without the history all mean "no history" (StoreUnavailable), and the caller
carries on without it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sqlalchemy import Select, create_engine, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from warmer.adapters.store.engine import normalize_database_url
from warmer.adapters.store.tables import PrefixVersionRow
from warmer.core.errors import StoreUnavailable
from warmer.core.tokenizer_drift import TokenCountObservation

HistoryKey = tuple[str, str]  # (model, prefix text hash)


def token_history_query(model: str, text_hash: str) -> Select[str, int, float]:
    """(engine version, token count, recorded at) of one prefix text for one model, oldest first."""
    return (
        select(PrefixVersionRow.engine_version, PrefixVersionRow.prefix_tokens, PrefixVersionRow.created_at)
        .where(PrefixVersionRow.model == model, PrefixVersionRow.text_hash == text_hash)
        .order_by(PrefixVersionRow.created_at, PrefixVersionRow.id)
    )


def observations(model: str, text_hash: str, rows: Iterable[Any]) -> list[TokenCountObservation]:
    return [TokenCountObservation(text_hash, model, version, tokens, at) for version, tokens, at in rows]


def read_prefix_token_history(
    url: str, keys: Iterable[HistoryKey], *, connect_timeout_seconds: float = 3.0
) -> dict[HistoryKey, list[TokenCountObservation]]:
    """Recorded token counts per (model, text hash), oldest first. Raises StoreUnavailable (never a
    SQLAlchemy error) when the database is missing, unreachable or has no prefix history table."""
    parsed = make_url(normalize_database_url(url))
    connect_args: dict[str, object]
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:") or not Path(database).is_file():
            raise StoreUnavailable("no database file yet (the daemon has not recorded any prefix)")
        connect_args = {"timeout": connect_timeout_seconds}
    else:
        connect_args = {"connect_timeout": max(1, round(connect_timeout_seconds))}  # libpq: whole seconds
    engine = create_engine(parsed, connect_args=connect_args)
    history: dict[HistoryKey, list[TokenCountObservation]] = {}
    try:
        with engine.connect() as connection:
            for model, text_hash in dict.fromkeys(keys):
                rows = connection.execute(token_history_query(model, text_hash))
                history[(model, text_hash)] = observations(model, text_hash, rows)
    except SQLAlchemyError as exc:
        reason = getattr(exc, "orig", None) or exc  # the driver's message, without the SQL statement
        raise StoreUnavailable(f"cannot read the prefix history: {reason}") from exc
    finally:
        engine.dispose()
    return history
