"""Every migration upgrades and downgrades on SQLite and PostgreSQL, and the head schema equals the models."""

from __future__ import annotations

import threading

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from warmer.adapters.store import current_revision, downgrade_database, head_revision, upgrade_database
from warmer.adapters.store.migrate import alembic_config
from warmer.adapters.store.tables import metadata

pytestmark = pytest.mark.integration

OUR_TABLES = set(metadata.tables)


def revisions_base_to_head() -> list[tuple[str, str]]:
    """(revision, what downgrading it leads to), oldest first."""
    script = ScriptDirectory.from_config(alembic_config())
    steps = []
    for revision in reversed(list(script.walk_revisions())):
        down = revision.down_revision
        assert down is None or isinstance(down, str), "no merge revisions expected"
        steps.append((revision.revision, down or "base"))
    return steps


def tables_in(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def schema_differences(url: str) -> list[object]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def test_the_migrations_form_one_line_ending_at_head() -> None:
    steps = revisions_base_to_head()
    assert steps[0][1] == "base"
    assert steps[-1][0] == head_revision()


def test_every_migration_upgrades_and_downgrades(database_url: str) -> None:
    steps = revisions_base_to_head()
    assert current_revision(database_url) is None

    upgrade_database(database_url)
    assert current_revision(database_url) == head_revision()
    assert tables_in(database_url) == OUR_TABLES

    for revision, down in reversed(steps):  # one step at a time down to base
        assert current_revision(database_url) == revision
        downgrade_database(database_url, down)
        assert current_revision(database_url) == (None if down == "base" else down)
    assert tables_in(database_url) == set()

    for revision, _down in steps:  # and back up, one step at a time
        upgrade_database(database_url, revision)
        assert current_revision(database_url) == revision
    assert tables_in(database_url) == OUR_TABLES
    assert schema_differences(database_url) == []


def test_models_and_migrations_agree(database_url: str) -> None:
    upgrade_database(database_url)
    assert schema_differences(database_url) == []


def test_upgrading_an_up_to_date_database_changes_nothing(database_url: str) -> None:
    """`warmer serve` upgrades on every start."""
    upgrade_database(database_url)
    upgrade_database(database_url)
    assert current_revision(database_url) == head_revision()
    assert schema_differences(database_url) == []


def test_two_daemons_upgrading_at_once_both_succeed(database_url: str) -> None:
    errors: list[BaseException] = []

    def upgrade() -> None:
        try:
            upgrade_database(database_url)
        except BaseException as exc:  # reported below, with the thread's traceback
            errors.append(exc)

    threads = [threading.Thread(target=upgrade) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert current_revision(database_url) == head_revision()
    assert tables_in(database_url) == OUR_TABLES


def test_the_agreement_check_notices_drift(database_url: str) -> None:
    """The comparison above has teeth: a schema that lost an index or changed a type is reported."""
    upgrade_database(database_url)
    engine = create_engine(database_url)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("DROP INDEX ix_campaigns_agent_id")
            connection.exec_driver_sql("ALTER TABLE webhook_events ADD COLUMN surprise INTEGER")
    finally:
        engine.dispose()
    differences = [str(diff) for diff in schema_differences(database_url)]
    assert any("ix_campaigns_agent_id" in diff for diff in differences)
    assert any("surprise" in diff for diff in differences)
