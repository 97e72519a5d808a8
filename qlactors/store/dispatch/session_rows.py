"""Store: the worker-session row statements the session operations share: the worker's latest
generation, the compare-and-set every session change goes through, and ending a worker's live
and resumable sessions (revoke, retire)."""

from __future__ import annotations

from sqlalchemy import and_, bindparam, func, or_, select
from sqlalchemy.engine import Connection

from ...errors import Conflict
from ..schema import worker_sessions
from .session_rules import ENDED_BY, ended_at

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


def end_live_sessions(conn: Connection, worker_id: str, now: int, ended_by: str) -> int:
    """End every session of the worker the operator has not ended yet that is live or could be
    resumed — `online`, `draining`, or `offline` after its own drain — in session-id order
    (SEMANTICS.md §9 lock order, Revoked and retired); how many. Each records `ended_by`
    (`revoked`, `retired`), which no resume passes, and version + 1; a live one goes `offline`
    with `ended_at_ms` as `session_rules.ended_at` says.

    A drained session keeps its `ended_at_ms` and `drained_at_ms`, and a `draining` one its
    `drained_at_ms`: recovery's idempotent rule still counts such a session as ended only a drain
    grace after its end (store/cadence/cluster_recovery.py), so ending it by revoke or retire never makes
    a duplicate of its work come sooner than its own drain promised. A session superseded or
    ended without a drain is not resumable and is left as it is. The caller holds the
    `worker:<id>` advisory lock, the serialisation of a registration or resume of this worker."""
    if ended_by not in ENDED_BY:
        raise ValueError(f"sessions are ended by {' or '.join(ENDED_BY)}")
    rows = conn.execute(select(_WS.c.session_id, _WS.c.version, _WS.c.status, _WS.c.ended_at_ms,
                               _WS.c.lease_expires_at_ms)
                        .where(and_(_WS.c.worker_id == worker_id, _WS.c.ended_by.is_(None),
                                    or_(_WS.c.status != "offline", _WS.c.drained_at_ms.is_not(None))))
                        .order_by(_WS.c.session_id).with_for_update()).all()
    for row in rows:
        if row.status == "offline":
            update_session(conn, row, now, ended_by=ended_by)
        else:
            update_session(conn, row, now, status="offline", ended_at_ms=ended_at(row, now), ended_by=ended_by)
    return len(rows)
