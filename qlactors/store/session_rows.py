"""The worker-session row statements the session operations share: the worker's latest
generation, and the compare-and-set every session change goes through."""

from __future__ import annotations

from sqlalchemy import and_, bindparam, func, select
from sqlalchemy.engine import Connection

from ..errors import Conflict
from .schema import worker_sessions

_WS = worker_sessions
LATEST_GENERATION = select(func.coalesce(func.max(_WS.c.generation), 0)).where(
    _WS.c.worker_id == bindparam("worker_id"))
_SESSION_CAS = _WS.update().where(and_(_WS.c.session_id == bindparam("w_session_id"),
                                       _WS.c.version == bindparam("w_version")))


def update_session(conn: Connection, row, now: int, **values) -> None:
    """Compare-and-set one session row on its version (the caller holds its row lock)."""
    values.update(version=row.version + 1, updated_at_ms=now, w_session_id=row.session_id,
                  w_version=row.version)
    if conn.execute(_SESSION_CAS, values).rowcount != 1:
        raise Conflict(f"session {row.session_id} changed meanwhile")
