"""The runtime never dies silently and never wedges (issue 9 §2), with a real `qlactors edge`:

- its bridge loop dies (`QLACTORS_FAULT=bridge_loop_on_nudge`, raised on the next nudge, which
  `qlactors run` sends): it stops at once, exits 1 with a one-line reason, `status` says "down";
- its Executor dies with an offer in flight (`QLACTORS_FAULT=executor_after_accept`, once): the
  one slot is not stranded;
- another process holds the SQLite write lock past the busy timeout: the runtime retries, and
  stays up.
"""

from __future__ import annotations

import json
import sqlite3

from qlactors.runtime.home import runtime_is_up


def test_a_bridge_loop_that_dies_stops_the_edge_process_non_zero_with_the_reason(home):
    home.add_tasks(("job", "--", "echo", "hi"))
    edge = home.start_edge(fault="bridge_loop_on_nudge")
    home.run("job")  # requests a run and nudges the runtime: the bridge loop raises
    assert edge.wait_exit(15) == 1, edge.describe()
    log = edge.log()
    assert "event=bridge_failed" in log
    assert ("event=runtime_stopping reason=the bridge thread failed: "
            "InjectedFault('fault injected at bridge_loop_on_nudge'); no socket, timer or process watch "
            "is served any more") in log, log
    assert "event=edge_stopped" in log  # an orderly stop, not a hang
    assert not runtime_is_up(home.path)
    status = home.ql("status")
    assert status.returncode != 0 and "runtime: down" in status.stdout, status


def test_an_executor_that_dies_with_an_offer_in_flight_does_not_strand_the_one_slot(home):
    """slots = 1 (the edge default). The Executor dies right after journaling its first offer
    (`QLACTORS_FAULT=executor_after_accept`, once): the Supervisor restarts it, the new instance
    gives the offer back, recovery releases its lease, and that same attempt and the next run both
    run — instead of every later pull being answered with no offers until the runtime restarts."""
    home.add_tasks(("first", "--", "echo", "one"), ("second", "--", "echo", "two"))
    edge = home.start_edge(fault="executor_after_accept")
    first = home.run("first")
    assert home.wait_terminal(first, timeout=30) == "succeeded", edge.describe()
    second = home.run("second")
    assert home.wait_terminal(second, timeout=30) == "succeeded", edge.describe()
    log = edge.log()
    assert "event=actor_restarted actor=executor" in log
    assert "event=attempt_given_back" in log
    (attempt,) = home.show(first)["attempts"]  # the same attempt, offered again: never lost
    assert home.logs(first) == b"one\n"
    leases = home.query("SELECT lease_generation, status, release_reason FROM run_dispatch_leases "
                        "WHERE attempt_id = ? ORDER BY lease_generation", (attempt["id"],))
    assert [tuple(row) for row in leases] == [(1, "released", "lease_expired"), (2, "completed", None)]
    assert edge.terminate() == 0


def test_a_database_busy_beyond_its_timeout_delays_a_completion_but_never_stops_the_runtime(home):
    """Another process holds SQLite's write lock past the runtime's 5 s busy timeout while a job
    ends: its completion is retried with backoff, `status` says why, and once the lock is gone the
    run completes with the job's exit code and the runtime is still up."""
    go = home.tmp / "go"
    home.add_tasks(("job", "--", "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done; echo done; exit 3"))
    edge = home.start_edge()
    run_id = home.run("job")
    home.wait_running(run_id)
    holder = sqlite3.connect(home.db_path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        go.touch()  # the job ends now; recording its end needs the write lock
        edge.wait_log("event=store_unavailable", timeout=30)
        edge.wait_log("try=2 ", timeout=30)  # retried, with backoff
        status = json.loads(home.ql("status", "--json").stdout)
        assert status["up"] and "database is locked" in status["store_outage"]["error"], status
        assert home.state(run_id) == "running"  # nothing was changed meanwhile
        holder.execute("ROLLBACK")
    finally:
        holder.close()
    assert home.wait_terminal(run_id, timeout=30) == "failed"
    assert home.attempt_row(run_id)["exit_code"] == 3
    edge.wait_log("event=store_available", timeout=15)
    assert edge.proc.poll() is None, edge.describe()
    assert json.loads(home.ql("status", "--json").stdout)["store_outage"] is None
    assert edge.terminate() == 0
