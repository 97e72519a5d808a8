"""PostgreSQL hygiene (SEMANTICS.md §9 Transport): the pool size and the lock, statement and
idle-in-transaction timeouts of every connection, and the server errors that are transient
(`StoreUnavailable`, retried by the actor that met them) — on a real PostgreSQL."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import psycopg
import pytest
from sqlalchemy import text

from conftest import _pg_admin_conninfo
from qlactors.errors import BadInput
from qlactors.store import postgres
from qlactors.store.dispatch.dispatch import Dispatch
from qlactors.errors import StoreUnavailable
from qlactors.store.engine import Store
from qlactors.store.migrations import migrate

pg = pytest.mark.postgres


def beat(dispatch, session, seq):
    return dispatch.heartbeats.apply(session.worker_id, session.session_id, session.generation, seq,
                              free_slots=1, worker_clock_ms=1, renewals=(), session_lease_ms=45_000,
                              run_lease_ms=30_000)


@pytest.fixture
def stores(pg_schema_url):
    """Open stores on the test schema (migrated once), closed afterwards."""
    opened = []

    def open_store(**options):
        store = Store(pg_schema_url, **options)
        opened.append(store)
        return store

    migrate(open_store())
    yield open_store
    for store in opened:
        store.close()


def libpq_url(sqlalchemy_url: str) -> str:
    return sqlalchemy_url.replace("postgresql+psycopg://", "postgresql://", 1)


@pg
def test_timeouts_and_pool_size_are_set_on_every_connection(stores):
    store = stores(pool_size=3, lock_timeout_ms=250, statement_timeout_ms=4000,
                   idle_in_transaction_timeout_ms=3000)
    assert store.engine.pool.size() == 3
    with store.write() as a, store.read() as b:  # two connections of the pool
        for conn in (a, b):
            shown = [conn.execute(text(f"SHOW {name}")).scalar_one()
                     for name in ("lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout")]
            assert shown == ["250ms", "4s", "3s"]
    with stores().read() as conn:  # no argument: the server's own settings, today's pool
        assert conn.execute(text("SHOW lock_timeout")).scalar_one() == "0"
    assert stores().engine.pool.size() == postgres.DEFAULT_POOL_SIZE


def test_sqlite_takes_none_of_the_postgresql_settings(tmp_path):
    for options in ({"lock_timeout_ms": 100}, {"pool_size": 2}):
        with pytest.raises(BadInput, match="PostgreSQL settings"):
            Store(f"sqlite:///{tmp_path / 'q.db'}", **options)
    with pytest.raises(BadInput):
        postgres.session_timeouts(lock_timeout_ms=0)


@pg
def test_a_lock_wait_beyond_lock_timeout_is_transient_and_the_retry_succeeds(stores, pg_schema_url):
    dispatch = Dispatch.open(stores(lock_timeout_ms=200))
    session = dispatch.sessions.register("w1", 2, session_lease_ms=45_000)
    with psycopg.connect(libpq_url(pg_schema_url)) as holder:  # another client holds the row
        holder.execute("SELECT * FROM worker_sessions WHERE session_id = %s FOR UPDATE",
                       (session.session_id,))
        with pytest.raises(StoreUnavailable, match="lock timeout"):
            beat(dispatch, session, 1)
        assert dispatch.store.health.outage() is not None
    answer = beat(dispatch, session, 1)  # the lock is gone: the same heartbeat goes through
    assert not answer.session_ended and answer.seq == 1
    assert dispatch.store.health.outage() is None


@pg
def test_a_statement_beyond_statement_timeout_is_transient(stores):
    store = stores(statement_timeout_ms=100)
    with pytest.raises(StoreUnavailable, match="statement timeout"):
        with store.read() as conn:
            conn.execute(text("SELECT pg_sleep(5)"))
    with store.read() as conn:
        assert conn.execute(text("SELECT 1")).scalar_one() == 1


@pg
def test_an_idle_transaction_beyond_its_timeout_is_ended_by_the_server(stores):
    store = stores(idle_in_transaction_timeout_ms=100)
    with pytest.raises(StoreUnavailable):
        with store.write() as conn:
            conn.execute(text("SELECT 1"))
            time.sleep(0.5)  # a frozen transaction: the server ends the session
            conn.execute(text("SELECT 1"))
    with store.write() as conn:
        assert conn.execute(text("SELECT 1")).scalar_one() == 1


@pg
def test_a_terminated_backend_mid_write_is_transient_and_the_retry_commits(stores):
    dispatch = Dispatch.open(stores())
    session = dispatch.sessions.register("w1", 2, session_lease_ms=45_000)
    with pytest.raises(StoreUnavailable, match="is unavailable"):
        with dispatch.store.write() as conn:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            with psycopg.connect(_pg_admin_conninfo(), autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            conn.execute(text("UPDATE worker_sessions SET free_slots = 0"))
    with dispatch.store.read() as conn:  # nothing was changed...
        assert conn.execute(text("SELECT free_slots FROM worker_sessions")).scalar_one() == 2
    assert beat(dispatch, session, 1).seq == 1  # ...and the operation goes through on a fresh connection
    with dispatch.store.read() as conn:
        assert conn.execute(text("SELECT free_slots, heartbeat_seq FROM worker_sessions")).one() == (1, 1)


@pg
def test_a_terminated_backend_inside_a_batch_of_events_is_still_transient(stores):
    """The connection lost inside `events_together` (an offer batch, a report batch): the error
    that escapes is the retried `StoreUnavailable`, not a `PendingRollbackError` from tidying
    the block up on the dead connection (which failed the replica's Gateway actor)."""
    from qlactors.store.plans import events_together

    dispatch = Dispatch.open(stores())
    dispatch.sessions.register("w1", 2, session_lease_ms=45_000)
    with pytest.raises(StoreUnavailable, match="is unavailable"):
        with dispatch.store.write() as conn, events_together(conn):
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            with psycopg.connect(_pg_admin_conninfo(), autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            conn.execute(text("UPDATE worker_sessions SET free_slots = 0"))
    with dispatch.store.read() as conn:
        assert conn.execute(text("SELECT free_slots FROM worker_sessions")).scalar_one() == 2


@pg
def test_a_deadlock_is_transient(stores, pg_schema_url):
    """Two transactions lock two rows in opposite orders: the server cancels one (40P01)."""
    dispatch = Dispatch.open(stores())
    a = dispatch.sessions.register("a", 1)
    b = dispatch.sessions.register("b", 1)
    locked, errors = threading.Barrier(2, timeout=30), []

    def cross(first, second):
        try:
            with dispatch.store.write() as conn:
                conn.execute(text("SELECT 1 FROM worker_sessions WHERE session_id = :s FOR UPDATE"), {"s": first})
                locked.wait()
                conn.execute(text("SELECT 1 FROM worker_sessions WHERE session_id = :s FOR UPDATE"), {"s": second})
        except StoreUnavailable as err:
            errors.append(err)

    threads = [threading.Thread(target=cross, args=pair)
               for pair in ((a.session_id, b.session_id), (b.session_id, a.session_id))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(errors) == 1 and "deadlock" in str(errors[0])


def test_transient_sqlstates():
    for state in ("40001", "40P01", "55P03", "57014", "57P01", "25P03", "08006"):
        assert postgres.transient(SimpleNamespace(sqlstate=state))
    for error in (SimpleNamespace(sqlstate="23505"), SimpleNamespace(sqlstate=None), ValueError()):
        assert not postgres.transient(error)
