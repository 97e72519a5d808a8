"""The bridge's keyed timers, without a bridge: replace, cancel, order, and stale heap entries."""

from __future__ import annotations

from qlactors.wire.timers import Timers


def test_a_later_call_with_the_same_key_replaces_the_earlier_one():
    timers = Timers()
    timers.set("cadence", 10.0, "t", "first")
    timers.set("cadence", 20.0, "t", "second")
    assert timers.due("cadence") == 20.0
    assert timers.pop_due(15.0) == []  # the replaced entry does not fire (it may only wake the poll early)
    assert timers.next_at() == 20.0
    assert timers.pop_due(20.0) == [("t", "second")]
    assert timers.due("cadence") is None and timers.next_at() is None


def test_due_timers_come_in_time_order_and_a_cancelled_one_never_fires():
    timers = Timers()
    timers.set("b", 2.0, "tb", "B")
    timers.set("a", 1.0, "ta", "A")
    timers.set("c", 3.0, "tc", "C")
    timers.cancel("c")
    assert timers.pop_due(5.0) == [("ta", "A"), ("tb", "B")]
    assert timers.next_at() is None
