"""A worker's drain on real processes (SEMANTICS.md §9 Drain, §10 step 1): SIGTERM leaves the
session drained and offline while the job keeps running; the drain grace keeps recovery from
taking the idempotent run past the recovery grace; the restarted worker (past its session lease:
a new generation) re-attests the job, which ends as attempt 1 with its own exit code."""

from __future__ import annotations

import os
import time

import pytest

from actor_harness import wait_until
from cluster_harness import make_cluster

pytestmark = [pytest.mark.postgres, pytest.mark.chaos]  # with the chaos tests: it waits out the grace

SESSION_LEASE_MS, RECOVERY_GRACE_MS = 5_000, 35_000  # the drain grace: its default, 15 min


@pytest.fixture
def cluster(tmp_path):
    c = make_cluster(tmp_path, replicas=1, timings=dict(session_lease_ms=SESSION_LEASE_MS,
                                                        recovery_grace_ms=RECOVERY_GRACE_MS))
    yield c
    c.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_drained_workers_idempotent_job_is_not_recovered_and_its_restart_re_attests_it(cluster, tmp_path):
    cluster.new_key("w1")
    cluster.allow("w1")
    worker = cluster.start_worker("w1", slots=1)
    go = tmp_path / "GO"
    cluster.cli("task", "add", "idem", "--safety", "idempotent", "--retry-on-lost", "--max-attempts", "3", "--",
                "sh", "-c", f"echo begin; while [ ! -e {go} ]; do sleep 0.2; done; echo end; exit 7")
    run_id = cluster.cli("run", "idem").stdout.decode().strip()
    wait_until(lambda: cluster.sql("SELECT status FROM runs WHERE id = %s", run_id)[0][0] == "running", 30,
               "the job to run")
    [(pid, session_id)] = cluster.sql("SELECT pid, session_id FROM run_attempts WHERE run_id = %s", run_id)

    assert cluster.stop(worker) == 0
    stopped_at = time.monotonic()
    assert "event=session_drained" in worker.log()
    [(status, drained_at, ended_at)] = cluster.sql(
        "SELECT status, drained_at_ms, ended_at_ms FROM worker_sessions WHERE session_id = %s", session_id)
    assert status == "offline" and drained_at is not None and ended_at is not None
    [w1] = [w for w in cluster.cli_json("workers") if w["worker_id"] == "w1"]
    assert w1["state"] == "offline (drained)"
    assert _alive(pid)  # the job keeps running

    # Past the session lease and the recovery grace: without the drain grace the run would be
    # lost (its session ended) and retried as attempt 2.
    while time.monotonic() - stopped_at < (SESSION_LEASE_MS + RECOVERY_GRACE_MS) / 1000 + 2:
        time.sleep(1)
    assert cluster.sql("SELECT number, status FROM run_attempts WHERE run_id = %s", run_id) == [
        (1, "running")]
    assert cluster.sql("SELECT status FROM runs WHERE id = %s", run_id) == [("running",)]
    waiting = {w["run_id"]: w for w in cluster.cli_json("status")["unresolved_recoveries"]}
    assert "drained its session" in waiting[run_id]["why"], waiting
    assert _alive(pid)

    again = cluster.start_worker("w1", slots=1)  # past its session lease: a new generation
    wait_until(lambda: "event=rebound" in again.log(), 30, "the job re-attested and its lease re-bound")
    go.touch()
    final = cluster.wait_terminal([run_id], timeout=30)[run_id]
    assert final["state"] == "failed"
    assert cluster.sql("SELECT number, exit_code FROM run_attempts WHERE run_id = %s", run_id) == [(1, 7)]
    assert sorted(cluster.sql("SELECT generation FROM worker_sessions WHERE worker_id = 'w1'")) == [(1,), (2,)]
    assert "resumed=False" in "".join(r.log() for r in cluster.replicas)
    wait_until(lambda: cluster.cli("logs", run_id).stdout == b"begin\nend\n", 30, "the whole log")


def test_a_worker_stopped_while_no_replica_answers_exits_within_its_budget_and_its_session_expires(cluster):
    cluster.new_key("w1")
    cluster.allow("w1")
    worker = cluster.start_worker("w1", slots=1, extra="shutdown_drain_ms = 2000\n")
    [(session_id,)] = cluster.sql("SELECT session_id FROM worker_sessions WHERE worker_id = 'w1'")
    [replica] = cluster.replicas
    assert cluster.stop(replica) == 0
    began = time.monotonic()
    assert cluster.stop(worker, timeout=15) == 0
    assert time.monotonic() - began < 5  # the drain waited 1 s (half the budget), not for a replica
    assert "event=session_not_left reason=no_answer" in worker.log()
    # Nothing reached the database: the session is not drained; it expires at its lease.
    assert cluster.sql("SELECT status, drained_at_ms FROM worker_sessions WHERE session_id = %s",
                       session_id) == [("online", None)]
