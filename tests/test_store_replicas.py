"""A control replica's row (store/replicas.py): its first heartbeat replaces the rows of earlier
replicas on its host name and bind, stopped or silent past the up window, never a live one's (two
machines can share a host name); a replica whose row was deleted all the same writes it again.
On SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import select, update

from qlactors.store.health import ErrorTally
from qlactors.store.replicas import Replicas
from qlactors.store.schema import control_replicas

BIND = "tcp://0.0.0.0:5710"
TICK_MS = 1_000
QUIET = ErrorTally(0, None, None)


def _ids(repo) -> set[str]:
    with repo.store.read() as conn:
        return set(conn.execute(select(control_replicas.c.replica_id)).scalars())


def _age(repo, replica_id: str, by_ms: int) -> None:
    with repo.store.write() as conn:
        conn.execute(update(control_replicas).where(control_replicas.c.replica_id == replica_id)
                     .values(heartbeat_at_ms=control_replicas.c.heartbeat_at_ms - by_ms))


def test_a_first_heartbeat_replaces_stopped_and_silent_rows_of_its_host_and_bind_but_not_a_live_one(repo):
    replicas = Replicas(repo.store, cadence_tick_ms=TICK_MS)
    stopped = replicas.register("ctl", 1, BIND)
    replicas.stopped(stopped)
    silent = replicas.register("ctl", 2, BIND)
    _age(repo, silent, replicas.up_window_ms + 1_000)
    live = Replicas(repo.store, cadence_tick_ms=TICK_MS)  # another machine, the same host name
    other = live.register("ctl", 3, BIND)
    live.heartbeat(other, QUIET)
    new = replicas.register("ctl", 4, BIND)
    replicas.heartbeat(new, QUIET)
    assert _ids(repo) == {other, new}


def test_a_replica_whose_row_was_deleted_writes_it_again_with_its_next_heartbeat(repo):
    replicas = Replicas(repo.store, cadence_tick_ms=TICK_MS)
    replica_id = replicas.register("ctl", 7, BIND)
    replicas.heartbeat(replica_id, QUIET)
    with repo.store.write() as conn:
        conn.execute(control_replicas.delete())
    replicas.heartbeat(replica_id, ErrorTally(2, "reset", 5))
    with repo.store.read() as conn:
        row = conn.execute(select(control_replicas)).one()
    assert (row.replica_id, row.host, row.pid, row.bind, row.stopped_at_ms, row.db_errors) == (
        replica_id, "ctl", 7, BIND, None, 2)
