"""A `--timeout` job whose worker cannot be reached (issue 18 item 11, SEMANTICS.md §7, §10): the
control side commits the timeout at the database deadline, but only the worker can stop the job,
so the run stays `running` with its stop pending until the worker is back, or until recovery
has evidence. Real processes on 127.0.0.1 (PostgreSQL, a replica, a worker with CURVE keys),
each stopped by its PID."""

from __future__ import annotations

import signal
import time

import pytest

from actor_harness import wait_until
from cluster_harness import make_cluster
from edge_harness import group_alive

pytestmark = pytest.mark.postgres

SLEEPER = ("--stop-grace", "1", "--", "sleep", "300")


def _one_worker_cluster(tmp_path, *, slots: int, **timings: int):
    """One replica and worker w1 (its key allowed) with these timings; the cluster is closed if
    the worker does not start."""
    c = make_cluster(tmp_path, replicas=1, timings=timings)
    try:
        c.new_key("w1")
        c.allow("w1")
        return c, c.start_worker("w1", slots=slots)
    except BaseException:
        c.close()
        raise



def _slowly(predicate):
    """`predicate`, polled every 0.2 s (each poll runs a command or a query)."""
    def poll():
        value = predicate()
        if not value:
            time.sleep(0.2)
        return value
    return poll


def _running_pgid(c, run_id: str) -> int | None:
    rows = c.sql("SELECT pgid FROM run_attempts WHERE run_id = %s AND status = 'running' "
                 "AND pgid IS NOT NULL", run_id)
    return rows[0][0] if rows else None


def _timeout_committed(c, run_id: str) -> bool:
    return bool(c.sql("SELECT 1 FROM run_events WHERE run_id = %s AND type = 'run.cancel_requested'", run_id))


def _waiting_lines(c, run_ids) -> dict[str, str] | None:
    """`status`'s unresolved-recovery line of each run, or None until every one is listed."""
    out = c.cli("status").stdout.decode().splitlines()
    lines = {r: next((line for line in out if line.strip().startswith(f"run {r} ")), None) for r in run_ids}
    return None if None in lines.values() else lines


def _waiting_line(c, run_id: str) -> str | None:
    found = _waiting_lines(c, [run_id])
    return None if found is None else found[run_id]


@pytest.mark.timeout(90)  # a hang guard: 30 s idle, 52 s on a loaded machine
def test_a_frozen_worker_s_timed_out_job_runs_with_its_stop_pending_until_the_worker_runs_again(tmp_path):
    # A session lease longer than the freeze: nothing but the timeout is judged meanwhile.
    c, w1 = _one_worker_cluster(tmp_path, slots=1, session_lease_ms=30_000, recovery_grace_ms=60_000)
    try:
        c.cli("task", "add", "slow", "--timeout", "2", *SLEEPER)
        run_id = c.cli("run", "slow").stdout.decode().strip()
        pgid = wait_until(_slowly(lambda: _running_pgid(c, run_id)), 60, "the job running on w1")

        w1.popen.send_signal(signal.SIGSTOP)  # the worker only, as if its host hung: the job goes on
        try:
            wait_until(_slowly(lambda: _timeout_committed(c, run_id)), 30, "the timeout committed")
            # Past the run lease too, so that `status` lists the attempt as waiting.
            wait_until(_slowly(lambda: _waiting_line(c, run_id)), 30, "the attempt listed as waiting")
            shown = c.show(run_id)
            assert (shown["state"], shown["cancel_reason"]) == ("running", "timeout")
            assert [a["state"] for a in shown["attempts"]] == ["running"]
            assert shown["stop_pending"]["reason"] == "timeout"
            text = c.cli("show", run_id).stdout.decode()
            assert "stop pending:  timeout (requested at " in text
            assert "the job runs until its worker stops it" in text
            line = _waiting_line(c, run_id)
            assert "timeout stop pending: worker w1 has not reported the job stopped" in line, line
            assert "unknown safety: waits for the worker" in line, line
            assert group_alive(pgid)  # nobody else can stop it
        finally:
            w1.popen.send_signal(signal.SIGCONT)

        final = c.wait_terminal([run_id], timeout=30)[run_id]
        assert final["state"] == "timed_out"
        shown = c.show(run_id)
        assert [(a["state"], a["error_code"]) for a in shown["attempts"]] == [("timed_out", "EXECUTION_TIMED_OUT")]
        assert shown["attempts"][0]["exit_code"] is not None  # stopped by its worker: the receipt's
        assert "stop_pending" not in shown
        assert not group_alive(pgid)
        assert "stop pending" not in c.cli("show", run_id).stdout.decode()
        assert f"event=stop_term attempt={shown['attempts'][0]['id']} reason=timeout" in w1.log()
    finally:
        c.close()


@pytest.mark.chaos  # it waits out the shortest recovery grace the config allows (33 s)
@pytest.mark.timeout(180)  # a hang guard: 72 s on a loaded machine; it asserts no speed
def test_a_killed_worker_s_timed_out_jobs_wait_as_their_safety_says_and_stop_when_it_returns(tmp_path):
    # The shortest session lease and recovery grace the config allows (the grace: the lease + the
    # longest stop grace a task may have).
    c, w1 = _one_worker_cluster(tmp_path, slots=2, session_lease_ms=3_000, recovery_grace_ms=33_000)
    try:
        # Its safety is pinned on its runs at admission (a task with no --safety: unknown).
        c.cli("task", "add", "idem", "--retry-on-lost", "--max-attempts", "2", "--safety", "idempotent",
              "--timeout", "6", *SLEEPER)
        c.cli("task", "add", "plain", "--timeout", "6", *SLEEPER)
        idem = c.cli("run", "idem").stdout.decode().strip()
        plain = c.cli("run", "plain").stdout.decode().strip()
        pgids = {r: wait_until(_slowly(lambda r=r: _running_pgid(c, r)), 60, f"{r} running") for r in (idem, plain)}

        c.stop(w1, signal.SIGKILL)  # the worker only: its jobs run in sessions of their own
        assert not any(_timeout_committed(c, r) for r in pgids)  # the kill came first
        # Both timeouts are committed at their deadlines; nobody can deliver their stops.
        lines = wait_until(_slowly(lambda: all(_timeout_committed(c, r) for r in pgids)
                                   and _waiting_lines(c, pgids)), 30, "both listed as waiting, their stops pending")
        for run_id, line in lines.items():
            assert "timeout stop pending: worker w1 has not reported the job stopped" in line, line
        assert "unknown safety: waits for the worker" in lines[plain]
        assert "idempotent: ends timed_out (no exit code) " in lines[idem]
        # Idempotent: once the session lapsed and the grace passed, recovery ends it by its intent,
        # with no exit code (nobody saw it end), though its process may still run on the host; a
        # run ended by its intent is not retried. The other waits for its worker (or `worker retire`).
        assert c.wait_terminal([idem], timeout=50)[idem]["state"] == "timed_out"
        [attempt] = c.show(idem)["attempts"]
        assert (attempt["state"], attempt["exit_code"]) == ("timed_out", None)
        assert group_alive(pgids[idem])
        assert c.sql("SELECT status FROM runs WHERE id = %s", plain) == [("running",)]

        # Back, the worker re-attests: the run whose timeout stop was pending is stopped and ends
        # timed_out with its receipt; the process of the one already ended is stopped too.
        c.start_worker("w1", slots=2)
        assert c.wait_terminal([plain], timeout=30)[plain]["state"] == "timed_out"
        [attempt] = c.show(plain)["attempts"]
        assert attempt["state"] == "timed_out" and attempt["exit_code"] is not None
        wait_until(_slowly(lambda: not any(group_alive(p) for p in pgids.values())), 30, "both jobs stopped")
    finally:
        c.close()
