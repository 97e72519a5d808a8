"""What an operator reads about a running cluster, on real processes (issue 18 items 3, 7, 17):
which worker, session and process run each attempt; free slots that follow the leases at once;
the clock skew from the Register; one `status` row per replica bind across restarts."""

from __future__ import annotations

import json
import signal
import socket

import pytest
from psycopg import connect

from actor_harness import wait_until
from cluster_harness import make_cluster

pytestmark = pytest.mark.postgres

# A heartbeat far longer than the test's steps: what the worker's heartbeat would report (its
# free slots, its clock) is not what `workers` shows between a Register and the first heartbeat.
SLOW_HEARTBEAT = dict(heartbeat_ms=20_000, session_lease_ms=60_000, run_lease_ms=45_000,
                      recovery_grace_ms=120_000)


@pytest.fixture
def cluster(tmp_path):
    c = make_cluster(tmp_path, replicas=1, timings=SLOW_HEARTBEAT)
    yield c
    c.close()


def _attempts(cluster, run_ids: list[str]) -> dict[str, tuple]:
    """run id -> (status, worker, generation, pid) of its attempt 1, from the database."""
    rows = cluster.sql("SELECT run_id, status, worker_id, session_generation, pid FROM run_attempts "
                       "WHERE run_id = ANY(%s) AND number = 1", run_ids)
    return {r[0]: r[1:] for r in rows}


@pytest.mark.timeout(300)  # a hang guard; it asserts no speed
def test_show_runs_status_and_workers_say_where_each_attempt_runs_as_soon_as_it_starts(cluster):
    cluster.new_key("w1")
    cluster.allow("w1")
    cluster.start_worker("w1", slots=4)
    [w1] = cluster.cli_json("workers")
    assert w1["clock_skew_ms"] is not None  # measured at its Register, before any heartbeat

    cluster.cli("task", "add", "sleepy", "--max-concurrent", "3", "--", "sleep", "120")
    run_ids = [cluster.cli("run", "sleepy").stdout.decode().strip() for _ in range(3)]
    wait_until(lambda: all(a[0] == "running" and a[3] is not None for a in _attempts(cluster, run_ids).values())
               and len(_attempts(cluster, run_ids)) == 3, 60, "three running attempts")
    facts = _attempts(cluster, run_ids)
    [w1] = cluster.cli_json("workers")
    assert (w1["capacity"], w1["free_slots"]) == (4, 1)  # its leases, not its last heartbeat

    shown = cluster.show(run_ids[0])
    [attempt] = shown["attempts"]
    _status, worker, generation, pid = facts[run_ids[0]]
    assert (attempt["worker_id"], attempt["session_generation"], attempt["pid"]) == (worker, generation, pid)
    assert (worker, generation) == ("w1", w1["generation"])
    assert attempt["host"] == socket.gethostname()  # the job's boot id is this host's
    assert f"w1 (gen {generation}, pid {pid})" in cluster.cli("show", run_ids[0]).stdout.decode()
    rows = {line.split()[0]: line for line in cluster.cli("runs").stdout.decode().splitlines()[1:]}
    for run_id, (_s, _w, gen, run_pid) in facts.items():
        assert rows[run_id].endswith(f"w1 (gen {gen}, pid {run_pid})")

    status = cluster.cli("status")
    listed = {r["run_id"]: r for r in cluster.cli_json("status")["active_run_list"]}
    assert {k: (r["worker_id"], r["pid"], r["waiting"]) for k, r in listed.items()} == {
        k: ("w1", f[3], None) for k, f in facts.items()}
    text = status.stdout.decode()
    for run_id, (_s, _w, gen, run_pid) in facts.items():
        assert f"w1 (gen {gen}, pid {run_pid})" in next(line for line in text.splitlines() if run_id in line)


def _replica_rows(cluster, *extra: str) -> list[dict]:
    """`status --json`'s replicas (it exits 3 while none is up: a restarted replica's log already
    holds its predecessor's `control_started`, so the harness does not wait for its start)."""
    return json.loads(cluster.cli("status", "--json", *extra, check=False).stdout)["replicas"]


@pytest.mark.timeout(300)  # a hang guard; it asserts no speed
def test_a_replica_restarted_on_the_same_bind_replaces_its_row_and_history_leaves_the_count(cluster):
    port = cluster.ports[0]
    first = cluster.replicas[0]
    assert cluster.stop(first) == 0  # SIGTERM: its row says stopped
    second = cluster.start_replica(port)
    wait_until(lambda: [r["up"] for r in _replica_rows(cluster, "--all")] == [True], 60,
               "the restarted replica's row alone")
    cluster.stop(second, signal.SIGKILL)  # its row stays, as if up, until its heartbeat ages
    cluster.start_replica(port)
    wait_until(lambda: [(r["up"], r["pid"]) for r in _replica_rows(cluster, "--all")]
               == [(True, cluster.replicas[-1].popen.pid)], 60, "the third replica's row alone")

    # One that fell silent two days ago elsewhere (its host died) and one stopped: history.
    with connect(cluster.database_url.replace("+psycopg", "")) as conn:
        for name, stopped in (("gone", None), ("done", "now")):
            conn.execute(
                "INSERT INTO control_replicas (replica_id, host, pid, bind, started_at_ms, heartbeat_at_ms, "
                "stopped_at_ms, db_errors) SELECT %s, 'old-host', 1, 'tcp://10.0.0.9:5710', t - 172800000, "
                "t - 172800000, CASE WHEN %s::text IS NULL THEN NULL ELSE t END, 0 "
                "FROM (SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint AS t) now",
                (name, stopped))
    text = cluster.cli("status").stdout.decode()
    assert "cluster: 1 of 1 replica(s) up" in text
    assert "(2 stopped or long-silent not counted: `qlactors status --all`)" in text
    assert len(_replica_rows(cluster)) == 1 and len(_replica_rows(cluster, "--all")) == 3
