"""A database made to fail for real: a short busy timeout and a write lock held by another process;
shared by the outage tests."""

from __future__ import annotations

import contextlib
import sqlite3

import pytest

from qlactors.store import sqlite as sqlite_store


@pytest.fixture
def short_busy_timeout(monkeypatch):
    """Stores opened from now on give up on a held write lock after 100 ms instead of 5 s."""
    monkeypatch.setattr(sqlite_store, "PRAGMAS", tuple(
        "PRAGMA busy_timeout=100" if p.startswith("PRAGMA busy_timeout") else p for p in sqlite_store.PRAGMAS))


@contextlib.contextmanager
def write_locked(db_path):
    """Hold SQLite's write lock from a connection of our own until the block ends."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()
