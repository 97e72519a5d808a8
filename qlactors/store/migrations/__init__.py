"""Numbered SQL migrations, one file per dialect, applied in order inside one write transaction.

`NNNN_name.<dialect>.sql` files are frozen once released; `schema.py` is the model they must
build (a test migrates an empty database of each dialect and compares it with the metadata).
A database whose schema version is newer than the newest file here is refused, never migrated
down; a database that has tables but no `qlactors_schema` row is someone else's and is refused.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources

from sqlalchemy import inspect, select

from ...errors import SchemaError
from .. import sqlite
from ..engine import Store, translate_errors
from ..schema import schema_version

_FILE = re.compile(r"^(\d{4})_[a-z0-9_]+\.(sqlite|postgresql)\.sql$")
# The advisory lock a migration holds on PostgreSQL for its whole transaction.
MIGRATE_LOCK = "qlactors:migrate"

log = logging.getLogger("qlactors.store")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


def available(dialect: str) -> list[Migration]:
    """The migrations shipped for a dialect, in version order."""
    found = []
    for entry in resources.files(__name__).iterdir():
        match = _FILE.match(entry.name)
        if match and match.group(2) == dialect:
            text = entry.read_text(encoding="utf-8")
            statements = tuple(s.strip() for s in text.split(";\n") if _has_sql(s))
            found.append(Migration(int(match.group(1)), entry.name, statements))
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migration files for {dialect} are not numbered 1..N: {[m.name for m in found]}")
    return found


def _has_sql(chunk: str) -> bool:
    return any(line.strip() and not line.strip().startswith("--") for line in chunk.splitlines())


def latest_version(dialect: str) -> int:
    return len(available(dialect))


def current_version(store: Store) -> int | None:
    """The schema version recorded in the database; None for an empty database."""
    with store.read() as conn:
        names = set(inspect(conn).get_table_names())
        if schema_version.name not in names:
            if names:
                raise SchemaError(
                    f"{store.describe()} holds tables but no qlactors schema record: it is not a "
                    "qlactors database; it was left untouched, point --home elsewhere")
            return None
        row = conn.execute(select(schema_version.c.version)).first()
        if row is None:
            raise SchemaError(f"{store.describe()} has an empty schema record (an interrupted "
                              "setup?); it was left untouched: move it aside and start again")
        return int(row.version)


def migrate(store: Store) -> int:
    """Bring the database to the newest schema this qlactors knows; return that version."""
    migrations = available(store.dialect_name)
    newest = len(migrations)
    current = current_version(store)
    if current is not None and current > newest:
        raise SchemaError(
            f"{store.describe()} has schema version {current}, newer than this qlactors knows "
            f"({newest}): it was written by a newer qlactors and is refused, not migrated down; "
            "upgrade qlactors to use it")
    if store.dialect_name == "sqlite":
        _use_wal(store)
    if current == newest:
        return current
    with translate_errors(store), _transaction(store) as conn:
        if store.is_postgres:
            # Two processes migrating one database at once: the second waits, then finds work done.
            store.advisory_lock(conn, MIGRATE_LOCK)
        start = _recheck(conn)
        if start > newest:
            raise SchemaError(f"{store.describe()} was upgraded to schema {start} meanwhile; refusing")
        for migration in migrations[start:]:
            for statement in migration.statements:
                conn.exec_driver_sql(statement)
        now = store.now_ms(conn)
        if start == 0:
            conn.execute(schema_version.insert().values(id=1, version=newest, applied_at_ms=now))
        else:
            conn.execute(schema_version.update().values(version=newest, applied_at_ms=now))
    if start < newest:  # committed: this process migrated it (not one it waited for)
        log.info("event=schema_migrated from=%d to=%d database=%s", start, newest, store.describe())
    return newest


def migration_in_progress(store: Store) -> bool:
    """Whether another process is migrating the database now (holds MIGRATE_LOCK: PostgreSQL).
    On SQLite a migration holds the write lock, which the busy timeout already waits for."""
    if not store.is_postgres:
        return False
    with store.read() as conn:
        return not store.try_advisory_lock(conn, MIGRATE_LOCK)


@contextlib.contextmanager
def _transaction(store: Store) -> Iterator:
    """The one write transaction the migrations run in.

    On SQLite foreign keys are off for its length: rebuilding a table that others reference (the
    only way to change its CHECK constraints) is otherwise refused, and the pragma is a no-op
    inside a transaction. `foreign_key_check` must then find nothing before the commit.
    """
    if store.dialect_name != "sqlite":
        with store.engine.begin() as conn:
            yield conn
        return
    with store.engine.connect() as conn:
        raw = conn.connection.dbapi_connection  # before SQLAlchemy begins: see _use_wal
        raw.execute("PRAGMA foreign_keys=OFF")
        try:
            with conn.begin():
                yield conn
                broken = conn.exec_driver_sql("PRAGMA foreign_key_check").first()
                if broken is not None:
                    raise SchemaError(f"{store.describe()}: migrating would break a reference from "
                                      f"{broken[0]}; nothing was changed, report this as a bug")
        finally:
            raw.execute("PRAGMA foreign_keys=ON")


def _use_wal(store: Store) -> None:
    """Switch an accepted SQLite file to WAL (persistent; must run outside a transaction)."""
    with translate_errors(store), store.engine.connect() as conn:
        # On the driver connection: SQLAlchemy would wrap the statement in a transaction.
        sqlite.switch_to_wal(conn.connection.dbapi_connection, store.describe())


def _recheck(conn) -> int:
    """The version as seen under the write lock (another process may have migrated first)."""
    if schema_version.name not in inspect(conn).get_table_names():
        return 0
    row = conn.execute(select(schema_version.c.version)).first()
    return int(row.version) if row else 0
