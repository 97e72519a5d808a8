"""Store: control replicas write their row for `status` (store/cadence/cluster_status.py reads it): at start,
every cycle (with the tally of their transient database errors and the cadence's failing step,
if any), and at stop. A replica's first heartbeat replaces the rows of earlier replicas on its
host and bind: it holds that bind now, so on this machine they are gone, whether stopped or
killed. Two machines can share a host name: a live replica whose row another deleted so writes
it again at its next heartbeat."""

from __future__ import annotations

from typing import Any

from ...ids import new_id
from sqlalchemy import and_, delete, select

from ..engine import Store
from ..health import ErrorTally
from ..schema import control_replicas


class Replicas:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._bound: set[str] = set()  # replicas whose first heartbeat replaced their predecessors
        self._rows: dict[str, dict[str, Any]] = {}  # what register wrote, to write it again

    def register(self, host: str, pid: int, bind: str) -> str:
        replica_id = new_id()
        with self.store.write() as conn:
            now = self.store.now_ms(conn)
            row = dict(replica_id=replica_id, host=host[:255], pid=pid, bind=bind, started_at_ms=now)
            conn.execute(control_replicas.insert().values(**row, heartbeat_at_ms=now, stopped_at_ms=None,
                                                          db_errors=0))
        self._rows[replica_id] = row
        return replica_id

    def heartbeat(self, replica_id: str, errors: ErrorTally, cycle_failure: Any = None) -> None:
        """Alive now, the replica's transient database errors so far (the failures of an outage
        reach the row with the first heartbeat after it: none gets through during it), and the
        cadence step its last cycle failed at (a CycleFailure: step, error, since_ms on the
        replica's clock), or None, which clears it."""
        failure = cycle_failure
        with self.store.write() as conn:
            now = self.store.now_ms(conn)
            if replica_id not in self._bound:
                self._replace_predecessors(conn, replica_id)
            values = dict(heartbeat_at_ms=now, db_errors=errors.failures,
                          last_db_error=errors.last_error, last_db_error_at_ms=errors.last_error_at_ms,
                          cycle_failed_step=None if failure is None else failure.step,
                          cycle_error=None if failure is None else failure.error,
                          cycle_failed_since_ms=None if failure is None else failure.since_ms)
            updated = conn.execute(control_replicas.update()
                                   .where(control_replicas.c.replica_id == replica_id).values(**values))
            if updated.rowcount == 0 and replica_id in self._rows:  # deleted (by a replica of the same
                # host name and bind that took it for silent): it is serving, so its row is back
                conn.execute(control_replicas.insert().values(**self._rows[replica_id], **values,
                                                              stopped_at_ms=None))
        self._bound.add(replica_id)

    @staticmethod
    def _replace_predecessors(conn, replica_id: str) -> None:
        """Delete the other rows of this host and bind. Called from the first heartbeat, which a
        replica's cadence sends only once its socket is bound: a row that names the same bind on
        the same host is an earlier replica's (it cannot be serving on this machine any more), or
        a live one's on another machine of the same host name, which writes it again."""
        own = conn.execute(select(control_replicas.c.host, control_replicas.c.bind)
                           .where(control_replicas.c.replica_id == replica_id)).first()
        if own is not None:
            conn.execute(delete(control_replicas).where(and_(
                control_replicas.c.host == own.host, control_replicas.c.bind == own.bind,
                control_replicas.c.replica_id != replica_id)))

    def stopped(self, replica_id: str) -> None:
        with self.store.write() as conn:
            conn.execute(control_replicas.update().where(control_replicas.c.replica_id == replica_id)
                         .values(stopped_at_ms=self.store.now_ms(conn)))
