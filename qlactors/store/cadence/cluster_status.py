"""Store: what `qlactors status` reads on a cluster besides runs and workers: the control replicas
(`control_replicas`) and recovery's open cases, the live attempts whose lease is missing or
expired and that wait for evidence, with the reason (SEMANTICS.md §10 step 1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, select

from ..engine import Store
from ..schema import control_replicas
from .cluster_recovery import ClusterRecoveryCases, WaitingAttempt

REPLICA_SLACK_MS = 5_000  # a replica is up when it wrote its heartbeat within 3 ticks + this
SILENT_KEPT_MS = 24 * 3600 * 1000  # a silent replica is counted (and listed) for a day after its heartbeat


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
    cycle_failure: dict[str, Any] | None = None
    """The cadence step its last cycle failed at: {"step", "error", "since_ms"} (the replica's
    clock); None while its cycles get through (nothing is offered by it meanwhile)."""

    def to_json(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, "host": self.host, "pid": self.pid, "bind": self.bind,
                "started_at_ms": self.started_at_ms, "heartbeat_at_ms": self.heartbeat_at_ms,
                "stopped_at_ms": self.stopped_at_ms, "up": self.up, "db_errors": self.db_errors,
                "last_db_error": self.last_db_error, "last_db_error_at_ms": self.last_db_error_at_ms,
                "cycle_failure": self.cycle_failure}


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    at_ms: int  # database time of the read
    replicas: tuple[ReplicaView, ...]  # newest start first
    waiting: tuple[WaitingAttempt, ...]
    """Attempts whose lease is missing or expired, waiting for evidence, with the reason; oldest
    expiry first, at most WAITING_SHOWN (store/cadence/cluster_recovery.py)."""

    @property
    def replicas_up(self) -> int:
        return sum(1 for r in self.replicas if r.up)

    @property
    def current(self) -> tuple[ReplicaView, ...]:
        """The replicas `status` counts: up, or silent (not stopped) for at most a day; a stopped
        one, or one silent for longer (killed, its host gone), is history (`status --all`)."""
        return tuple(r for r in self.replicas if r.up or (
            r.stopped_at_ms is None and self.at_ms - r.heartbeat_at_ms <= SILENT_KEPT_MS))


def _up_window_ms(cadence_tick_ms: int) -> int:
    return 3 * cadence_tick_ms + REPLICA_SLACK_MS


def replicas_up(store: Store, cadence_tick_ms: int) -> int:
    """How many replicas are up now (not stopped, heartbeat within 3 ticks + 5 s): one small read."""
    with store.read() as conn:
        now = store.now_ms(conn)
        return conn.execute(select(func.count()).select_from(control_replicas).where(and_(
            control_replicas.c.stopped_at_ms.is_(None),
            control_replicas.c.heartbeat_at_ms >= now - _up_window_ms(cadence_tick_ms)))).scalar_one()


def _cycle_failure(row) -> dict[str, Any] | None:
    if row.cycle_failed_step is None:
        return None
    return {"step": row.cycle_failed_step, "error": row.cycle_error, "since_ms": row.cycle_failed_since_ms}


def read_cluster_status(store: Store, cadence_tick_ms: int, *, recovery_grace_ms: int,
                        drain_grace_ms: int) -> ClusterStatus:
    """Replicas (up: not stopped, heartbeat within 3 ticks + 5 s), then, in a second read, the
    attempts waiting for evidence, judged with the replicas' graces."""
    with store.read() as conn:
        now = store.now_ms(conn)
        rows = conn.execute(select(control_replicas).order_by(
            control_replicas.c.started_at_ms.desc(), control_replicas.c.replica_id)).all()
    window = _up_window_ms(cadence_tick_ms)
    replicas = tuple(ReplicaView(r.replica_id, r.host, r.pid, r.bind, r.started_at_ms, r.heartbeat_at_ms,
                                 r.stopped_at_ms, r.stopped_at_ms is None and r.heartbeat_at_ms >= now - window,
                                 r.db_errors, r.last_db_error, r.last_db_error_at_ms, _cycle_failure(r))
                     for r in rows)
    cases = ClusterRecoveryCases(store, recovery_grace_ms=recovery_grace_ms, drain_grace_ms=drain_grace_ms)
    _at, waiting = cases.waiting()
    return ClusterStatus(now, replicas, tuple(waiting))
