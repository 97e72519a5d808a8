"""Store: what the cadence and `qlactors status` read without changing anything: whether a run waits for
an offer, the runs not yet terminal, and runs and live attempts counted by state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from sqlalchemy import and_, func, or_, select

from ...domain.states import AttemptStatus, RunStatus
from ..engine import Store
from ..schema import run_attempts, runs
from .control_rows import ACTIVE, live_lease

_A, _R = AttemptStatus, RunStatus


@dataclass(frozen=True, slots=True)
class StatusCounts:
    """What `qlactors status` shows: runs by state, live attempts by state."""

    runs: Mapping[str, int]
    attempts: Mapping[str, int]


class ControlStatus:
    """The waiting test, the active runs and the status counts."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def queued_waiting(self) -> bool:
        """True when a run waits for an offer (the Scheduler then nudges executors): one `queued`
        whose not-before time (a cron random delay) is not ahead, or a `dispatching` one whose
        `claimed` attempt holds no live lease (released unactivated)."""
        released = select(run_attempts.c.id).where(and_(
            run_attempts.c.run_id == runs.c.id, run_attempts.c.status == _A.CLAIMED.value, ~live_lease()))
        with self.store.read() as conn:
            due = or_(runs.c.not_before_ms.is_(None), runs.c.not_before_ms <= self.store.now_ms(conn))
            return conn.execute(select(runs.c.id).where(and_(runs.c.cancel_reason.is_(None), or_(
                and_(runs.c.status == _R.QUEUED.value, due),
                and_(runs.c.status == _R.DISPATCHING.value, released.exists()))))
                .limit(1)).first() is not None

    def active_run_ids(self, limit: int = 1024) -> list[str]:
        """Runs that are not terminal (oldest first, bounded)."""
        with self.store.read() as conn:
            return list(conn.execute(select(runs.c.id).where(runs.c.status.in_(
                [s.value for s in RunStatus if not s.terminal])).order_by(runs.c.created_at_ms)
                .limit(limit)).scalars())

    def lost_count(self) -> int:
        with self.store.read() as conn:
            return conn.execute(select(func.count()).select_from(runs).where(
                runs.c.status == _R.LOST.value)).scalar_one()

    def run_counts(self) -> dict[str, int]:
        """Runs by state, every state present (zero included): one GROUP BY over the status index."""
        with self.store.read() as conn:
            by_run = dict(conn.execute(select(runs.c.status, func.count()).group_by(runs.c.status)).all())
        return {s.value: by_run.get(s.value, 0) for s in RunStatus}

    def counts(self) -> StatusCounts:
        """Runs by state (every state present, zero included) and live attempts by state."""
        with self.store.read() as conn:
            by_run = dict(conn.execute(select(runs.c.status, func.count()).group_by(runs.c.status)).all())
            by_attempt = dict(conn.execute(select(run_attempts.c.status, func.count())
                                           .where(run_attempts.c.status.in_(ACTIVE))
                                           .group_by(run_attempts.c.status)).all())
        return StatusCounts(runs={s.value: by_run.get(s.value, 0) for s in RunStatus},
                            attempts={s: by_attempt.get(s, 0) for s in ACTIVE})
