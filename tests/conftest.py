"""Shared fixtures: a store on a real SQLite file and on the real PostgreSQL (a schema of its own
per test: brand-new, or migrated and emptied after its last test, tests/pg_schemas.py)."""

from __future__ import annotations

import os

import pytest

PG_URL = os.environ.get("QLACTORS_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
IN_CI = os.environ.get("CI") == "true"


def _pg_admin_conninfo() -> str:
    return PG_URL.replace("postgresql+psycopg://", "postgresql://", 1)


def _require_postgres() -> None:
    """Skip without PostgreSQL on a developer's box; with CI=true a missing PostgreSQL fails."""
    import psycopg

    try:
        psycopg.connect(_pg_admin_conninfo(), connect_timeout=3).close()
    except psycopg.OperationalError as err:
        if IN_CI:
            pytest.fail(f"PostgreSQL is required in CI and is not reachable at {PG_URL}: {err}")
        pytest.skip(f"PostgreSQL not reachable at {PG_URL} (set CI=true to make this a failure)")


@pytest.fixture
def pg_schema_url():
    """A URL whose search_path is a brand-new schema, dropped after the test."""
    _require_postgres()
    from pg_schemas import create_schema, drop_schema, schema_url

    schema = create_schema(_pg_admin_conninfo())
    yield schema_url(PG_URL, schema)
    drop_schema(_pg_admin_conninfo(), schema)


@pytest.fixture(scope="session")
def pg_schema_pool():
    """Migrated schemas, emptied between the tests that use them (tests/pg_schemas.py)."""
    from pg_schemas import SchemaPool

    from qlactors.store.repository import Repository

    pool = SchemaPool(_pg_admin_conninfo(), PG_URL, lambda url: Repository.open(url).close())
    yield pool
    pool.close()


@pytest.fixture
def pg_migrated_url(pg_schema_pool):
    """A URL whose search_path is a schema at the newest version with nothing in its tables."""
    _require_postgres()
    url = pg_schema_pool.take()
    yield url
    pg_schema_pool.give_back(url)


DIALECTS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(scope="session")
def sqlite_migrated(tmp_path_factory) -> bytes:
    """The bytes of a SQLite file at the newest schema, made once: a copy of it is what migrating
    a new file makes (~1 ms to write instead of ~0.1 s of DDL and fsyncs)."""
    from qlactors.store.repository import Repository

    path = tmp_path_factory.mktemp("migrated") / "qlactors.db"
    Repository.open(f"sqlite:///{path}").close()
    assert sorted(p.name for p in path.parent.iterdir()) == ["qlactors.db"]  # WAL checkpointed
    return path.read_bytes()


@pytest.fixture(params=DIALECTS)
def store_url(request, tmp_path):
    """Each contract test runs once on a SQLite file and once on PostgreSQL, both already at the
    newest schema (opening one finds nothing to migrate; an empty one: `empty_store_url`)."""
    if request.param == "sqlite":
        path = tmp_path / "qlactors.db"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(request.getfixturevalue("sqlite_migrated"))
        return f"sqlite:///{path}"
    return request.getfixturevalue("pg_migrated_url")


@pytest.fixture(params=DIALECTS)
def empty_store_url(request, tmp_path):
    """A database with nothing in it yet, on each dialect: for the tests of migrating one."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'qlactors.db'}"
    return request.getfixturevalue("pg_schema_url")


@pytest.fixture
def repo(store_url):
    from qlactors.store.repository import Repository

    repository = Repository.open(store_url)
    yield repository
    repository.close()


def pytest_terminal_summary(terminalreporter):
    """Say how many PostgreSQL cases ran, so a CI log shows they were not skipped."""
    counts = {}
    for outcome in ("passed", "failed", "skipped", "error"):
        counts[outcome] = sum(1 for r in terminalreporter.stats.get(outcome, [])
                              if getattr(r, "when", "call") in ("call", "setup") and "postgres" in r.keywords)
    terminalreporter.write_line(
        "postgresql cases: " + ", ".join(f"{n} {k}" for k, n in counts.items()))


@pytest.fixture
def dispatch(repo):
    from qlactors.store.dispatch import Dispatch

    return Dispatch(repo.store)


@pytest.fixture
def home(tmp_path):
    """A fresh qlactors home for the end-to-end tests (tests/edge_harness.py); every runtime and
    launcher group it started is stopped afterwards, by pid."""
    from edge_harness import Home

    h = Home(tmp_path)
    try:
        yield h
    finally:
        h.close()
