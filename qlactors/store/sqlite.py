"""Store: SQLite specifics: pragmas, `BEGIN IMMEDIATE` for writes, and the local clock as time source."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from sqlalchemy import event
from sqlalchemy.dialects.sqlite import insert as _insert
from sqlalchemy.engine import Engine

from ..errors import StoreUnavailable

# Each pragma is a decision; the reasons are here so nobody has to rediscover them.
PRAGMAS = (
    # FULL: a lost "starting" commit after a spawn would run a job twice. Durability first.
    "PRAGMA synchronous=FULL",
    # SQLite ships with foreign keys off; the schema's references are meant to hold.
    "PRAGMA foreign_keys=ON",
    # Writers queue for up to 5 s on the write lock instead of failing at once.
    "PRAGMA busy_timeout=5000",
    # A small page cache per connection (KiB when negative): it counts against idle memory.
    "PRAGMA cache_size=-1024",
    # Keep the WAL from growing without bound between checkpoints.
    "PRAGMA journal_size_limit=8388608",
)

# Store.write(durable=False): a commit that may be lost with the machine, never with the process.
NOT_DURABLE = "PRAGMA synchronous=NORMAL"

# WAL lets the CLI read while the runtime writes. It is stored in the file itself, so it is set
# once, by the migration that accepted the file: never on a foreign or newer database.
WAL = "PRAGMA journal_mode=WAL"

# How long switching to WAL retries a busy file. The switch needs the file to itself, and two
# processes opening a fresh file at once each hold a read lock the other's switch waits on:
# SQLite answers one of them "database is locked" at once (its busy handler would deadlock).
WAL_SWITCH_PATIENCE_S = 10.0

READ_ONLY_OPTION = "qlactors_read_only"

def configure(engine: Engine) -> None:
    """Install the connect and begin listeners that make pysqlite behave (STYLE.md traps)."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):  # pragma: no cover - exercised by every test
        # pysqlite starts deferred transactions by itself; take that job away from it.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        for pragma in PRAGMAS:
            cursor.execute(pragma)
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        # Every write takes the write lock up front, so two writers never deadlock on upgrade;
        # readers begin deferred and see one WAL snapshot.
        if conn.get_execution_options().get(READ_ONLY_OPTION):
            conn.exec_driver_sql("BEGIN")
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")


def switch_to_wal(dbapi_conn, name: str, *, patience_s: float = WAL_SWITCH_PATIENCE_S) -> None:
    """Put the file `name` (as messages name it) in WAL mode on a driver connection outside any
    transaction.

    Nothing to do when it already is (the usual case); a busy refusal is retried with a short
    sleep until `patience_s` runs out, then raised as `StoreUnavailable` (one line, exit 1).
    """
    deadline = time.monotonic() + patience_s
    while True:
        try:
            if dbapi_conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
                return
            dbapi_conn.execute(WAL)
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if time.monotonic() >= deadline:
                raise StoreUnavailable(
                    f"database file {name} is busy (another qlactors process holds it?): it could not be "
                    f"switched to WAL mode within {patience_s:g} s ({exc}); try again") from exc
            time.sleep(0.05)


def now_ms(_conn) -> int:
    """Edge time is the system clock (there is only one box)."""
    return time.time_ns() // 1_000_000


def advisory_locks(_conn, _keys) -> None:
    """SQLite has one writer: a write transaction already excludes every other."""


def try_advisory_lock(_conn, _key) -> bool:
    """SQLite has one writer: there is nothing more to lock (see `advisory_locks`)."""
    return True


def advisory_locks_then_tasks(_conn, _keys, _run_ids) -> None:
    """SQLite has one writer: nothing to lock."""
insert = _insert


# The database and the -wal/-shm files SQLite makes beside it (with the database file's mode).
FILE_MODE = 0o600
_COMPANIONS = ("", "-wal", "-shm", "-journal")


def database_path(url) -> Path | None:
    """The file of a SQLite URL (None: not SQLite, or an in-memory database)."""
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(url.database)


def create_private(path: Path) -> None:
    """Create a missing database file 0600 before SQLite does: it would make it (and its -wal and
    -shm, which copy its mode) 0644 under the usual umask, readable by every user of the box."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        return
    except OSError:
        return  # no such directory, not writable...: SQLite's own open says so, in one line
    try:
        os.fchmod(fd, FILE_MODE)  # a umask may narrow the mode, never widen it: pin it exactly
    finally:
        os.close(fd)


def tighten(path: Path) -> None:
    """Make an accepted database (and the -wal/-shm beside it) 0600 again, e.g. after an older
    qlactors left them 0644. Only files this user owns; one stat each when nothing is wrong."""
    for suffix in _COMPANIONS:
        companion = path.with_name(path.name + suffix)
        try:
            st = os.stat(companion)
            if st.st_mode & 0o077 and st.st_uid == os.getuid():
                os.chmod(companion, FILE_MODE)
        except OSError:
            continue  # absent (no WAL yet), or not ours to change: leave it
