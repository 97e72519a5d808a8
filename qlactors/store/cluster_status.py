"""What `qlactors status` reads on a cluster besides runs and workers: the control replicas
(`control_replicas`) and the live attempts whose lease has expired (recovery's open cases)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, select

from ..domain.states import AttemptStatus, LeaseStatus
from .engine import Store
from .schema import control_replicas, run_attempts, run_dispatch_leases

REPLICA_SLACK_MS = 5_000  # a replica is up when it wrote its heartbeat within 3 ticks + this
EXPIRED_LEASES_SHOWN = 20


@dataclass(frozen=True, slots=True)
class ReplicaView:
    replica_id: str
    host: str
    pid: int
    bind: str
    started_at_ms: int
    heartbeat_at_ms: int
    stopped_at_ms: int | None
    up: bool
    db_errors: int
    """Transient database errors the replica met (and retried) since it started."""
    last_db_error: str | None
    last_db_error_at_ms: int | None

    def to_json(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, "host": self.host, "pid": self.pid, "bind": self.bind,
                "started_at_ms": self.started_at_ms, "heartbeat_at_ms": self.heartbeat_at_ms,
                "stopped_at_ms": self.stopped_at_ms, "up": self.up, "db_errors": self.db_errors,
                "last_db_error": self.last_db_error, "last_db_error_at_ms": self.last_db_error_at_ms}


@dataclass(frozen=True, slots=True)
class ExpiredLease:
    """A starting or running attempt whose lease is still `leased` but past its expiry: recovery
    decides it once the worker's session has been gone for the recovery grace (SEMANTICS.md §10)."""

    attempt_id: str
    run_id: str
    attempt_status: str
    worker_id: str
    session_generation: int
    expires_at_ms: int

    def to_json(self) -> dict[str, Any]:
        return {"attempt_id": self.attempt_id, "run_id": self.run_id, "attempt_status": self.attempt_status,
                "worker_id": self.worker_id, "session_generation": self.session_generation,
                "expires_at_ms": self.expires_at_ms,
                "why": f"lease of worker {self.worker_id} (generation {self.session_generation}) expired"}


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    at_ms: int  # database time of the read
    replicas: tuple[ReplicaView, ...]  # newest start first
    expired_leases: tuple[ExpiredLease, ...]  # oldest expiry first, at most EXPIRED_LEASES_SHOWN

    @property
    def replicas_up(self) -> int:
        return sum(1 for r in self.replicas if r.up)


def _up_window_ms(cadence_tick_ms: int) -> int:
    return 3 * cadence_tick_ms + REPLICA_SLACK_MS


def replicas_up(store: Store, cadence_tick_ms: int) -> int:
    """How many replicas are up now (not stopped, heartbeat within 3 ticks + 5 s): one small read."""
    with store.read() as conn:
        now = store.now_ms(conn)
        return conn.execute(select(func.count()).select_from(control_replicas).where(and_(
            control_replicas.c.stopped_at_ms.is_(None),
            control_replicas.c.heartbeat_at_ms >= now - _up_window_ms(cadence_tick_ms)))).scalar_one()


def read_cluster_status(store: Store, cadence_tick_ms: int) -> ClusterStatus:
    """One read: replicas (up: not stopped, heartbeat within 3 ticks + 5 s) and expired leases."""
    with store.read() as conn:
        now = store.now_ms(conn)
        rows = conn.execute(select(control_replicas).order_by(
            control_replicas.c.started_at_ms.desc(), control_replicas.c.replica_id)).all()
        expired = conn.execute(
            select(run_dispatch_leases.c.attempt_id, run_dispatch_leases.c.run_id,
                   run_attempts.c.status, run_dispatch_leases.c.worker_id,
                   run_dispatch_leases.c.session_generation, run_dispatch_leases.c.expires_at_ms)
            .join(run_attempts, run_attempts.c.id == run_dispatch_leases.c.attempt_id)
            .where(and_(run_dispatch_leases.c.status == LeaseStatus.LEASED.value,
                        run_dispatch_leases.c.expires_at_ms.is_not(None),
                        run_dispatch_leases.c.expires_at_ms <= now,
                        run_attempts.c.status.in_((AttemptStatus.STARTING.value,
                                                   AttemptStatus.RUNNING.value))))
            .order_by(run_dispatch_leases.c.expires_at_ms, run_dispatch_leases.c.attempt_id)
            .limit(EXPIRED_LEASES_SHOWN)).all()
    window = _up_window_ms(cadence_tick_ms)
    replicas = tuple(ReplicaView(r.replica_id, r.host, r.pid, r.bind, r.started_at_ms, r.heartbeat_at_ms,
                                 r.stopped_at_ms, r.stopped_at_ms is None and r.heartbeat_at_ms >= now - window,
                                 r.db_errors, r.last_db_error, r.last_db_error_at_ms)
                     for r in rows)
    return ClusterStatus(now, replicas, tuple(ExpiredLease(*row) for row in expired))
