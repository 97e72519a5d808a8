"""Control replicas as `status` shows them: each writes its row at start, every cycle, and at stop."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select

from ..ids import new_id
from .engine import Store
from .schema import control_replicas

# A replica whose row was not written for this long is shown as down (3 cluster ticks and then some).
STALE_AFTER_MS = 10_000


@dataclass(frozen=True, slots=True)
class Replica:
    replica_id: str
    host: str
    pid: int
    bind: str
    started_at_ms: int
    heartbeat_at_ms: int
    stopped_at_ms: int | None
    up: bool  # written recently and not stopped (database time)


class Replicas:
    def __init__(self, store: Store) -> None:
        self.store = store

    def register(self, host: str, pid: int, bind: str) -> str:
        replica_id = new_id()
        with self.store.write() as conn:
            now = self.store.now_ms(conn)
            conn.execute(control_replicas.insert().values(
                replica_id=replica_id, host=host[:255], pid=pid, bind=bind, started_at_ms=now,
                heartbeat_at_ms=now, stopped_at_ms=None))
        return replica_id

    def heartbeat(self, replica_id: str) -> None:
        with self.store.write() as conn:
            conn.execute(control_replicas.update().where(control_replicas.c.replica_id == replica_id)
                         .values(heartbeat_at_ms=self.store.now_ms(conn)))

    def stopped(self, replica_id: str) -> None:
        with self.store.write() as conn:
            conn.execute(control_replicas.update().where(control_replicas.c.replica_id == replica_id)
                         .values(stopped_at_ms=self.store.now_ms(conn)))

    def recent(self, limit: int = 32) -> list[Replica]:
        """The replicas started last, newest first, each with whether it is up now."""
        with self.store.read() as conn:
            now = self.store.now_ms(conn)
            rows = conn.execute(select(control_replicas).order_by(
                control_replicas.c.started_at_ms.desc()).limit(limit)).all()
        return [Replica(r.replica_id, r.host, r.pid, r.bind, r.started_at_ms, r.heartbeat_at_ms,
                        r.stopped_at_ms, r.stopped_at_ms is None and now - r.heartbeat_at_ms <= STALE_AFTER_MS)
                for r in rows]
