"""Engine wiring: SQLite pragmas and write locks, PostgreSQL isolation and database time."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

from qlactors.errors import StoreUnavailable
from qlactors.store.engine import Store
from qlactors.store.migrations import migrate


@pytest.fixture
def sqlite_store(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'q.db'}")
    migrate(store)
    yield store
    store.close()


def test_sqlite_connections_use_wal_full_sync_and_foreign_keys(sqlite_store):
    with sqlite_store.read() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000


def test_sqlite_a_not_durable_write_skips_only_its_own_fsync(sqlite_store):
    """durable=False commits with synchronous=NORMAL on its own connection; every other write stays FULL."""
    with sqlite_store.write(durable=False) as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
        conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
        conn.exec_driver_sql("INSERT INTO t VALUES (1)")
    with sqlite_store.write() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
        conn.exec_driver_sql("INSERT INTO t VALUES (2)")
    with sqlite_store.read() as conn:  # committed for every reader, whichever connection wrote
        assert conn.exec_driver_sql("SELECT x FROM t ORDER BY x").scalars().all() == [1, 2]
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2
    with sqlite_store.write(durable=False) as conn:  # the held connection keeps its setting
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1


def test_sqlite_a_failed_write_rolls_back_and_the_next_one_works(sqlite_store):
    """The held write connection survives a failed transaction: nothing of it stays."""
    with sqlite_store.write() as conn:
        conn.exec_driver_sql("CREATE TABLE t (x INTEGER PRIMARY KEY)")
    with pytest.raises(Exception):
        with sqlite_store.write() as conn:
            conn.exec_driver_sql("INSERT INTO t VALUES (1)")
            conn.exec_driver_sql("INSERT INTO t VALUES (1)")
    with sqlite_store.write() as conn:
        conn.exec_driver_sql("INSERT INTO t VALUES (2)")
    with sqlite_store.read() as conn:
        assert conn.exec_driver_sql("SELECT x FROM t").scalars().all() == [2]


def test_sqlite_writes_take_the_write_lock_up_front(sqlite_store):
    """BEGIN IMMEDIATE: a second writer waits for the first instead of failing on lock upgrade."""
    order = []
    first_holds = threading.Event()

    def first():
        with sqlite_store.write():
            first_holds.set()
            time.sleep(0.3)
            order.append("first done")

    thread = threading.Thread(target=first)
    thread.start()
    first_holds.wait(5)
    with sqlite_store.write():
        order.append("second in")
    thread.join(5)
    assert order == ["first done", "second in"]


def test_sqlite_reads_do_not_block_behind_a_writer(sqlite_store):
    with sqlite_store.write():
        started = time.monotonic()
        with sqlite_store.read() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM tasks").scalar() == 0
        assert time.monotonic() - started < 2  # far below the 5 s busy timeout


@pytest.mark.postgres
def test_postgres_sessions_are_read_committed_and_use_database_time(pg_schema_url, monkeypatch):
    store = Store(pg_schema_url)
    try:
        with store.read() as conn:
            assert conn.execute(text("SHOW transaction_isolation")).scalar() == "read committed"
            # A worker's clock stopped at the epoch must not matter: time comes from the server.
            monkeypatch.setattr(time, "time_ns", lambda: 0)
            assert store.now_ms(conn) > 1_600_000_000_000
    finally:
        store.close()


def test_sqlite_uses_the_local_clock(sqlite_store, monkeypatch):
    monkeypatch.setattr(time, "time_ns", lambda: 42_000_000)
    with sqlite_store.read() as conn:
        assert sqlite_store.now_ms(conn) == 42


def test_sqlite_switch_to_wal_waits_out_a_busy_file_then_gives_up(tmp_path):
    """Two processes opening a fresh home at once: one's WAL switch meets the other's lock.

    SQLite answers such a switch "database is locked" at once when waiting could deadlock; a
    zero busy timeout stands in for that here. The switch retries until the lock is gone, and
    refuses in one line (StoreUnavailable: busy, try again) once its patience runs out.
    """
    import sqlite3

    from qlactors.store import sqlite

    path = tmp_path / "fresh.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (x INTEGER)")
    switcher = sqlite3.connect(path, isolation_level=None)
    switcher.execute("PRAGMA busy_timeout=0")

    holder.execute("BEGIN EXCLUSIVE")
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        switcher.execute(sqlite.WAL)  # what the migration did before: one try
    with pytest.raises(StoreUnavailable) as refused:
        sqlite.switch_to_wal(switcher, str(path), patience_s=0.2)
    assert str(refused.value) == (
        f"database file {path} is busy (another qlactors process holds it?): it could not be switched to "
        "WAL mode within 0.2 s (database is locked); try again")
    assert isinstance(refused.value.__cause__, sqlite3.OperationalError)
    release = threading.Timer(0.5, lambda: holder.execute("COMMIT"))
    release.start()
    sqlite.switch_to_wal(switcher, str(path))
    release.join()
    assert switcher.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    sqlite.switch_to_wal(switcher, str(path), patience_s=0)  # already WAL: nothing to wait for
    holder.close()
    switcher.close()


def test_a_database_error_never_quotes_a_bound_value(sqlite_store):
    """A statement the database refuses: its error (what a traceback in a log shows) names the
    statement, never the values bound to it (a command, an environment value; issue 28)."""
    import traceback

    from sqlalchemy.exc import IntegrityError

    secret = "planted-value-7c1e"
    with pytest.raises(IntegrityError) as refused:
        with sqlite_store.write() as conn:
            conn.execute(text("INSERT INTO tasks (id, name) VALUES (:id, :name)"), {"id": secret, "name": None})
    shown = "".join(traceback.format_exception(refused.value))
    assert "INSERT INTO tasks" in shown and secret not in shown, shown
