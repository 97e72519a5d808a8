"""The transport's pure pacing: the reconnect backoff and the per-key log limit, on made-up times."""

from __future__ import annotations

from qlactors.wire.pacing import Backoff, LogLimit


def test_a_backoff_doubles_from_its_first_delay_up_to_its_cap_and_starts_again_after_reset():
    backoff = Backoff(1.0, 30.0)
    assert [backoff.next() for _ in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff.tries == 7
    backoff.reset()
    assert backoff.next() == 1.0
    many = Backoff(1.0, 30.0, tries=10_000)  # no overflow, however long it has been refused
    assert many.next() == 30.0


def test_a_log_limit_logs_a_key_at_once_then_once_per_interval_with_the_count_it_held_back():
    limit = LogLimit(300.0)
    assert limit.admit("tcp://a", now=0.0) == 0
    assert [limit.admit("tcp://a", now=t) for t in (0.1, 10.0, 299.9)] == [None, None, None]
    assert limit.admit("tcp://b", now=1.0) == 0  # each key on its own
    assert limit.admit("tcp://a", now=300.0) == 3  # one line per interval, saying what it held back
    assert limit.admit("tcp://a", now=301.0) is None


def test_a_forgotten_key_is_logged_at_once_again():
    limit = LogLimit(60.0)
    assert limit.admit("k", now=0.0) == 0
    assert limit.admit("k", now=1.0) is None
    assert limit.forget("k") == 1
    assert limit.admit("k", now=2.0) == 0


def test_a_log_limit_remembers_a_bounded_number_of_keys():
    limit = LogLimit(60.0, remember=2)
    limit.admit("a", now=0.0)
    limit.admit("b", now=100.0)
    assert limit.admit("c", now=101.0) == 0  # full: "a" (older than the interval) is dropped
    assert limit.admit("b", now=102.0) is None  # "b" was kept, still within its interval
