"""A command run while a control replica migrates the cluster database (or is about to create its
schema) waits for it, saying so once on stderr, instead of refusing the database: real replica
processes on a fresh PostgreSQL database, real `qlactors` commands (issue 18 item 13)."""

from __future__ import annotations

import subprocess
import threading
import uuid

import psycopg
import pytest

from actor_harness import wait_until
from cluster_harness import DEFAULT_TIMINGS, QLACTORS, Cluster, free_port
from conftest import PG_URL, _pg_admin_conninfo, _require_postgres
from qlactors.store.migrations import MIGRATE_LOCK, latest_version

pytestmark = pytest.mark.postgres


@pytest.fixture
def fresh(tmp_path):
    """A cluster on a brand-new database (no schema), its control key and one replica's config
    written; no replica started. Every process it starts is stopped by its PID, the database dropped."""
    _require_postgres()
    name = f"qlt_migwait_{uuid.uuid4().hex[:12]}"
    admin = _pg_admin_conninfo()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_URL.split("?", 1)[0].rsplit("/", 1)[0]
    # Database timeouts long enough for a replica to wait on the migration lock this test holds.
    timings = {**DEFAULT_TIMINGS, "heartbeat_ms": 10_000, "session_lease_ms": 45_000,
               "run_lease_ms": 30_000, "recovery_grace_ms": 120_000, "db_timeout_ms": 9_000}
    cluster = Cluster(root=tmp_path, database_url=f"{base}/{name}", admin_db=name, timings=timings,
                      admin_conninfo=admin)
    cluster.keys.mkdir()
    cluster.new_key("control")
    cluster.new_key("w1")
    cluster.ports = [free_port()]
    cluster.control_config(cluster.ports[0])
    try:
        yield cluster
    finally:
        cluster.close()


def start_replica_now(cluster: Cluster):
    """`qlactors control --config ... &`: started, not waited for."""
    port = cluster.ports[0]
    proc = cluster._spawn(f"control-{port}", ["control", "--config", str(cluster.root / f"control-{port}.toml")])
    cluster.replicas.append(proc)
    return proc


def test_worker_allow_right_after_starting_the_first_replica_waits_for_its_schema(fresh):
    replica = start_replica_now(fresh)
    done = fresh.cli("worker", "allow", "w1", str(fresh.keys / "w1.key"), check=False)
    assert done.returncode == 0, done.stderr
    assert b"worker w1 allowed" in done.stdout
    notices = done.stderr.decode().splitlines()
    assert len(notices) <= 1, notices  # said once, if it had to wait at all
    wait_until(lambda: "event=control_started" in replica.log() or not replica.alive(), 60, "the replica")
    assert f"event=schema_migrated from=0 to={latest_version('postgresql')}" in replica.log()


def test_a_command_waits_while_a_replica_holds_the_migration_lock(fresh):
    """Deterministic: the test holds the migration lock (as a replica migrating slowly would), the
    command is started, a replica queues on the lock; only then is the lock let go."""
    holder = psycopg.connect(fresh.database_url.replace("+psycopg", ""))
    try:
        holder.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (MIGRATE_LOCK,))
        command = subprocess.Popen([*QLACTORS, "--config", str(fresh.cli_config), "worker", "allow", "w1",
                                    str(fresh.keys / "w1.key")], cwd=fresh.root, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        try:
            replica = start_replica_now(fresh)
            wait_until(lambda: fresh.sql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT "
                                         "granted AND database = (SELECT oid FROM pg_database WHERE "
                                         "datname = current_database())")[0][0] == 1 or not replica.alive(),
                       30, "the replica to queue on the migration lock")
            assert replica.alive(), replica.log()
            # The command says it waits before the lock goes (a still-starting command would not
            # have seen the lock at all).
            said: list[str] = []
            threading.Thread(target=lambda: said.append(command.stderr.readline()), daemon=True).start()
            wait_until(lambda: said or command.poll() is not None, 30, "the command to say it waits")
            assert command.poll() is None and said, command.communicate()  # still waiting, not refused
        finally:
            holder.rollback()  # the lock goes; the queued replica takes it and migrates
        out, rest = command.communicate(timeout=60)
        err = said[0] + rest
    finally:
        holder.close()
    assert command.returncode == 0, err
    assert "worker w1 allowed" in out
    assert err.splitlines() == [f"qlactors: the cluster database {fresh.database_url} is being migrated by a "
                                "control replica: waiting up to 10 s"]
    wait_until(lambda: "event=control_started" in replica.log() or not replica.alive(), 60, "the replica")
    assert f"event=schema_migrated from=0 to={latest_version('postgresql')}" in replica.log()


def test_a_command_still_waiting_on_the_migration_lock_after_its_wait_says_so_and_exits_1(fresh):
    """The lock held past the 10 s wait (a replica migrating slowly): the command is refused as
    still being migrated, not as a database without a schema to start a replica for."""
    holder = psycopg.connect(fresh.database_url.replace("+psycopg", ""))
    try:
        holder.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (MIGRATE_LOCK,))
        done = subprocess.run([*QLACTORS, "--config", str(fresh.cli_config), "worker", "allow", "w1",
                               str(fresh.keys / "w1.key")], cwd=fresh.root, capture_output=True, text=True,
                              timeout=60)
    finally:
        holder.rollback()
        holder.close()
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"qlactors: the cluster database {fresh.database_url} (from --config {fresh.cli_config}) is still being "
        "migrated by a control replica after 10 s; nothing was written: try again")
    assert "Traceback" not in done.stderr and "no qlactors schema" not in done.stderr
