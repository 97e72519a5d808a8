"""Frozen peers (issue 11 item 5, SEMANTICS.md §9-§10): a worker frozen (SIGSTOP) past its session
lease and the recovery grace, and a control replica frozen while it serves. Real processes on
127.0.0.1, each stopped by its PID."""

from __future__ import annotations

import signal
import time

import pytest

from actor_harness import wait_until
from cluster_harness import make_cluster
from edge_harness import group_alive
from chaos_steps import _assert_each_ran_once, _request, _task

pytestmark = [pytest.mark.postgres, pytest.mark.chaos]

GRACE_MS = 35_000
TERMINAL_EVENTS = ("run.succeeded", "run.failed", "run.cancelled", "run.timed_out")
# A first execution marks the task's file and sleeps (it must be stopped by the worker that
# re-attests it); a later one finds the mark and ends at once.
ONCE_THEN_QUICK = 'if [ -e {mark} ]; then echo again; exit 0; fi; touch {mark}; exec sleep 300'



def _one_terminal_event_each(c, run_ids: list[str]) -> None:
    for run_id in run_ids:
        types = [row[0] for row in c.sql("SELECT type FROM run_events WHERE run_id = %s", run_id)]
        assert sum(t in TERMINAL_EVENTS for t in types) == 1, (run_id, types)


@pytest.mark.timeout(240)
def test_a_worker_frozen_past_its_session_lease_and_the_grace_is_superseded_and_stops_its_old_jobs(tmp_path):
    c = make_cluster(tmp_path, replicas=1, timings={"recovery_grace_ms": GRACE_MS})
    try:
        for name in ("w1", "w2"):
            c.new_key(name)
            c.allow(name)
        w1 = c.start_worker("w1", slots=4)
        idem = []
        for i in range(3):
            c.cli("task", "add", f"idem{i}", "--retry-on-lost", "--max-attempts", "2", "--safety", "idempotent",
                  "--backoff", "1", "--", "sh", "-c", ONCE_THEN_QUICK.format(mark=tmp_path / f"mark{i}"))
            idem.append(c.cli("run", f"idem{i}").stdout.decode().strip())
        c.cli("task", "add", "slow", "--timeout", "8", "--stop-grace", "1", "--", "sleep", "300")
        slow = c.cli("run", "slow").stdout.decode().strip()
        every = [*idem, slow]
        wait_until(lambda: c.sql("SELECT count(*) FROM run_attempts WHERE worker_id = 'w1' "
                                 "AND status = 'running'")[0][0] == 4, 60, "four jobs running on w1")
        first = {run_id: c.sql("SELECT id, pgid FROM run_attempts WHERE run_id = %s", run_id)[0]
                 for run_id in every}
        c.start_worker("w2", slots=4)

        w1.popen.send_signal(signal.SIGSTOP)  # the worker only: its jobs go on running
        frozen_at_ms = time.time_ns() // 1_000_000
        try:
            # Past the session lease and the grace, the idempotent runs move to w2 as attempt 2.
            states = c.wait_terminal(idem, timeout=GRACE_MS / 1000 + 45)
            assert {s["state"] for s in states.values()} == {"succeeded"}
            for run_id in idem:
                old, new = c.show(run_id)["attempts"]
                assert (old["state"], old["error_code"]) == ("lost", "RECOVERY_SESSION_ENDED")
                assert new["state"] == "succeeded"
            lost_at = [row[0] for row in c.sql(
                "SELECT created_at_ms FROM run_events WHERE type = 'attempt.lost' AND run_id = ANY(%s)", idem)]
            assert min(lost_at) - frozen_at_ms >= GRACE_MS
            # The old first executions still run (nobody could stop them): the cut-off worker's jobs
            # are never killed by the control side, which has no way to reach them.
            assert all(group_alive(first[run_id][1]) for run_id in idem)
            # The timeout was committed by the control side at its deadline, the worker frozen.
            deadline = c.sql("SELECT deadline_at_ms FROM run_attempts WHERE run_id = %s", slow)[0][0]
            [(requested_at,)] = c.sql("SELECT created_at_ms FROM run_events WHERE run_id = %s "
                                      "AND type = 'run.cancel_requested'", slow)
            assert 0 <= requested_at - deadline <= 5_000
        finally:
            w1.popen.send_signal(signal.SIGCONT)
        # Thawed, w1 registers anew and re-attests: the superseded executions are stopped by their
        # exact identity, the timed-out job too, and no late receipt completes a run.
        wait_until(lambda: not any(group_alive(first[run_id][1]) for run_id in every), 60,
                   "the superseded and the timed-out processes stopped after the re-attest")
        states = c.wait_terminal([slow], timeout=60)
        assert states[slow]["state"] == "timed_out"
        time.sleep(2)  # a late Completed of an old execution would land here
        for run_id in idem:
            assert c.show(run_id)["state"] == "succeeded" and len(c.show(run_id)["attempts"]) == 2
        _one_terminal_event_each(c, every)
        assert w1.alive()
    finally:
        c.close()


@pytest.mark.timeout(240)
def _freeze_inside_a_transaction(c, proc, tries: int = 60) -> int:
    """SIGSTOP `proc` until it is caught with a transaction open: a backend of the database idle
    in transaction, the same one (pid and transaction start) 0.2 s apart, while a live replica's
    transactions last milliseconds. The backend's pid; `proc` is left stopped."""
    open_tx = ("SELECT pid, xact_start FROM pg_stat_activity WHERE datname = current_database() "
               "AND state LIKE 'idle in transaction%%' AND pid <> pg_backend_pid()")
    for _ in range(tries):
        proc.popen.send_signal(signal.SIGSTOP)
        first = set(c.sql(open_tx))
        time.sleep(0.2)
        held = first & set(c.sql(open_tx))
        if held:
            return next(iter(held))[0]
        proc.popen.send_signal(signal.SIGCONT)
        time.sleep(0.1)
    raise AssertionError(f"the replica was never caught inside a transaction in {tries} tries")


@pytest.mark.timeout(240)
def test_a_frozen_replica_holds_nobody_past_the_postgresql_timeouts_and_workers_fail_over(tmp_path):
    """The replica serving the worker frozen inside a transaction: PostgreSQL ends that
    transaction at idle_in_transaction_session_timeout, nobody waits on its locks for longer, the
    worker fails over, the other replica serves, and after SIGCONT every run has run once."""
    c = make_cluster(tmp_path, replicas=2)
    try:
        c.new_key("w1")
        c.allow("w1")
        c.start_worker("w1", slots=6)
        ledger = tmp_path / "ledger"
        _task(c, "short", ledger, sleep=0.2, max_concurrent=6)
        runs = _request(c, "short", 150)
        wait_until(lambda: ledger.exists() and len(ledger.read_text().splitlines()) >= 5, 60, "the first runs")
        frozen = next(r for r in c.replicas if "event=session_open" in r.log())
        backend = _freeze_inside_a_transaction(c, frozen)
        try:
            time.sleep(c.timings["db_timeout_ms"] / 1000 + 2)
            alive = c.sql("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", backend)[0][0]
            assert alive == 0  # its transaction ended by the server, its locks released
            more = _request(c, "short", 20)
            states = c.wait_terminal(more, timeout=90)  # served by the other replica meanwhile
            assert {s["state"] for s in states.values()} == {"succeeded"}
        finally:
            frozen.popen.send_signal(signal.SIGCONT)
        _assert_each_ran_once(c, runs + more, ledger, timeout=120)
        assert frozen.alive() and all(r.alive() for r in c.replicas)
        assert "Traceback" not in frozen.log()
    finally:
        c.close()
