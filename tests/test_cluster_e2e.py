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


def _leases(cluster, run_id: str) -> list[tuple]:
    return cluster.sql("SELECT lease_generation, status, offer_id FROM run_dispatch_leases "
                       "WHERE run_id = %s ORDER BY lease_generation", run_id)


def test_a_pull_whose_answer_was_dropped_is_repeated_and_gets_the_same_offer(tmp_path, monkeypatch):
    monkeypatch.setenv("QLACTORS_FAULT", "gateway_drop_offers")  # the replica drops its first Offers
    c = make_cluster(tmp_path, replicas=1)
    monkeypatch.delenv("QLACTORS_FAULT")
    try:
        c.new_key("w1")
        c.allow("w1")
        c.cli("task", "add", "once", "--", "true")
        run_id = _run(c, "once")
        c.start_worker("w1", slots=1)
        assert c.wait_terminal([run_id], timeout=60)[run_id]["state"] == "succeeded"
        assert "event=fault_offers_dropped" in c.replicas[0].log()
        leases = _leases(c, run_id)
        assert len(leases) == 1 and leases[0][1] == "completed", leases  # the same offer: one lease
    finally:
        c.close()


def test_a_task_requiring_a_label_runs_only_on_the_worker_that_has_it(tmp_path):
    c = make_cluster(tmp_path, replicas=1)
    try:
        for name, labels in (("plain", ()), ("gpu", ("gpu",))):
            c.new_key(name)
            c.allow(name)
            c.start_worker(name, slots=2, labels=labels)
        c.cli("task", "add", "train", "--require-label", "gpu", "--max-concurrent", "4", "--", "true")
        run_ids = [_run(c, "train") for _ in range(8)]
        c.wait_terminal(run_ids, timeout=120)
        workers = {a["worker_id"] for r in run_ids for a in c.show(r)["attempts"]}
        assert workers == {"gpu"}
    finally:
        c.close()


def test_a_big_output_is_read_back_exactly_up_to_the_cap(cluster):
    """10 MiB of output with a 4 MiB cap: `logs` on the control side prints exactly the kept bytes."""
    cluster.new_key("w1")
    cluster.allow("w1")
    cluster.start_worker("w1", slots=1, extra=f"log_cap_bytes = {4 * 1024 * 1024}\n")
    script = ("import sys\nfor i in range(10 * 1024):\n"
              "    sys.stdout.buffer.write(((b'%07d' % i) * 147)[:1023] + b'\\n')\n")
    cluster.cli("task", "add", "big", "--", "python3", "-c", script)
    run_id = _run(cluster, "big")
    assert cluster.wait_terminal([run_id], timeout=120)[run_id]["state"] == "succeeded"
    expected = b"".join(((b"%07d" % i) * 147)[:1023] + b"\n" for i in range(10 * 1024))[:4 * 1024 * 1024]
    # The worker ships the kept bytes in chunks; `-f` ends at the final offset.
    out = cluster.cli("logs", run_id, "-f", timeout=120).stdout
    assert len(out) == len(expected) and out == expected
    attempt = cluster.show(run_id)["attempts"][0]
    assert attempt["log_dropped_bytes"] == 10 * 1024 * 1024 - 4 * 1024 * 1024


def test_cron_on_two_replicas_admits_each_occurrence_once(tmp_path):
    c = make_cluster(tmp_path, replicas=2)
    try:
        c.new_key("w1")
        c.allow("w1")
        c.start_worker("w1", slots=4)
        c.cli("task", "add", "tick", "--cron", "* * * * * *", "--tz", "UTC", "--max-concurrent", "4",
              "--", "true")
        time.sleep(20)
        c.cli("task", "disable", "tick")
        time.sleep(1)  # a cycle that began before the disable commits nothing after it
        runs = c.sql("SELECT scheduled_for_ms FROM runs WHERE trigger_type = 'cron' ORDER BY 1")
        times = [r[0] for r in runs]
        assert len(times) == len(set(times)), "an occurrence was admitted twice"
        assert len(times) >= 18
        events = c.sql("SELECT type, scheduled_for_ms, occurrences FROM trigger_events")
        missed = sum(n for kind, _at, n in events if kind == "missed")
        skipped = sum(n for kind, _at, n in events if kind == "skipped")
        # Every second from the first admitted occurrence to the last is a run or counted.
        span = (times[-1] - times[0]) // 1000 + 1
        assert len(times) + missed + skipped >= span
    finally:
        c.close()


def test_a_second_worker_on_the_same_state_directory_refuses_to_start(cluster):
    cluster.new_key("w1")
    cluster.allow("w1")
    cluster.start_worker("w1", slots=1)
    import subprocess
    from cluster_harness import QLACTORS

    second = subprocess.run([*QLACTORS, "worker", "--config", str(cluster.root / "w1.toml")],
                            cwd=cluster.root, capture_output=True, timeout=30)
    assert second.returncode != 0
    assert b"in use by another qlactors worker" in second.stderr
    assert cluster.workers["w1"].alive()


def test_a_revoked_key_is_not_served_any_more(cluster):
    cluster.new_key("w1")
    cluster.allow("w1")
    cluster.start_worker("w1", slots=1)
    cluster.cli("worker", "revoke", "w1")
    cluster.cli("task", "add", "after", "--", "true")
    run_id = _run(cluster, "after")
    time.sleep(4)  # several heartbeats and cycles: the allow-list cache is refreshed every cycle
    assert cluster.show(run_id)["state"] == "queued"
    assert "event=report_refused" in cluster.replicas[0].log() or "revoked" in cluster.replicas[0].log() \
        or "unknown or revoked" in cluster.workers["w1"].log()
