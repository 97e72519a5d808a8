"""The Supervisor actor with the real Gateway: a finished cycle's stops and nudges reach the
registered peer, and the cadence timer ticks the Scheduler (ARCHITECTURE.md "The wire",
SEMANTICS.md §4-§6, §10).

The harness (tests/harness/actor_harness.py) builds the EdgeContext on a SQLite file in a temp
home and starts one actor; the other names in the Directory are recording stubs. The rigs are
tests/harness/actor_rigs.py's.
"""

from __future__ import annotations

import pytest

from qlactors.runtime.signals import CycleDone, Tick
from qlactors.wire import messages as m

from actor_harness import WAIT_S
from actor_rigs import sup  # noqa: F401 - fixtures


def test_supervisor_cycle_done_sends_stops_and_nudges_to_the_registered_peer(sup):
    from qlactors.store.cadence.control import StopOrder

    sup.register()
    order = StopOrder(run_id="r1", attempt_id="a1", reason="user", grace_ms=1500, boot_id=None, pid=None,
                      pgid=None, start_ticks=None, attempt_status="running")
    sup.supervisor.tell(CycleDone(ok=True, stops=(order,), work_waiting=True))
    assert sup.peer.expect(m.StopRequested) == m.StopRequested(run_id="r1", attempt_id="a1", reason="user",
                                                              grace_ms=1500)
    sup.peer.expect(m.Nudge)


@pytest.mark.parametrize("idle", [False, True])
def test_supervisor_schedules_the_next_cycle_at_the_tick_or_the_idle_tick(sup, idle):
    import time as _time

    runtime = sup.h.ctx.config.runtime
    sup.register()
    sup.supervisor.tell(CycleDone(ok=True, idle=idle))
    sup.supervisor.ask(Tick("barrier"), timeout=WAIT_S)  # answered: the CycleDone before it was handled
    wait_s = sup.h.ctx.bridge.timer_due("cadence") - _time.monotonic()
    expected = (runtime.idle_tick_ms if idle else runtime.cadence_tick_ms) / 1000
    assert expected - 1.0 < wait_s <= expected + 0.1


def test_supervisor_the_cadence_timer_ticks_the_scheduler_at_a_deadline(sup):
    """An activation with a deadline wakes the cadence then (not only at the next regular tick)."""
    sup.register()
    sup.activated(timeout_ms=50)
    ticks = sup.h.inbox.wait("scheduler", Tick, timeout=3.0)
    assert ticks[0].reason == "cadence"
