"""The runtime never dies silently: a real `qlactors edge` whose bridge loop dies stops at once,
exits non-zero with a one-line reason, and `status` stops saying "up" (issue 9 §2).

The failure is injected with `QLACTORS_FAULT=bridge_loop_on_nudge` (qlactors/faults.py): the
bridge thread raises on the next nudge, which `qlactors run` sends.
"""

from __future__ import annotations

from qlactors.home import runtime_is_up


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
    run — instead of every later pull being answered Idle until the runtime restarts."""
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
