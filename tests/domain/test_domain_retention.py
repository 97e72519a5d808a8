"""The pure retention rules: what is due (age, count per task) and what holds a due run back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qlactors.domain.retention import (
    Candidate,
    HoldReason,
    RetentionError,
    RetentionPolicies,
    RetentionPolicy,
    RetireReason,
    TaskRetention,
    hold_reason,
    judge,
    parse_keep_days,
    parse_keep_runs,
    plan_page,
    retire_reason,
)

DAY = 86_400_000
NOW = 1_700_000_000_000
POLICY = RetentionPolicy(max_age_ms=7 * DAY, max_runs=100)


def test_a_run_finished_exactly_max_age_ago_is_due_and_one_a_millisecond_younger_is_kept():
    assert retire_reason(POLICY, NOW, NOW - 7 * DAY, 0) is RetireReason.MAX_AGE
    assert retire_reason(POLICY, NOW, NOW - 7 * DAY + 1, 0) is None


def test_the_newest_max_runs_of_a_task_are_kept_and_the_next_one_is_due():
    assert retire_reason(POLICY, NOW, NOW, 99) is None
    assert retire_reason(POLICY, NOW, NOW, 100) is RetireReason.MAX_RUNS


def test_age_is_the_reason_when_both_bounds_are_passed():
    assert retire_reason(POLICY, NOW, NOW - 8 * DAY, 500) is RetireReason.MAX_AGE


def test_an_unfinished_run_is_never_due():
    assert retire_reason(POLICY, NOW, None, 10_000) is None
    verdict = judge(POLICY, NOW, Candidate("r", terminal=False, finished_at_ms=None, newer_in_task=10_000))
    assert verdict.retire is None and verdict.hold is HoldReason.ACTIVE and not verdict.retired


def test_a_journal_row_or_a_receipt_file_holds_a_due_run_back():
    assert hold_reason(terminal=True, journal_row=False, receipt_file=False) is None
    assert hold_reason(terminal=True, journal_row=True, receipt_file=False) is HoldReason.JOURNAL
    assert hold_reason(terminal=True, journal_row=False, receipt_file=True) is HoldReason.RECEIPT
    assert hold_reason(terminal=False, journal_row=False, receipt_file=False) is HoldReason.ACTIVE
    old = NOW - 30 * DAY
    for kw, hold in (({"journal_row": True}, HoldReason.JOURNAL), ({"receipt_file": True}, HoldReason.RECEIPT)):
        verdict = judge(POLICY, NOW, Candidate("r", terminal=True, finished_at_ms=old, newer_in_task=0, **kw))
        assert verdict.retire is RetireReason.MAX_AGE and verdict.hold is hold and not verdict.retired


def test_a_page_stops_after_page_retirements_and_held_runs_do_not_use_the_budget():
    old = NOW - 30 * DAY
    candidates = [Candidate(f"r{i}", terminal=True, finished_at_ms=old + i, newer_in_task=0,
                            receipt_file=i % 2 == 0) for i in range(10)]
    verdicts = plan_page(POLICY, NOW, candidates, 3)
    assert [v.run_id for v in verdicts if v.retired] == ["r1", "r3", "r5"]
    assert [v.run_id for v in verdicts] == [f"r{i}" for i in range(6)]


@pytest.mark.parametrize("kw", [{"max_age_ms": 0, "max_runs": 1}, {"max_age_ms": DAY, "max_runs": 0},
                                {"max_age_ms": True, "max_runs": 1}, {"max_age_ms": DAY, "max_runs": 1.0}])
def test_a_policy_refuses_non_positive_or_non_integer_bounds(kw):
    with pytest.raises(ValueError):
        RetentionPolicy(**kw)


@pytest.mark.parametrize("page", [0, 257, 1.5])
def test_a_page_outside_1_to_256_is_refused(page):
    with pytest.raises(ValueError):
        plan_page(POLICY, NOW, [], page)


@given(finished=st.lists(st.integers(min_value=NOW - 20 * DAY, max_value=NOW), min_size=0, max_size=60),
       max_runs=st.integers(min_value=1, max_value=20), max_age_days=st.integers(min_value=1, max_value=15),
       page=st.integers(min_value=1, max_value=30))
def test_what_stays_is_exactly_the_young_runs_among_the_newest_max_runs(finished, max_runs, max_age_days, page):
    policy = RetentionPolicy(max_age_ms=max_age_days * DAY, max_runs=max_runs)
    ordered = sorted(finished)
    n = len(ordered)
    candidates = [Candidate(f"r{i:03}", terminal=True, finished_at_ms=t, newer_in_task=n - 1 - i)
                  for i, t in enumerate(ordered)]
    retired = [v.run_id for v in plan_page(policy, NOW, candidates, page) if v.retired]
    assert len(retired) <= page
    due = [c.run_id for c in candidates
           if c.finished_at_ms <= NOW - policy.max_age_ms or c.newer_in_task >= max_runs]
    assert retired == due[:page]  # oldest first, exactly the due ones
    kept = [c for c in candidates if c.run_id not in due]
    assert len(kept) <= max_runs
    assert all(NOW - c.finished_at_ms < policy.max_age_ms for c in kept)


# -- per-task bounds ----------------------------------------------------------------------------------

def test_a_task_s_own_bounds_replace_the_global_ones_field_by_field():
    policies = RetentionPolicies(POLICY, {"short": TaskRetention(max_age_ms=DAY),
                                         "few": TaskRetention(max_runs=1),
                                         "both": TaskRetention(max_age_ms=30 * DAY, max_runs=5)})
    assert policies.for_task("other") is POLICY and policies.for_task(None) is POLICY
    assert policies.for_task("short") == RetentionPolicy(max_age_ms=DAY, max_runs=100)
    assert policies.for_task("few") == RetentionPolicy(max_age_ms=7 * DAY, max_runs=1)
    assert policies.for_task("both") == RetentionPolicy(max_age_ms=30 * DAY, max_runs=5)
    assert TaskRetention().over(POLICY) is POLICY and TaskRetention().is_default


def test_judge_and_plan_page_hold_each_candidate_to_its_task_s_bounds():
    policies = RetentionPolicies(POLICY, {"few": TaskRetention(max_runs=1), "long": TaskRetention(max_age_ms=30 * DAY)})
    candidates = [Candidate("few-2nd", terminal=True, finished_at_ms=NOW - DAY, newer_in_task=1, task_id="few"),
                  Candidate("other-2nd", terminal=True, finished_at_ms=NOW - DAY, newer_in_task=1, task_id="other"),
                  Candidate("long-old", terminal=True, finished_at_ms=NOW - 8 * DAY, newer_in_task=0, task_id="long"),
                  Candidate("other-old", terminal=True, finished_at_ms=NOW - 8 * DAY, newer_in_task=0, task_id="o")]
    verdicts = {v.run_id: v.retire for v in plan_page(policies, NOW, candidates, 16)}
    assert verdicts == {"few-2nd": RetireReason.MAX_RUNS, "other-2nd": None, "long-old": None,
                        "other-old": RetireReason.MAX_AGE}
    assert judge(policies, NOW, candidates[0]).retired and not judge(POLICY, NOW, candidates[0]).retired


@pytest.mark.parametrize("kw", [{"max_age_ms": 3_599_999}, {"max_age_ms": 3_650 * DAY + 1}, {"max_age_ms": 1.5},
                                {"max_runs": 0}, {"max_runs": 1_000_001}, {"max_runs": True}])
def test_a_task_s_own_bounds_must_be_within_the_config_s_limits(kw):
    with pytest.raises(RetentionError):
        TaskRetention(**kw)
    TaskRetention(max_age_ms=3_600_000, max_runs=1)
    TaskRetention(max_age_ms=3_650 * DAY, max_runs=1_000_000)


def test_keep_days_and_keep_runs_parse_days_runs_and_default():
    assert parse_keep_days("2") == 2 * DAY and parse_keep_days("0.5") == DAY // 2
    assert parse_keep_days(str(1 / 24)) == 3_600_000 and parse_keep_days("3650") == 3_650 * DAY
    assert parse_keep_days("default") is None and parse_keep_runs("DEFAULT") is None
    assert parse_keep_runs("1") == 1 and parse_keep_runs("1000000") == 1_000_000
    for text, fragment in (("abc", "not a number of days"), ("nan", "not a number of days"),
                           ("inf", "not a number of days"), ("0.01", "out of range"), ("-1", "out of range"),
                           ("3651", "out of range")):
        with pytest.raises(RetentionError, match=fragment):
            parse_keep_days(text)
    for text, fragment in (("1.5", "not a whole number"), ("x", "not a whole number"), ("0", "out of range"),
                           ("1000001", "out of range")):
        with pytest.raises(RetentionError, match=fragment):
            parse_keep_runs(text)
