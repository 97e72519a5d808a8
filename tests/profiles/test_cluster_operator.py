"""A cluster run by an operator, on real processes (issue 18): a worker started before its key is
allowed, a key revoked under running jobs, and two processes presenting one worker's key."""

from __future__ import annotations

import time

import pytest

from actor_harness import wait_until
from cluster_harness import _online, make_cluster
from qlactors.wire.curve_keys import load_public_key

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]


@pytest.fixture
def cluster(tmp_path):
    c = make_cluster(tmp_path, replicas=1)
    yield c
    c.close()


def _statuses(cluster) -> set[str]:
    time.sleep(0.2)  # a poll of the database, not a wait for a timing: paced to spare the machine
    return {status for (status,) in cluster.sql("SELECT status FROM runs")}


def _spawn_worker(cluster, name: str, *, slots: int = 1, state: str | None = None):
    """A worker process, not waited for (its key may not be allowed yet)."""
    config = cluster.worker_config(name, slots=slots, labels=())
    if state is not None:  # a second process with the same key needs a state directory of its own
        (cluster.root / state).mkdir(exist_ok=True)
        config = config.with_name(f"{state}.toml")
        config.write_text(cluster.worker_config(name, slots=slots, labels=()).read_text()
                          .replace(f'state_dir = "state-{name}"', f'state_dir = "{state}"'))
    proc = cluster._spawn(f"worker-{state or name}", ["worker", "--config", str(config)])
    cluster.workers[state or name] = proc
    return proc


def test_a_worker_started_before_its_key_is_allowed_connects_once_it_is(cluster):
    """Refused at the handshake, it connects again with backoff: `worker allow` takes effect
    without a restart. (Beside it a worker never allowed: its refusal names its own key, as the
    replica's `curve_denied` does, and stopped it says it had no session, not a drain.)"""
    cluster.new_key("w1")
    cluster.new_key("stranger")
    worker = _spawn_worker(cluster, "w1")
    stranger = _spawn_worker(cluster, "stranger")
    wait_until(lambda: "event=link_refused" in worker.log() or not worker.alive(), 30, "the refusal")
    assert worker.alive(), worker.log()
    cluster.allow("w1")
    wait_until(lambda: _online(cluster, "w1"), 50, "the worker to register after `worker allow`")
    assert worker.alive()
    log = worker.log()
    assert log.count("event=link_accepted_after_refusal") == 1, log
    cluster.cli("task", "add", "hello", "--", "true")
    run_id = cluster.cli("run", "hello").stdout.decode().strip()
    assert cluster.wait_terminal([run_id], timeout=30)[run_id]["state"] == "succeeded"
    assert cluster.stop(stranger) == 0
    key = load_public_key(cluster.keys / "stranger.key").decode()
    refused = [line for line in stranger.log().splitlines() if "event=link_refused" in line]
    assert refused and f"key={key}" in refused[0] and f"key={key}" in cluster.replicas[0].log()
    assert "event=stopped_without_session" in stranger.log() and "session_drained" not in stranger.log()


def test_a_key_revoked_under_running_jobs_says_so_once_and_allowing_it_again_delivers_them(cluster):
    """Revoked while two jobs run: they go on, their runs wait `running`; the worker says once,
    as an ERROR, that its key was revoked and how many results wait; the replica logs the refused
    worker once a minute, not per frame; `worker allow` again delivers both results."""
    cluster.new_key("w1")
    cluster.allow("w1")
    worker = cluster.start_worker("w1", slots=2)
    cluster.cli("task", "add", "slow", "--max-concurrent", "2", "--", "sh", "-c", "sleep 10; exit 4")
    runs = [cluster.cli("run", "slow").stdout.decode().strip() for _ in range(2)]
    wait_until(lambda: _statuses(cluster) == {"running"}, 40, "both jobs to run")
    cluster.cli("worker", "revoke", "w1")
    wait_until(lambda: "event=worker_key_revoked" in worker.log(), 30, "the worker to learn it was revoked")
    journal_done = lambda: "event=completed_resent" in worker.log()  # noqa: E731 - both receipts wait
    wait_until(journal_done, 40, "the jobs to end and their completions to wait")
    assert _statuses(cluster) == {"running"}
    # `status` and `show` say why the runs are held and what the operator can do (issue 28)
    held = [w for w in cluster.cli_json("status")["unresolved_recoveries"] if w["run_id"] in runs]
    assert len(held) == 2 and all("result held on revoked worker w1" in w["why"] for w in held), held
    assert "unresolved recoveries: 2" in cluster.cli("status").stdout.decode()
    assert "result held on revoked worker w1: `qlactors worker allow w1" in cluster.cli("show", runs[0]).stdout.decode()
    log = worker.log()
    revoked = [line for line in log.splitlines() if "event=worker_key_revoked" in line]
    assert len(revoked) == 1 and " ERROR " in revoked[0] and "running=2" in revoked[0], revoked
    replica = cluster.replicas[0].log()
    assert replica.count("event=frame_refused") == 1, replica
    cluster.allow("w1")
    final = cluster.wait_terminal(runs, timeout=50)
    assert {f["state"] for f in final.values()} == {"failed"}
    assert sorted(cluster.sql("SELECT exit_code FROM run_attempts")) == [(4,), (4,)]


def test_a_second_process_with_the_same_key_is_named_and_exits_1_while_the_first_keeps_its_session(cluster):
    """Two live processes presenting w1's key would take its session from each other every
    heartbeat: the second takeover is caught, the first process takes the session back (noted in
    `workers`), the second is refused at its next Register and exits 1 with the reason. The first
    goes on, and a restart of it still takes its session over at once."""
    import signal

    cluster.new_key("w1")
    cluster.allow("w1")
    first = cluster.start_worker("w1", slots=1)
    second = _spawn_worker(cluster, "w1", state="state-w1-copy")
    assert second.popen.wait(40) == 1, second.log()
    assert "event=register_refused reason=duplicate_worker" in second.log()
    replica = cluster.replicas[0].log()
    assert "event=duplicate_worker worker=w1" in replica and "event=duplicate_worker_refused worker=w1" in replica
    [shown] = [w for w in cluster.cli_json("workers") if w["worker_id"] == "w1"]
    assert (shown["state"], shown["note"]) == ("online (duplicate key)", "duplicate")
    assert first.alive()
    cluster.cli("task", "add", "hello", "--", "true")
    run_id = cluster.cli("run", "hello").stdout.decode().strip()
    assert cluster.wait_terminal([run_id], timeout=30)[run_id]["state"] == "succeeded"
    [(generation,)] = cluster.sql("SELECT max(generation) FROM worker_sessions WHERE worker_id = 'w1'")
    assert cluster.stop(first, signal.SIGKILL) == -signal.SIGKILL
    again = cluster.start_worker("w1", slots=1)  # a restart takes its session over at once (resumed)
    assert again.alive()
    assert cluster.sql("SELECT max(generation) FROM worker_sessions WHERE worker_id = 'w1'") == [(generation,)]
