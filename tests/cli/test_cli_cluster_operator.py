"""What an operator reads on a cluster database (real PostgreSQL, a real `qlactors` subprocess
each; issue 18 items 10 and 17): free slots counted from the leases, the clock skew from the
Register, no session lease for an ended session, and why a run waits for a worker's labels."""

from __future__ import annotations

import json
import secrets

import pytest
from sqlalchemy import insert

from qlactors.domain.receipt import token_hash
from qlactors.store.dispatch.dispatch import Dispatch
from qlactors.store.schema import control_replicas
from cli_cluster_harness import Cluster

pytestmark = pytest.mark.postgres


@pytest.fixture
def cluster(pg_schema_url, tmp_path):
    c = Cluster(pg_schema_url, tmp_path)
    yield c
    c.close()


def _offer(cluster, session, task: str) -> str:
    """A run of `task` offered to `session` (a lease held; no heartbeat since)."""
    run_id = cluster.ok("run", task).stdout.strip()
    offer = Dispatch.open(cluster.repo.store).offers.one(session.worker_id, session.session_id, session.generation,
                                               secrets.token_hex(8), token_hash(secrets.token_urlsafe(32)),
                                               log_cap_bytes=1 << 20)
    assert offer is not None and offer.run_id == run_id
    return run_id


def test_free_slots_count_the_leases_the_session_holds_not_its_last_heartbeat(cluster):
    cluster.ok("task", "add", "t1", "--max-concurrent", "8", "--", "true")
    session = cluster.session("w1", capacity=4)
    for _ in range(3):
        _offer(cluster, session, "t1")
    [w1] = json.loads(cluster.ok("workers", "--json").stdout)
    assert (w1["capacity"], w1["free_slots"]) == (4, 1)
    assert "1/4" in cluster.ok("workers").stdout
    [w1] = json.loads(cluster.ql("status", "--json").stdout)["workers"]  # exit 3: no replica is up
    assert w1["free_slots"] == 1


def test_the_clock_skew_is_shown_from_the_register_and_an_ended_session_shows_no_lease(cluster):
    dispatch = Dispatch.open(cluster.repo.store)
    with cluster.repo.store.read() as conn:
        now = cluster.repo.store.now_ms(conn)
    session = dispatch.sessions.register("w1", 2, session_lease_ms=45_000, worker_clock_ms=now - 60_000)
    [w1] = json.loads(cluster.ok("workers", "--json").stdout)
    assert w1["clock_skew_ms"] is not None and w1["clock_skew_ms"] >= 60_000  # no heartbeat yet
    row = cluster.ok("workers").stdout.splitlines()[1]
    assert f"+{w1['clock_skew_ms']}ms" in row
    assert dispatch.sessions.end("w1", session.session_id, 1, status="offline").result == "applied"
    header, row = cluster.ok("workers").stdout.splitlines()
    lease_at = header.index("SESSION LEASE")
    assert "offline (drained)" in row and row[lease_at:].split()[0] == "-"


def _up_replica(cluster) -> None:
    """A replica row with a fresh heartbeat (up for `status` and `run --wait`, 60 s ticks)."""
    cluster.config.write_text(cluster.config.read_text() + "[control]\ncadence_tick_ms = 60000\n")
    with cluster.repo.store.write() as conn:
        now = cluster.repo.store.now_ms(conn)
        conn.execute(insert(control_replicas).values(
            replica_id=secrets.token_hex(8), host="ctl-1", pid=4242, bind="tcp://127.0.0.1:5710",
            started_at_ms=now, heartbeat_at_ms=now, stopped_at_ms=None, db_errors=0))


def test_labels_no_worker_has_are_warned_and_a_queued_run_says_why_it_waits(cluster):
    added = cluster.ql("task", "add", "g", "--require-label", "gpu", "--", "true")
    assert added.returncode == 0 and added.stdout == "task g added (revision 1)\n"
    assert added.stderr == ("qlactors: warning: no known worker has label(s) gpu (known: none): runs of g "
                            "wait until a worker with them registers (`labels` in its worker.toml)\n")
    cluster.session("w1", labels=["linux"])
    updated = cluster.ql("task", "update", "g", "--require-label", "gpu", "--require-label", "big")
    assert updated.returncode == 0 and "no known worker has label(s) gpu, big (known: w1 [linux])" in updated.stderr
    assert cluster.ql("task", "update", "g", "--require-label", "linux").stderr == ""
    cluster.ok("task", "update", "g", "--require-label", "gpu")

    _up_replica(cluster)
    waited = cluster.ql("run", "g", "--wait", "--wait-timeout", "2.5")
    assert waited.returncode == 75, waited.stderr
    run_id = waited.stdout.strip()
    reason = "no online worker has label(s) gpu (online: w1 [linux])"
    said = [line for line in waited.stderr.splitlines() if "stays queued" in line]
    assert said == [f"qlactors: run {run_id} stays queued: {reason}; still waiting"]
    assert f"\nwaiting: {reason}\n" in cluster.ok("show", run_id).stdout
    assert json.loads(cluster.ok("show", run_id, "--json").stdout)["waiting"] == reason
    [listed] = json.loads(cluster.ok("status", "--json").stdout)["active_run_list"]
    assert (listed["run_id"], listed["state"], listed["waiting"], listed["labels"]) == (
        run_id, "queued", reason, ["gpu"])
    [row] = [line for line in cluster.ok("status").stdout.splitlines() if line.startswith(f"  {run_id}")]
    assert row.endswith(reason)
    cluster.session("w2", labels=["gpu"])  # now one qualifies: nothing more to say
    assert json.loads(cluster.ok("show", run_id, "--json").stdout)["waiting"] is None
