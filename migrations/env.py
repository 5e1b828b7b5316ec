"""Alembic environment for the warm-state store.

Runs programmatically (`warmer.adapters.store.migrate`) with a connection handed over in
`config.attributes["connection"]`, or from the repository's alembic.ini for developers, with the URL
from `-x url=...`, the WARMER_DATABASE_URL environment variable, or `sqlalchemy.url`.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection

from warmer.adapters.store.engine import create_store_engine
from warmer.adapters.store.tables import metadata

config = context.config
if config.config_file_name is not None and "connection" not in config.attributes:
    fileConfig(config.config_file_name, disable_existing_loggers=False)  # the developer CLI only


def _configure_and_run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite cannot ALTER most things
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _url_from_config() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or os.environ.get("WARMER_DATABASE_URL")
    url = url or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL: pass -x url=..., set WARMER_DATABASE_URL or sqlalchemy.url")
    return url


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure_and_run(connection)
        return
    engine = create_store_engine(_url_from_config(), foreign_keys=False)
    try:
        with engine.connect() as connection:
            _configure_and_run(connection)
            connection.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    context.configure(url=_url_from_config(), target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
