"""Executor side: a cluster worker's own journal: `<state_dir>/journal.sqlite`, private, holding only
its tables.

It holds `executor_journal`, `executor_pulls`, `executor_session` and `executor_owed` (made from the journal's
own schema.py, so the journal code runs on it exactly as on the edge file) and nothing else: a worker
has no database credentials and keeps none of the control side's facts. The file and its
-wal/-shm are 0600 (SQLite gives those the database file's mode); the journal's own version is
`PRAGMA user_version`, and a newer one is refused rather than read. On edge the journal stays a
table of the edge file (no file of its own).
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import inspect

from ...errors import SchemaError
from ...store import sqlite
from ...store.engine import Store
from .schema import TABLES, metadata

JOURNAL_FILE = "journal.sqlite"
# 2: the owed reports (protocol 4, SEMANTICS.md §9 Owed reports). A version 1 journal is upgraded
# in place at open: its rows keep their meaning.
JOURNAL_VERSION = 2
_UPGRADES = {
    1: ("ALTER TABLE executor_journal ADD COLUMN clear_pending BOOLEAN NOT NULL DEFAULT 0",),
}


def open_journal_file(state_dir: Path | str) -> Store:
    """The worker's journal Store on `<state_dir>/journal.sqlite`, created (0600) if missing.

    Raises SchemaError for a journal of a newer qlactors, or a file that is not a worker journal
    (another SQLite database, e.g. an edge file); the file is left untouched.
    """
    path = Path(state_dir) / JOURNAL_FILE
    old_umask = os.umask(0o077)  # nothing SQLite creates here may be readable by others
    try:
        sqlite.create_private(path)
        store = Store(f"sqlite:///{path}")
        try:
            _prepare(store, path)
        except BaseException:
            store.close()
            raise
    finally:
        os.umask(old_umask)
    sqlite.tighten(path)
    return store


def _prepare(store: Store, path: Path) -> None:
    with store.write() as conn:
        version = conn.exec_driver_sql("PRAGMA user_version").scalar_one()
        present = set(inspect(conn).get_table_names())
        wanted = {t.name for t in TABLES}
        if version > JOURNAL_VERSION:
            raise SchemaError(f"{path} is a worker journal of version {version}, newer than this qlactors "
                              f"knows ({JOURNAL_VERSION}); it was left untouched: upgrade qlactors, or "
                              "point state_dir elsewhere")
        if version == 0 and present:
            raise SchemaError(f"{path} is a SQLite database but not a qlactors worker journal (it holds "
                              f"{', '.join(sorted(present)[:5])}); it was left untouched: move it aside")
        if version == 0:
            metadata.create_all(conn, tables=list(TABLES))
            conn.exec_driver_sql(f"PRAGMA user_version = {JOURNAL_VERSION}")
        else:
            had = {t.name for t in TABLES[:3]} if version == 1 else wanted  # version 1 had three
            if not had <= present:
                raise SchemaError(f"{path} is a worker journal without its tables "
                                  f"{', '.join(sorted(had - present))}; it was left untouched: move it aside")
            for old in range(version, JOURNAL_VERSION):
                for statement in _UPGRADES.get(old, ()):
                    conn.exec_driver_sql(statement)
            if version < JOURNAL_VERSION:
                metadata.create_all(conn, tables=list(TABLES))  # creates only the missing ones
                conn.exec_driver_sql(f"PRAGMA user_version = {JOURNAL_VERSION}")
    with store.engine.connect() as conn:  # outside a transaction: SQLite refuses it inside one
        sqlite.switch_to_wal(conn.connection.driver_connection, str(path))
