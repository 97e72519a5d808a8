"""Executor-facing dispatch: worker sessions, offers (claim + run lease) and fenced executor reports.

SEMANTICS.md §4 and §9. `Dispatch` combines the concerns, each in its own module: offers
(`offers.py`: `offer_batch`, `offer`), fenced reports (`fenced_reports.py`: `check_fence`,
`activate`, `started`, `start_failed`, `decline`, `release_unactivated`), and here the worker
session's registration. Every method is one short transaction; a pull whose session is dead
raises `Fenced`; a report answers an `Outcome` (`applied`, `fenced`, `refused`).
"""

from __future__ import annotations

from sqlalchemy import and_, select

from ..errors import BadInput, Conflict
from ..ids import new_id
from .engine import Store
from .fenced_reports import FencedReports
from .offers import Offers
from .records import Session, check_id
from .schema import worker_sessions

MAX_CAPACITY = 4096


class Dispatch(Offers, FencedReports):
    """Sessions, offers and the fenced executor reports, each one short transaction."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def register_session(self, worker_id: str, capacity: int) -> Session:
        """A new `online` session, generation = previous + 1; older sessions of the worker go `offline`.

        The new generation invalidates every fence of the old sessions at once. The session lease
        stays NULL: on edge it lives as long as the process.
        """
        check_id("worker id", worker_id, 128)
        if type(capacity) is not int or not 0 <= capacity <= MAX_CAPACITY:
            raise BadInput(f"session capacity must be an integer from 0 to {MAX_CAPACITY}")
        with self.store.write() as conn:
            # Two registrations of one worker would both compute the same next generation.
            self.store.advisory_lock(conn, f"worker:{worker_id}")
            previous = conn.execute(select(worker_sessions).where(
                worker_sessions.c.worker_id == worker_id).with_for_update()).all()
            now = self.store.now_ms(conn)
            generation = max((s.generation for s in previous), default=0) + 1
            for old in previous:
                if old.status != "offline":
                    conn.execute(worker_sessions.update().where(and_(
                        worker_sessions.c.session_id == old.session_id,
                        worker_sessions.c.version == old.version)).values(
                            status="offline", version=old.version + 1, updated_at_ms=now))
            session_id = new_id()
            if not self.store.insert_new(conn, worker_sessions, dict(
                    session_id=session_id, worker_id=worker_id, generation=generation, status="online",
                    version=1, capacity=capacity, free_slots=capacity, heartbeat_at_ms=now,
                    lease_expires_at_ms=None, created_at_ms=now, updated_at_ms=now)):
                raise Conflict(f"worker {worker_id!r} registered generation {generation} meanwhile")
            return Session(session_id, worker_id, generation, capacity)
