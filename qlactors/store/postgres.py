"""PostgreSQL specifics: READ COMMITTED, database time, advisory locks."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.dialects.postgresql import insert as _insert
from sqlalchemy.engine import Connection, Engine

_NOW = text("SELECT (extract(epoch FROM statement_timestamp()) * 1000)::bigint")
_ADVISORY = text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))")


def configure(engine: Engine) -> None:
    """Nothing to install: isolation is set on the engine, time is read per statement."""


def now_ms(conn: Connection) -> int:
    """Cluster time is the database's, never a worker's clock."""
    return int(conn.execute(_NOW).scalar_one())


def advisory_lock(conn: Connection, key: str) -> None:
    """Serialise on `key` until the transaction ends (attempt authority, SEMANTICS.md §9)."""
    conn.execute(_ADVISORY, {"key": key})


insert = _insert
