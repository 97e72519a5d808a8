"""Retry policy validation, backoff arithmetic and the lost-run decision (SEMANTICS.md §1, §10)."""

from __future__ import annotations

import ast
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import qlactors.domain.retry as retry_module
from qlactors.domain.retry import (
    BACKOFF_LIMIT_MS,
    MAX_ATTEMPTS_LIMIT,
    LostDecision,
    PolicyError,
    RetryPolicy,
    backoff_ms,
    decide_lost,
)
from qlactors.domain.states import RetrySafety
from qlactors.domain.transitions import ErrorCode

SAFE = RetrySafety.IDEMPOTENT


def test_default_policy_is_valid_and_never_retries():
    p = RetryPolicy()
    assert (p.max_attempts, p.retry_on_lost, p.safety) == (1, False, RetrySafety.UNKNOWN)
    assert (p.backoff_base_ms, p.backoff_max_ms) == (1000, 300_000)
    assert not p.retries_when_lost


@pytest.mark.parametrize("n", [1, 2, 8, MAX_ATTEMPTS_LIMIT])
def test_max_attempts_in_range_is_accepted(n):
    assert RetryPolicy(max_attempts=n).max_attempts == n


@pytest.mark.parametrize("n", [0, -1, MAX_ATTEMPTS_LIMIT + 1, 10**9])
def test_max_attempts_out_of_range_is_refused(n):
    with pytest.raises(PolicyError, match="max_attempts") as info:
        RetryPolicy(max_attempts=n)
    assert info.value.field == "max_attempts"


@pytest.mark.parametrize("field", ["max_attempts", "backoff_base_ms", "backoff_max_ms"])
@pytest.mark.parametrize("bad", [True, False, 1.0, "1", None])
def test_integer_fields_refuse_bool_float_str_and_none(field, bad):
    with pytest.raises(PolicyError, match=field) as info:
        RetryPolicy(**{field: bad})
    assert info.value.field == field


@pytest.mark.parametrize("bad", [1, 0, "yes", None])
def test_retry_on_lost_must_be_a_bool(bad):
    with pytest.raises(PolicyError, match="retry_on_lost"):
        RetryPolicy(retry_on_lost=bad)


def test_safety_is_coerced_from_its_string_value():
    p = RetryPolicy(max_attempts=3, retry_on_lost=True, safety="deduplicated")
    assert p.safety is RetrySafety.DEDUPLICATED


@pytest.mark.parametrize("bad", ["safe", "", None, 1])
def test_unknown_safety_value_is_refused(bad):
    with pytest.raises(PolicyError, match="safety"):
        RetryPolicy(safety=bad)


def test_backoff_bounds_are_accepted_at_their_edges():
    assert RetryPolicy(backoff_base_ms=0, backoff_max_ms=0).backoff_max_ms == 0
    p = RetryPolicy(backoff_base_ms=BACKOFF_LIMIT_MS, backoff_max_ms=BACKOFF_LIMIT_MS)
    assert p.backoff_base_ms == BACKOFF_LIMIT_MS


def test_backoff_max_over_24_hours_is_refused():
    with pytest.raises(PolicyError, match="backoff_max_ms"):
        RetryPolicy(backoff_max_ms=BACKOFF_LIMIT_MS + 1)


def test_negative_backoff_base_is_refused():
    with pytest.raises(PolicyError, match="backoff_base_ms"):
        RetryPolicy(backoff_base_ms=-1)


def test_backoff_base_above_max_is_refused():
    with pytest.raises(PolicyError, match="backoff_base_ms") as info:
        RetryPolicy(backoff_base_ms=2000, backoff_max_ms=1000)
    assert "backoff_max_ms" in str(info.value)


def test_admission_refuses_retry_on_lost_with_unknown_safety():
    with pytest.raises(PolicyError) as info:
        RetryPolicy(max_attempts=2, retry_on_lost=True)
    assert info.value.field == "safety"
    assert "--safety idempotent|deduplicated" in str(info.value)
    assert "--retry-on-lost" in str(info.value)


@pytest.mark.parametrize("safety", [RetrySafety.IDEMPOTENT, RetrySafety.DEDUPLICATED])
def test_admission_accepts_retry_on_lost_with_known_safety(safety):
    assert RetryPolicy(max_attempts=2, retry_on_lost=True, safety=safety).retries_when_lost


def test_retry_on_lost_with_a_single_attempt_is_allowed():
    p = RetryPolicy(max_attempts=1, retry_on_lost=True)
    assert not p.retries_when_lost


def test_policy_is_frozen():
    with pytest.raises(AttributeError):
        RetryPolicy().max_attempts = 3  # type: ignore[misc]


def test_policy_error_is_a_value_error():
    assert issubclass(PolicyError, ValueError)


policies = st.integers(0, BACKOFF_LIMIT_MS).flatmap(
    lambda mx: st.builds(RetryPolicy, backoff_base_ms=st.integers(0, mx), backoff_max_ms=st.just(mx))
)


@settings(max_examples=200)
@given(policies, st.integers(1, 40))
def test_backoff_is_monotone_and_never_above_max(policy, n):
    assert 0 <= backoff_ms(policy, n) <= backoff_ms(policy, n + 1) <= policy.backoff_max_ms


@settings(max_examples=200)
@given(policies, st.integers(1, 16))
def test_backoff_follows_the_formula(policy, n):
    expected = min(policy.backoff_max_ms, policy.backoff_base_ms * 2 ** (n - 1))
    assert backoff_ms(policy, n) == expected


def test_backoff_examples():
    p = RetryPolicy()
    assert [backoff_ms(p, n) for n in (1, 2, 3, 9, 10)] == [1000, 2000, 4000, 256_000, 300_000]
    assert backoff_ms(RetryPolicy(backoff_base_ms=0), 5) == 0
    assert backoff_ms(p, 10**6) == 300_000


@pytest.mark.parametrize("n", [0, -1, True, 1.0])
def test_backoff_refuses_attempt_numbers_below_one(n):
    with pytest.raises(ValueError):
        backoff_ms(RetryPolicy(), n)


def test_lost_without_policy_fails_retry_disabled():
    assert decide_lost(None, 1, 5_000) == LostDecision(False, ErrorCode.RUN_LOST_RETRY_DISABLED, None)


def test_lost_with_retry_on_lost_false_fails_retry_disabled():
    p = RetryPolicy(max_attempts=5, safety=SAFE)
    assert decide_lost(p, 1, 0).error_code == ErrorCode.RUN_LOST_RETRY_DISABLED


def test_lost_with_unknown_safety_fails_retry_unsafe():
    # The only unknown-safety retry_on_lost policy admission allows: one attempt.
    p = RetryPolicy(max_attempts=1, retry_on_lost=True)
    assert decide_lost(p, 1, 0) == LostDecision(False, ErrorCode.RUN_LOST_RETRY_UNSAFE, None)


def test_lost_with_unknown_safety_forced_past_validation_still_fails_unsafe():
    p = RetryPolicy(max_attempts=3, retry_on_lost=True, safety=SAFE)
    object.__setattr__(p, "safety", RetrySafety.UNKNOWN)
    assert decide_lost(p, 1, 0).error_code == ErrorCode.RUN_LOST_RETRY_UNSAFE


@pytest.mark.parametrize("used", [3, 4])
def test_lost_with_attempts_used_up_fails_exhausted(used):
    p = RetryPolicy(max_attempts=3, retry_on_lost=True, safety=SAFE)
    assert decide_lost(p, used, 0) == LostDecision(False, ErrorCode.RUN_LOST_RETRY_EXHAUSTED, None)


def test_single_attempt_safe_policy_ends_exhausted():
    p = RetryPolicy(max_attempts=1, retry_on_lost=True, safety=SAFE)
    assert decide_lost(p, 1, 0).error_code == ErrorCode.RUN_LOST_RETRY_EXHAUSTED


@pytest.mark.parametrize("used, delay", [(1, 1000), (2, 2000), (3, 4000)])
def test_lost_with_attempts_left_retries_after_backoff(used, delay):
    p = RetryPolicy(max_attempts=4, retry_on_lost=True, safety=RetrySafety.DEDUPLICATED)
    assert decide_lost(p, used, 1_700_000_000_000) == LostDecision(True, None, 1_700_000_000_000 + delay)


@settings(max_examples=200)
@given(policies, st.integers(2, MAX_ATTEMPTS_LIMIT), st.integers(1, MAX_ATTEMPTS_LIMIT),
       st.integers(0, 2**53))
def test_decision_retries_exactly_while_attempts_remain(base_policy, max_attempts, used, now):
    p = RetryPolicy(max_attempts=max_attempts, retry_on_lost=True, safety=SAFE,
                    backoff_base_ms=base_policy.backoff_base_ms,
                    backoff_max_ms=base_policy.backoff_max_ms)
    d = decide_lost(p, used, now)
    assert d.retry == (used < max_attempts)
    if d.retry:
        assert d.error_code is None and d.next_attempt_at_ms == now + backoff_ms(p, used)
    else:
        assert d.error_code == ErrorCode.RUN_LOST_RETRY_EXHAUSTED and d.next_attempt_at_ms is None


@pytest.mark.parametrize("used, now", [(0, 0), (True, 0), (1, -1), (1, 1.5)])
def test_decide_lost_refuses_bad_arguments(used, now):
    with pytest.raises(ValueError):
        decide_lost(RetryPolicy(), used, now)


def test_retry_module_imports_no_io():
    tree = ast.parse(pathlib.Path(retry_module.__file__).read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    forbidden = {"os", "io", "socket", "subprocess", "time", "sqlalchemy", "zmq", "pykka", "psycopg"}
    assert not names & forbidden
