"""Shared fixtures: a store on a real SQLite file and on the real PostgreSQL (a fresh schema per test)."""

from __future__ import annotations

import os
import uuid

import pytest

from requires import unavailable

PG_URL = os.environ.get("QLACTORS_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def _pg_admin_conninfo() -> str:
    return PG_URL.replace("postgresql+psycopg://", "postgresql://", 1)


def _require_postgres() -> None:
    """Skip without PostgreSQL on a developer's box; with CI=true a missing PostgreSQL fails."""
    import psycopg

    try:
        psycopg.connect(_pg_admin_conninfo(), connect_timeout=3).close()
    except psycopg.OperationalError as err:
        unavailable("PostgreSQL", f"not reachable at {PG_URL}: {err}")


@pytest.fixture
def pg_schema_url():
    """A URL whose search_path is a brand-new schema, dropped after the test."""
    _require_postgres()
    import psycopg

    schema = f"qlt_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(_pg_admin_conninfo(), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PG_URL else "?"
    yield f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
    with psycopg.connect(_pg_admin_conninfo(), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request, tmp_path):
    """Each contract test runs once on a SQLite file and once on PostgreSQL."""
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


@pytest.fixture(scope="session")
def private_pg():
    """A private PostgreSQL server for this test run (tests/harness/pg_private.py), for tests that restart,
    kill or freeze the database; stopped by its PID and removed at the end, whatever failed."""
    from pg_private import PrivatePostgres, available

    why_not = available()
    if why_not is not None:
        unavailable("a private PostgreSQL", why_not)
    server = PrivatePostgres()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def dispatch(repo):
    from qlactors.store.dispatch.dispatch import Dispatch

    return Dispatch.open(repo.store)


@pytest.fixture
def home(tmp_path):
    """A fresh qlactors home for the end-to-end tests (tests/harness/edge_harness.py); every runtime and
    launcher group it started is stopped afterwards, by pid."""
    from edge_harness import Home

    h = Home(tmp_path)
    try:
        yield h
    finally:
        h.close()


@pytest.fixture(params=["edge_file", "worker_file"])
def journal(request, tmp_path):
    """The executor's journal where it lives: an edge file (beside the runs) and a worker's own
    journal file. A PostgreSQL database never holds one (migration 0015)."""
    from qlactors.executor.journal.journal import Journal

    if request.param == "edge_file":
        from qlactors.store.repository import Repository

        repository = Repository.open(f"sqlite:///{tmp_path / 'qlactors.db'}")
        yield Journal(repository.store)
        repository.close()
        return
    from qlactors.executor.journal.file import open_journal_file

    store = open_journal_file(tmp_path)
    yield Journal(store)
    store.close()
