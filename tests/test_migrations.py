"""Migrating an empty database yields exactly the schema of `qlactors.store.schema`, on both dialects."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import CheckConstraint, inspect, text

from qlactors.errors import SchemaError
from qlactors.store.engine import Store
from qlactors.store.migrations import available, current_version, latest_version, migrate
from qlactors.store.schema import metadata


@pytest.fixture
def store(store_url):
    s = Store(store_url)
    yield s
    s.close()


def test_migrated_database_equals_metadata(store):
    assert migrate(store) == latest_version(store.dialect_name)
    with store.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, metadata)
    assert diff == []


def test_migrated_database_has_every_check_constraint(store):
    migrate(store)
    with store.engine.connect() as conn:
        insp = inspect(conn)
        for table in metadata.sorted_tables:
            expected = {c.name for c in table.constraints if isinstance(c, CheckConstraint)}
            found = {c["name"] for c in insp.get_check_constraints(table.name)}
            assert expected <= found, (table.name, expected - found)


def test_partial_unique_indexes_exist(store):
    migrate(store)
    with store.engine.connect() as conn:
        insp = inspect(conn)
        unique = {ix["name"] for ix in insp.get_indexes("run_attempts") if ix["unique"]}
        assert "ix_run_attempts_one_active" in unique
        unique = {ix["name"] for ix in insp.get_indexes("tasks") if ix["unique"]}
        assert "ix_tasks_live_name" in unique


def test_migrate_twice_is_a_no_op(store):
    first = migrate(store)
    assert migrate(store) == first
    assert current_version(store) == first


def test_newer_schema_is_refused_and_left_alone(store):
    migrate(store)
    with store.write() as conn:
        conn.execute(text("UPDATE qlactors_schema SET version = 999"))
    with pytest.raises(SchemaError, match="newer"):
        migrate(store)
    assert current_version(store) == 999


def test_foreign_database_is_refused(store):
    with store.write() as conn:
        conn.execute(text("CREATE TABLE someone_elses (x INTEGER)"))
    with pytest.raises(SchemaError, match="not a qlactors database"):
        migrate(store)


def test_migration_files_are_numbered_for_both_dialects():
    assert [m.version for m in available("sqlite")] == [m.version for m in available("postgresql")]
    assert latest_version("sqlite") >= 1
