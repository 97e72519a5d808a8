"""Chaos on a real cluster (issue 11): a worker killed or frozen, a replica killed, the database
restarted, while real jobs run. Each job writes a token of its own to a ledger file and to its
log, so "exactly once" is checked per run: every run succeeded in one attempt, its shipped log
is exactly its own token, and each token is in the ledger once (none lost, none ran twice).

Every process is stopped by its PID (`Cluster.close`, `PrivatePostgres.close`); the test that
restarts PostgreSQL uses the private server of the run (`private_pg`), never the shared one."""

from __future__ import annotations

import signal
import time

import pytest

from actor_harness import wait_until
from cluster_harness import make_cluster
from chaos_steps import LOG, _task, _request, _count, _assert_each_ran_once, _assert_no_actor_failed, _running

pytestmark = [pytest.mark.postgres, pytest.mark.chaos]


def _worker(c, name: str, slots: int):
    c.new_key(name)
    c.allow(name)
    return c.start_worker(name, slots=slots)


@pytest.mark.timeout(150)
def test_a_worker_killed_with_20_running_jobs_and_started_again_finishes_each_exactly_once(tmp_path):
    """kill -9 of the worker (its process only) with 20 jobs running: the 10 quick ones finish
    while it is down and complete from their receipts; the 10 slow ones are re-bound by the
    restarted worker and complete normally. No stop, no attempt 2."""
    c = make_cluster(tmp_path, timings=dict(session_lease_ms=15_000, recovery_grace_ms=45_000))
    try:
        worker = _worker(c, "w1", slots=20)
        ledger = tmp_path / "ledger"
        # 3 s: the 20 launches of a loaded machine take a second or two, and all 20 must be
        # seen running at once before the kill.
        _task(c, "quick", ledger, sleep=3, max_concurrent=10)
        _task(c, "slow", ledger, sleep=10, max_concurrent=10)
        quick, slow = _request(c, "quick", 10), _request(c, "slow", 10)
        every = quick + slow
        wait_until(lambda: _running(c, every) == 20, 60, "20 jobs running")
        assert c.stop(worker, signal.SIGKILL) == -signal.SIGKILL
        # The quick jobs end while their worker is dead: their receipts wait on its disk.
        wait_until(lambda: ledger.exists() and len(ledger.read_text().splitlines()) == 10, 30,
                   "the quick jobs to finish while the worker is down")
        assert _running(c, quick) == 10  # nothing completed them: the worker is gone
        again = c.start_worker("w1", slots=20)
        _assert_each_ran_once(c, every, ledger, timeout=90)
        log = again.log()
        assert log.count("event=rebound") == 10, log[-4000:]
        for run_id in slow:
            assert f"event=adopted run={run_id}" in log
        assert "event=stop_term" not in log and "event=lease_fenced" not in log
        for run_id in every[:3] + slow[-2:]:  # the CLI reads them back whole
            assert LOG.fullmatch(c.cli("logs", run_id).stdout)
        _assert_no_actor_failed(c)
    finally:
        c.close()


@pytest.mark.timeout(240)
def test_a_worker_frozen_past_its_run_leases_within_its_session_lease_carries_on(tmp_path):
    """SIGSTOP of the worker for 35 s (past the default 30 s run lease, within the default 45 s
    session lease: heartbeat 5 s, so its last heartbeat was at most 5 s before), then SIGCONT:
    the jobs that ended while it was frozen complete from their receipts, the others' expired run
    leases are renewed; every job completes normally, none is stopped, no attempt 2."""
    c = make_cluster(tmp_path, timings=dict(heartbeat_ms=5_000, run_lease_ms=30_000, session_lease_ms=45_000,
                                            recovery_grace_ms=75_000))
    try:
        worker = _worker(c, "w1", slots=10)
        ledger = tmp_path / "ledger"
        _task(c, "quick", ledger, sleep=2, max_concurrent=5)
        _task(c, "slow", ledger, sleep=40, max_concurrent=5)
        quick, slow = _request(c, "quick", 5), _request(c, "slow", 5)
        every = quick + slow
        wait_until(lambda: _running(c, every) == 10, 60, "10 jobs running")
        worker.popen.send_signal(signal.SIGSTOP)
        try:
            time.sleep(35)
            expired = _count(c, "SELECT count(*) FROM run_attempts WHERE run_id = ANY(%s) "
                                "AND lease_expires_at_ms < (extract(epoch FROM clock_timestamp()) * 1000)",
                             every)
            assert expired == 10  # the frozen worker renewed nothing: every run lease is past
        finally:
            worker.popen.send_signal(signal.SIGCONT)
        _assert_each_ran_once(c, every, ledger, timeout=90)
        assert worker.alive()
        log = worker.log()
        assert "event=stop_term" not in log and "event=lease_fenced" not in log, log[-4000:]
        assert c.sql("SELECT count(*) FROM worker_sessions WHERE worker_id = 'w1'") == [(1,)]
        _assert_no_actor_failed(c)
    finally:
        c.close()


@pytest.mark.timeout(240)
def test_a_replica_killed_during_300_runs_and_a_cron_the_other_carries_on(tmp_path):
    """kill -9 of the replica serving the worker, a third of the way through 300 runs while a
    per-second cron fires: the worker fails over, the other replica carries on; every run
    terminal and ran once, and every cron second is a run or counted as missed/skipped. (It
    found that an Activate sent just before the kill was lost: the link takes any later frame of
    a replica as the answer to its earlier requests; the worker now repeats it.)"""
    c = make_cluster(tmp_path, replicas=2)
    try:
        _worker(c, "w1", slots=8)
        ledger = tmp_path / "ledger"
        _task(c, "short", ledger, sleep=0, max_concurrent=6)
        c.cli("task", "add", "tick", "--cron", "* * * * * *", "--tz", "UTC", "--max-concurrent", "2",
              "--", "true")
        runs = _request(c, "short", 300)
        serving = next(r for r in c.replicas if "event=session_open" in r.log())
        other = next(r for r in c.replicas if r is not serving)
        wait_until(lambda: _count(c, "SELECT count(*) FROM runs WHERE id = ANY(%s) AND status = 'succeeded'",
                                  runs) >= 100, 120, "a third of the runs done")
        assert c.stop(serving, signal.SIGKILL) == -signal.SIGKILL
        killed_at = time.monotonic()
        # An Activate the killed replica never committed is sent again by the worker
        # (executor_session._repeat_activates): no run stays dispatching.
        _assert_each_ran_once(c, runs, ledger, timeout=90)
        time.sleep(max(0.0, 5 - (time.monotonic() - killed_at)))  # cron seconds after the kill
        c.cli("task", "disable", "tick")
        time.sleep(1)  # a cycle that began before the disable commits nothing after it
        assert other.alive() and "Traceback" not in other.log()
        assert f"event=link_failover from=tcp://127.0.0.1:{serving.name.split('-')[1]}" in c.workers["w1"].log()
        times = [t for (t,) in c.sql("SELECT scheduled_for_ms FROM runs WHERE trigger_type = 'cron' ORDER BY 1")]
        assert len(times) == len(set(times)), "a cron occurrence was admitted twice"
        events = c.sql("SELECT type, occurrences FROM trigger_events WHERE type IN ('missed', 'skipped')")
        counted = sum(n for _kind, n in events)
        span = (times[-1] - times[0]) // 1000 + 1
        assert len(times) + counted >= span, (len(times), counted, span)
        cron_ids = [r for (r,) in c.sql("SELECT id FROM runs WHERE trigger_type = 'cron'")]
        cron = c.wait_terminal(cron_ids, timeout=60)
        assert {s["state"] for s in cron.values()} == {"succeeded"}
        _assert_no_actor_failed(c, killed=(serving,))
    finally:
        c.close()


@pytest.mark.timeout(240)
def test_the_database_restarted_during_200_runs_both_sides_reconnect_and_each_runs_once(tmp_path, private_pg):
    """The private PostgreSQL stopped by its PID and started again on the same port, a third of
    the way through 200 runs: the replica and the worker reconnect, every run ends succeeded in
    one attempt, none lost, none ran twice."""
    c = make_cluster(tmp_path, timings=dict(session_lease_ms=20_000, recovery_grace_ms=50_000),
                     admin_url=private_pg.url())
    try:
        worker = _worker(c, "w1", slots=8)
        ledger = tmp_path / "ledger"
        _task(c, "short", ledger, sleep=0.2, max_concurrent=8)
        runs = _request(c, "short", 200)
        wait_until(lambda: _count(c, "SELECT count(*) FROM runs WHERE id = ANY(%s) AND status = 'succeeded'",
                                  runs) >= 60, 120, "a third of the runs done")
        private_pg.stop()
        time.sleep(3)  # down: the replica's transactions fail, the worker's requests go unanswered
        private_pg.start()
        _assert_each_ran_once(c, runs, ledger, timeout=150)
        replica = c.replicas[0]
        assert replica.alive() and worker.alive()
        assert "store_unavailable" in replica.log()
        _assert_no_actor_failed(c)
        status = c.cli_json("status")["replicas"][0]
        assert status["up"] is True and status["db_errors"] >= 1
    finally:
        c.close()
