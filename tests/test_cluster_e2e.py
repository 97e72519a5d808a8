"""The cluster on real processes: control replicas on the real PostgreSQL, workers over tcp with
real CURVE keys, jobs as real processes; the CLI reads results from the control side."""

from __future__ import annotations

import time

import pytest

from cluster_harness import make_cluster, wait_for

pytestmark = pytest.mark.postgres


@pytest.fixture
def cluster(tmp_path):
    c = make_cluster(tmp_path, replicas=1)
    yield c
    c.close()


def _run(cluster, task: str) -> str:
    return cluster.cli("run", task).stdout.decode().strip()


def test_a_job_runs_on_a_worker_and_its_exit_code_and_log_are_read_from_the_control_side(cluster):
    cluster.new_key("w1")
    cluster.allow("w1")
    cluster.start_worker("w1", slots=2)
    cluster.cli("task", "add", "hello", "--", "sh", "-c", "printf 'out\\n'; printf 'err\\n' >&2; exit 3")
    run_id = _run(cluster, "hello")
    final = cluster.wait_terminal([run_id], timeout=60)[run_id]
    assert final["state"] == "failed"
    shown = cluster.show(run_id)
    assert [a["exit_code"] for a in shown["attempts"]] == [3]
    # The log is shipped in chunks; `logs` prints the job's bytes exactly once they are in.
    wait_for(lambda: cluster.cli("logs", run_id).stdout == b"out\nerr\n", 30, "the shipped log")


def test_an_unknown_key_cannot_register_and_runs_wait(cluster):
    cluster.new_key("stranger")
    cluster.cli("task", "add", "t", "--", "true")
    run_id = _run(cluster, "t")
    proc = cluster._spawn("worker-stranger", ["worker", "--config", str(
        cluster.worker_config("stranger", slots=1, labels=()))])
    cluster.workers["stranger"] = proc
    try:
        time.sleep(3)  # what it could do in that time: connect, register, pull
        assert proc.alive()  # it keeps trying: the operator may still allow its key
        assert all(w["worker_id"] != "stranger" for w in cluster.cli_json("workers"))
        assert cluster.show(run_id)["state"] == "queued"
    finally:
        cluster.stop(proc)


def test_two_replicas_two_workers_run_every_job_exactly_once(tmp_path):
    c = make_cluster(tmp_path, replicas=2)
    try:
        for name in ("w1", "w2"):
            c.new_key(name)
            c.allow(name)
            c.start_worker(name, slots=4)
        ledger = tmp_path / "ledger"
        c.cli("task", "add", "mark", "--max-concurrent", "6", "--",
              "sh", "-c", f"echo ran >> {ledger}; echo done")
        run_ids = [_run(c, "mark") for _ in range(60)]
        states = c.wait_terminal(run_ids, timeout=240)
        assert {s["state"] for s in states.values()} == {"succeeded"}
        # One line per run: every run terminal and succeeded, none ran twice.
        assert ledger.read_text().count("ran\n") == len(run_ids)
    finally:
        c.close()
