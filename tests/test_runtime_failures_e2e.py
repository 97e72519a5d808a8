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
