"""The worker-session row statements the session operations share: the worker's latest
generation, the compare-and-set every session change goes through, and ending a worker's live
sessions (revoke, retire)."""

from __future__ import annotations

from sqlalchemy import and_, bindparam, func, select
from sqlalchemy.engine import Connection

from ..errors import Conflict
from .schema import worker_sessions
from .session_rules import ended_at

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


def end_live_sessions(conn: Connection, worker_id: str, now: int) -> int:
    """End the worker's sessions that are not `offline` yet (status `offline`, `ended_at_ms` as
    `session_rules.ended_at` says, version + 1), in session-id order (SEMANTICS.md §9 lock
    order); how many. The caller holds the `worker:<id>` advisory lock, the serialisation of a
    registration of this worker."""
    live = conn.execute(select(_WS.c.session_id, _WS.c.version, _WS.c.ended_at_ms, _WS.c.lease_expires_at_ms)
                        .where(and_(_WS.c.worker_id == worker_id, _WS.c.status != "offline"))
                        .order_by(_WS.c.session_id).with_for_update()).all()
    for row in live:
        update_session(conn, row, now, status="offline", ended_at_ms=ended_at(row, now))
    return len(live)
