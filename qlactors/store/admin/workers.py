"""Store: read model of the workers (`qlactors workers`, `task show`, `status`): each worker's current
session, the allowed workers that never opened one, and who qualifies for a task's labels now."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from ...domain.labels import qualifies
from ...domain.states import LeaseStatus
from ..dispatch.dispatch_queries import ACTIVE
from ..dispatch.session_rules import DUPLICATE
from ..engine import Store
from ..schema import run_attempts, run_dispatch_leases, worker_keys, worker_sessions

NEVER = "never"  # the status shown for an allowed worker that has no session yet
SERVING = ("online", "draining")  # the session statuses whose free slots mean something


def worker_state(status: str, lease_expired: bool, drained: bool, allowed: bool, ended_by: str | None = None) -> str:
    """What `workers` shows for a worker's current session (SEMANTICS.md §9 Sessions, Drain):
    `online`, `draining` (its SIGTERM: no more offers, its jobs go on), `expired` (online or
    draining, but its session lease ran out: no heartbeat reached a replica), `offline (drained)`
    (its worker left after a drain: a planned stop, the drain grace applies), `retired` (ended
    while its key stays allowed: `worker retire`, or a revoke whose key was allowed again),
    `offline` (ended, its key revoked), or `never`. A retired worker shows `retired` also when it
    had drained before (retire is the operator's word, a drain only the worker's)."""
    if status == NEVER:
        return NEVER
    if status == "offline":
        if ended_by == "retired" and allowed:
            return "retired"
        if drained:
            return "offline (drained)"
        return "retired" if allowed else "offline"
    return "expired" if lease_expired else status


@dataclass(frozen=True, slots=True)
class WorkerView:
    worker_id: str
    allowed: bool  # on the allow-list now (False: revoked, or the edge's built-in session)
    status: str  # the session's: online | draining | offline | never
    session_id: str | None = None
    generation: int | None = None
    capacity: int | None = None
    free_slots: int | None = None  # capacity minus the live leases the session holds (as offers count); None once ended
    heartbeat_at_ms: int | None = None
    heartbeat_age_ms: int | None = None  # database time minus the last heartbeat
    lease_expires_at_ms: int | None = None  # None: lives as long as its process (edge)
    lease_expired: bool = False
    clock_skew_ms: int | None = None  # database time minus the worker's clock at its last heartbeat
    labels: tuple[str, ...] = ()
    ended_at_ms: int | None = None  # when the session ended (offline), database time
    drained_at_ms: int | None = None  # when its worker drained it (SIGTERM), database time
    ended_by: str | None = None  # revoked | retired: the operator ended it
    note: str | None = None  # `duplicate`: the session was taken back from a second process with its key

    @property
    def state(self) -> str:
        """online | draining | expired | offline (drained) | retired | offline | never; a session
        taken back from a second live process presenting the same key adds `(duplicate key)`."""
        state = worker_state(self.status, self.lease_expired, self.drained_at_ms is not None, self.allowed,
                             self.ended_by)
        return f"{state} (duplicate key)" if self.note == DUPLICATE else state

    @property
    def serving(self) -> bool:
        """Online with a live session lease: offers may go to it now."""
        return self.status == "online" and not self.lease_expired

    def to_json(self) -> dict[str, Any]:
        return {"worker_id": self.worker_id, "allowed": self.allowed, "status": self.status, "state": self.state,
                "session_id": self.session_id, "generation": self.generation,
                "capacity": self.capacity, "free_slots": self.free_slots,
                "heartbeat_at_ms": self.heartbeat_at_ms, "heartbeat_age_ms": self.heartbeat_age_ms,
                "lease_expires_at_ms": self.lease_expires_at_ms, "lease_expired": self.lease_expired,
                "clock_skew_ms": self.clock_skew_ms, "labels": list(self.labels),
                "ended_at_ms": self.ended_at_ms, "drained_at_ms": self.drained_at_ms, "note": self.note}


@dataclass(frozen=True, slots=True)
class WorkerList:
    at_ms: int  # the database time the list was read at
    workers: tuple[WorkerView, ...]  # by worker id

    def qualifying(self, required: Iterable[str]) -> tuple[WorkerView, ...]:
        """Serving workers whose labels include every label in `required`."""
        need = tuple(required)
        return tuple(w for w in self.workers if w.serving and qualifies(w.labels, need))


class Workers:
    def __init__(self, store: Store) -> None:
        self.store = store

    def list(self) -> WorkerList:
        """Every worker with a session (its newest generation) or a key, in one read."""
        with self.store.read() as conn:
            now = self.store.now_ms(conn)
            sessions = _current_sessions(conn)
            allowed = set(conn.execute(select(worker_keys.c.worker_id)).scalars())
            taken = _leased(conn, [row.session_id for row in sessions])
        views = {row.worker_id: _view(row, now, row.worker_id in allowed, taken.get(row.session_id, 0))
                 for row in sessions}
        for worker_id in allowed - set(views):
            views[worker_id] = WorkerView(worker_id=worker_id, allowed=True, status=NEVER)
        return WorkerList(now, tuple(views[k] for k in sorted(views)))


def _current_sessions(conn: Connection) -> list:
    newest = (select(worker_sessions.c.worker_id, func.max(worker_sessions.c.generation).label("g"))
              .group_by(worker_sessions.c.worker_id).subquery())
    return conn.execute(select(worker_sessions).join(newest, (newest.c.worker_id == worker_sessions.c.worker_id)
                                                     & (newest.c.g == worker_sessions.c.generation))).all()


def _leased(conn: Connection, session_ids: list[str]) -> dict[str, int]:
    """Each session's slots taken: its live leases of attempts not yet ended, counted as an offer
    counts them (store/dispatch/dispatch_queries.py LEASED_COUNT), not as its last heartbeat said."""
    if not session_ids:
        return {}
    query = (select(run_dispatch_leases.c.session_id, func.count())
             .join(run_attempts, run_attempts.c.id == run_dispatch_leases.c.attempt_id)
             .where(run_dispatch_leases.c.session_id.in_(session_ids),
                    run_dispatch_leases.c.status == LeaseStatus.LEASED.value, run_attempts.c.status.in_(ACTIVE))
             .group_by(run_dispatch_leases.c.session_id))
    return {session_id: n for session_id, n in conn.execute(query)}


def _view(row, now: int, allowed: bool, taken: int) -> WorkerView:
    expires = row.lease_expires_at_ms
    return WorkerView(
        worker_id=row.worker_id, allowed=allowed, status=row.status, session_id=row.session_id,
        generation=row.generation, capacity=row.capacity,
        free_slots=max(0, row.capacity - taken) if row.status in SERVING else None,
        heartbeat_at_ms=row.heartbeat_at_ms,
        heartbeat_age_ms=None if row.heartbeat_at_ms is None else max(0, now - row.heartbeat_at_ms),
        lease_expires_at_ms=expires, lease_expired=expires is not None and expires <= now,
        clock_skew_ms=row.clock_skew_ms, labels=tuple(json.loads(row.labels_json or "[]")),
        ended_at_ms=row.ended_at_ms, drained_at_ms=row.drained_at_ms, note=row.note, ended_by=row.ended_by)
