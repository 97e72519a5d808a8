"""The random delay of a cron fire (SEMANTICS.md §8): deterministic per trigger and occurrence."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qlactors.domain.cron_delay import not_before_ms, random_delay_ms
from qlactors.domain.model import MAX_RANDOM_DELAY_MS

T = 1_772_445_600_000  # 2026-03-02T10:00:00Z


def test_the_delay_is_sha256_of_trigger_and_occurrence_reduced_to_the_range():
    # the formula written out, so that another replica (or a later version) computes the same
    digest = hashlib.sha256(b"trg-1:1772445600000").digest()
    assert random_delay_ms("trg-1", T, 600_000) == int.from_bytes(digest[:8], "big") % 600_001
    assert not_before_ms("trg-1", T, 600_000) == T + random_delay_ms("trg-1", T, 600_000)


def test_no_delay_means_no_not_before():
    assert random_delay_ms("trg-1", T, 0) == 0
    assert not_before_ms("trg-1", T, 0) is None


@settings(max_examples=200, deadline=None)
@given(trigger=st.text(min_size=1, max_size=40), at=st.integers(0, 2**45),
       top=st.integers(0, MAX_RANDOM_DELAY_MS))
def test_the_delay_is_within_the_bound_and_the_same_every_time(trigger, at, top):
    d = random_delay_ms(trigger, at, top)
    assert 0 <= d <= top and d == random_delay_ms(trigger, at, top)


def test_delays_spread_over_the_range_across_occurrences_and_triggers():
    top = 3_600_000
    per_occurrence = [random_delay_ms("trg-1", T + i * 60_000, top) for i in range(400)]
    per_trigger = [random_delay_ms(f"trg-{i}", T, top) for i in range(400)]
    for draws in (per_occurrence, per_trigger):
        assert len(set(draws)) > 390  # not one delay for all
        quarters = [sum(q * top // 4 <= d < (q + 1) * top // 4 + (q == 3) for d in draws) for q in range(4)]
        assert all(60 <= n <= 140 for n in quarters), quarters  # roughly uniform (100 expected each)


@pytest.mark.parametrize("bad", [dict(trigger_id=""), dict(scheduled_for_ms=1.5), dict(max_delay_ms=-1),
                                 dict(max_delay_ms=MAX_RANDOM_DELAY_MS + 1), dict(max_delay_ms=True)])
def test_bad_inputs_are_refused(bad):
    args = dict(trigger_id="trg-1", scheduled_for_ms=T, max_delay_ms=1000) | bad
    with pytest.raises(ValueError):
        random_delay_ms(**args)
