"""The retry policy of a lost run: validation, backoff arithmetic and the decision (SEMANTICS.md §10)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BadInput
from .states import RetrySafety
from .transitions import ErrorCode

MAX_ATTEMPTS_LIMIT = 16
BACKOFF_LIMIT_MS = 86_400_000  # 24 h: the largest backoff_max_ms a policy may carry.
DEFAULT_BACKOFF_BASE_MS = 1_000
DEFAULT_BACKOFF_MAX_MS = 300_000
# The exponent stops growing here. Attempt numbers never pass MAX_ATTEMPTS_LIMIT, so this never
# changes a real delay; it keeps the arithmetic small for any caller passing a huge number.
_MAX_EXPONENT = 15


class PolicyError(BadInput):
    """A retry policy that admission refuses; `field` names the offending setting."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _check_int(name: str, value: object, low: int, high: int) -> None:
    """Refuse anything but a real int (bool and float included) within `low..high`."""
    if type(value) is not int:
        raise PolicyError(
            name, f"retry policy {name} must be an integer, got {type(value).__name__} {value!r}; "
            f"pass a whole number from {low} to {high}")
    if not low <= value <= high:
        raise PolicyError(
            name, f"retry policy {name} must be from {low} to {high}, got {value}; "
            f"pass a value in that range")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The retry policy snapshot taken when a run is admitted; always valid once constructed.

    `max_attempts` counts every attempt of the run, the first included, so 1 never retries.
    `retry_on_lost` with `max_attempts == 1` is allowed: such a run simply ends exhausted.
    """

    max_attempts: int = 1
    retry_on_lost: bool = False
    safety: RetrySafety = RetrySafety.UNKNOWN
    backoff_base_ms: int = DEFAULT_BACKOFF_BASE_MS
    backoff_max_ms: int = DEFAULT_BACKOFF_MAX_MS

    def __post_init__(self) -> None:
        """Validate at construction so that no invalid policy can reach the store or the cadence."""
        try:
            safety = RetrySafety(self.safety)
        except ValueError:
            allowed = "|".join(s.value for s in RetrySafety)
            raise PolicyError(
                "safety", f"retry policy safety must be one of {allowed}, got {self.safety!r}"
            ) from None
        object.__setattr__(self, "safety", safety)
        self.validate()

    def validate(self) -> None:
        """Raise PolicyError naming the first bad field; the admission rule is checked last."""
        _check_int("max_attempts", self.max_attempts, 1, MAX_ATTEMPTS_LIMIT)
        if type(self.retry_on_lost) is not bool:
            raise PolicyError(
                "retry_on_lost", f"retry policy retry_on_lost must be true or false, "
                f"got {type(self.retry_on_lost).__name__} {self.retry_on_lost!r}")
        _check_int("backoff_max_ms", self.backoff_max_ms, 0, BACKOFF_LIMIT_MS)
        _check_int("backoff_base_ms", self.backoff_base_ms, 0, BACKOFF_LIMIT_MS)
        if self.backoff_base_ms > self.backoff_max_ms:
            raise PolicyError(
                "backoff_base_ms", f"retry policy backoff_base_ms ({self.backoff_base_ms}) must not "
                f"exceed backoff_max_ms ({self.backoff_max_ms}); lower the base or raise the maximum")
        if not isinstance(self.safety, RetrySafety):
            raise PolicyError("safety", f"retry policy safety must be a RetrySafety, got {self.safety!r}")
        if self.retry_on_lost and self.max_attempts > 1 and self.safety is RetrySafety.UNKNOWN:
            raise PolicyError(
                "safety",
                "retrying a lost run may run the job twice, and its safety is unknown; "
                "pass --safety idempotent|deduplicated if a second run is harmless, "
                "or drop --retry-on-lost")

    @property
    def retries_when_lost(self) -> bool:
        """True when this policy can ever start another attempt after a lost one."""
        return (self.retry_on_lost and self.max_attempts > 1
                and self.safety is not RetrySafety.UNKNOWN)


def backoff_ms(policy: RetryPolicy, attempt_number: int) -> int:
    """The wait after lost attempt `attempt_number` (from 1): min(max, base * 2**(n-1)).

    Exponential so a worker fleet in trouble is not hammered, capped so a retry still happens.
    """
    if type(attempt_number) is not int or attempt_number < 1:
        raise ValueError(f"attempt_number must be an integer >= 1, got {attempt_number!r}")
    if policy.backoff_base_ms == 0:
        return 0
    exponent = min(attempt_number - 1, _MAX_EXPONENT)
    return min(policy.backoff_max_ms, policy.backoff_base_ms * 2 ** exponent)


@dataclass(frozen=True, slots=True)
class LostDecision:
    """What the retry step does with one lost run.

    `retry` True: the run goes to `retry_wait` until `next_attempt_at_ms` (error_code None).
    `retry` False: the run ends `failed` with `error_code` (next_attempt_at_ms None).
    """

    retry: bool
    error_code: str | None
    next_attempt_at_ms: int | None


def decide_lost(policy: RetryPolicy | None, attempts_used: int, now_ms: int) -> LostDecision:
    """Decide whether a lost run is retried, in the order SEMANTICS.md §10 step 2 gives.

    `attempts_used` is the number of the lost attempt (attempts are numbered from 1), `now_ms`
    the database time of the decision. A committed cancel intent wins over every outcome here;
    the caller checks it first and never asks this function about such a run.
    Rule order matters: a policy with `retry_on_lost`, safety `unknown` and `max_attempts` 1 (the
    one such combination admission lets through) ends RUN_LOST_RETRY_UNSAFE, not EXHAUSTED.
    """
    if type(attempts_used) is not int or attempts_used < 1:
        raise ValueError(f"attempts_used must be an integer >= 1, got {attempts_used!r}")
    if type(now_ms) is not int or now_ms < 0:
        raise ValueError(f"now_ms must be an integer >= 0, got {now_ms!r}")
    if policy is None or not policy.retry_on_lost:
        return LostDecision(False, ErrorCode.RUN_LOST_RETRY_DISABLED, None)
    if policy.safety is RetrySafety.UNKNOWN:
        return LostDecision(False, ErrorCode.RUN_LOST_RETRY_UNSAFE, None)
    if attempts_used >= policy.max_attempts:
        return LostDecision(False, ErrorCode.RUN_LOST_RETRY_EXHAUSTED, None)
    return LostDecision(True, None, now_ms + backoff_ms(policy, attempts_used))
