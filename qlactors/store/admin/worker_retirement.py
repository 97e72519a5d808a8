"""Store: `qlactors worker retire WORKER --confirm-stopped`: the operator's word that nothing of a worker
runs any more (SEMANTICS.md §9 Drain, §10 step 1). In one transaction, under the `worker:<id>`
lock a registration of that worker takes: its sessions end, drained ones included (every report
from them is fenced from then on and none is ever resumed; its key stays allowed), and each of
its `starting|running` attempts gets the evidence `retired` for its current lease generation,
which recovery trusts: once its lease has expired, the attempt ends `lost` and its run follows
its retry policy. Evidence about the current lease that already proves the process stopped is
kept; `launch_unknown`, `ended_with_receipt` (the operator's word outranks both) and any fact
about an older lease generation are replaced.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, bindparam, or_, select

from ...domain.recovery_evidence import RETIRED
from ...domain.states import AttemptStatus
from ...errors import NotFound
from ..dispatch.session_rows import end_live_sessions
from ..engine import Store
from ..schema import run_attempts, worker_keys, worker_sessions
from .worker_keys import check_worker_id

_A = run_attempts
_REPLACEABLE = ("launch_unknown", "ended_with_receipt")
_RETIRED = (_A.update().where(_A.c.id.in_(bindparam("ids", expanding=True)))
            .values(evidence_lease_generation=_A.c.lease_generation))


@dataclass(frozen=True, slots=True)
class Retirement:
    worker_id: str
    sessions_ended: int
    attempts: tuple[str, ...]
    """The attempts given the `retired` evidence (id order)."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A worker's session whose lease a heartbeat renewed and has not expired (database time)."""

    session_id: str
    age_ms: int  # since its last heartbeat
    left_ms: int  # until its lease expires


class WorkerRetirement:
    def __init__(self, store: Store) -> None:
        self.store = store

    def fresh(self, worker_id: str) -> Heartbeat | None:
        """The worker's live session whose lease has not expired (its newest), or None: a worker
        that heartbeats now is alive, and `worker retire` refuses it unless forced."""
        check_worker_id(worker_id)
        s = worker_sessions.c
        with self.store.read() as conn:
            now = self.store.now_ms(conn)
            row = conn.execute(select(s.session_id, s.heartbeat_at_ms, s.created_at_ms, s.lease_expires_at_ms).where(
                and_(s.worker_id == worker_id, s.ended_at_ms.is_(None), s.status.in_(("online", "draining")),
                     s.lease_expires_at_ms > now)).order_by(s.lease_expires_at_ms.desc()).limit(1)).first()
        if row is None:
            return None
        beat = row.heartbeat_at_ms if row.heartbeat_at_ms is not None else row.created_at_ms
        return Heartbeat(row.session_id, max(0, now - beat), row.lease_expires_at_ms - now)

    def retire(self, worker_id: str) -> Retirement:
        check_worker_id(worker_id)
        with self.store.write() as conn:
            self.store.advisory_lock(conn, f"worker:{worker_id}")
            known = conn.execute(select(worker_sessions.c.session_id).where(
                worker_sessions.c.worker_id == worker_id).limit(1)).first() is not None
            if not known and conn.execute(select(worker_keys.c.worker_id).where(
                    worker_keys.c.worker_id == worker_id)).first() is None:
                raise NotFound(f"no worker {worker_id}: it never registered and is not on the allow-list")
            now = self.store.now_ms(conn)
            ended = end_live_sessions(conn, worker_id, now, "retired")
            # Sessions before attempts, attempts in id order (the §9 lock order).
            ids = tuple(conn.execute(
                select(_A.c.id).where(and_(
                    _A.c.worker_id == worker_id,
                    _A.c.status.in_((AttemptStatus.STARTING.value, AttemptStatus.RUNNING.value)),
                    or_(_A.c.evidence.is_(None), _A.c.evidence.in_(_REPLACEABLE),
                        _A.c.evidence_lease_generation.is_distinct_from(_A.c.lease_generation))))
                .order_by(_A.c.id).with_for_update()).scalars())
            if ids:
                conn.execute(_RETIRED, dict(ids=list(ids), evidence=RETIRED, evidence_at_ms=now,
                                            evidence_by=None, updated_at_ms=now))
        return Retirement(worker_id, ended, ids)
