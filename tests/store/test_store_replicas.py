"""A control replica's row (store/admin/replicas.py): its first heartbeat replaces the rows of earlier
replicas on its host name and bind, stopped or killed; a live replica whose row was deleted (two
machines can share a host name) writes it again at its next heartbeat. On SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import select

from qlactors.store.health import ErrorTally
from qlactors.store.admin.replicas import Replicas
from qlactors.store.schema import control_replicas

BIND = "tcp://0.0.0.0:5710"
QUIET = ErrorTally(0, None, None)


def _ids(repo) -> set[str]:
    with repo.store.read() as conn:
        return set(conn.execute(select(control_replicas.c.replica_id)).scalars())


def test_a_first_heartbeat_replaces_the_rows_of_its_host_and_bind_and_a_live_one_comes_back(repo):
    replicas = Replicas(repo.store)
    stopped = replicas.register("ctl", 1, BIND)
    replicas.stopped(stopped)
    killed = replicas.register("ctl", 2, BIND)
    replicas.heartbeat(killed, QUIET)
    elsewhere = replicas.register("ctl", 3, "tcp://0.0.0.0:5711")
    live = Replicas(repo.store)  # another machine, the same host name
    other = live.register("ctl", 4, BIND)
    live.heartbeat(other, QUIET)
    new = replicas.register("ctl", 5, BIND)
    replicas.heartbeat(new, QUIET)
    assert _ids(repo) == {elsewhere, new}
    live.heartbeat(other, QUIET)  # it serves: its row is back
    assert _ids(repo) == {elsewhere, new, other}


def test_a_replica_whose_row_was_deleted_writes_it_again_with_its_next_heartbeat(repo):
    replicas = Replicas(repo.store)
    replica_id = replicas.register("ctl", 7, BIND)
    replicas.heartbeat(replica_id, QUIET)
    with repo.store.write() as conn:
        conn.execute(control_replicas.delete())
    replicas.heartbeat(replica_id, ErrorTally(2, "reset", 5))
    with repo.store.read() as conn:
        row = conn.execute(select(control_replicas)).one()
    assert (row.replica_id, row.host, row.pid, row.bind, row.stopped_at_ms, row.db_errors) == (
        replica_id, "ctl", 7, BIND, None, 2)
