"""Which finished runs retention may retire, and which it must keep for now: pure rules, no I/O.

A finished run is kept while it is younger than the maximum age AND among the newest
`max_runs` finished runs of its task; past either bound it is due. Each bound is the task's own
(`task add|update --keep-days/--keep-runs`, a `TaskRetention`) where it has one, else the global
one from the config (`RetentionPolicies.for_task`). A due run is still held back
while anything may yet need its rows: it is not terminal, an executor journal row names one of
its attempts, or a receipt file of one of its attempts is still on disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Mapping

from ..errors import BadInput
from .numbers import parse_decimal, parse_whole

MIN_MAX_AGE_MS = 1
MAX_PAGE = 256
DAY_MS = 86_400_000
HOUR_MS = 3_600_000
# The bounds a user may set, globally (config knobs) or per task (--keep-days, --keep-runs).
KEEP_AGE_MS_RANGE = (HOUR_MS, 3_650 * DAY_MS)
KEEP_RUNS_RANGE = (1, 1_000_000)
# The other rows retention bounds (store/cadence/retention_sweep.py): a revoked API token's row is
# kept this long after its revocation; each task keeps this many newest history entries (what
# `task show` and the API read: store/intent/tasks.py MAX_HISTORY).
REVOKED_TOKENS_MS = 30 * DAY_MS
TASK_EVENTS_KEPT = 500
# That sweep runs at most this often (each of its reads scans what it bounds), sooner while a
# batch was full.
SWEEP_EVERY_MS = 60_000


class RetireReason(str, Enum):
    MAX_AGE = "max_age"
    MAX_RUNS = "max_runs"


class HoldReason(str, Enum):
    ACTIVE = "active"  # not terminal: never retired
    JOURNAL = "journal"  # an executor journal row still names one of its attempts
    RECEIPT = "receipt"  # a receipt file of one of its attempts is still on disk


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Keep a finished run while younger than `max_age_ms` and among its task's newest `max_runs`."""

    max_age_ms: int
    max_runs: int

    def __post_init__(self) -> None:
        if type(self.max_age_ms) is not int or self.max_age_ms < MIN_MAX_AGE_MS:
            raise ValueError(f"max_age_ms must be an integer >= {MIN_MAX_AGE_MS}, got {self.max_age_ms!r}")
        if type(self.max_runs) is not int or self.max_runs < 1:
            raise ValueError(f"max_runs must be an integer >= 1, got {self.max_runs!r}")

    def age_cutoff_ms(self, now_ms: int) -> int:
        """Runs finished at or before this time are past the maximum age."""
        return now_ms - self.max_age_ms

    def for_task(self, task_id: str | None) -> RetentionPolicy:
        """One policy for every task (see RetentionPolicies for per-task bounds)."""
        return self


class RetentionError(BadInput):
    """A retention bound out of range; nothing was written."""


@dataclass(frozen=True, slots=True)
class TaskRetention:
    """A task's own retention bounds; None in a field: the global bound (the config's) applies.

    Not part of a task revision: a run pins what it executes, while how long its history is kept
    is decided when it is retired, by the bounds in force then.
    """

    max_age_ms: int | None = None
    max_runs: int | None = None

    def __post_init__(self) -> None:
        lo, hi = KEEP_AGE_MS_RANGE
        if self.max_age_ms is not None and (type(self.max_age_ms) is not int or not lo <= self.max_age_ms <= hi):
            raise RetentionError(f"retention max_age_ms must be {lo} (an hour) to {hi} (3650 days), "
                                 f"got {self.max_age_ms!r}")
        lo, hi = KEEP_RUNS_RANGE
        if self.max_runs is not None and (type(self.max_runs) is not int or not lo <= self.max_runs <= hi):
            raise RetentionError(f"retention max_runs must be {lo} to {hi}, got {self.max_runs!r}")

    @property
    def is_default(self) -> bool:
        return self.max_age_ms is None and self.max_runs is None

    def over(self, default: RetentionPolicy) -> RetentionPolicy:
        """The policy in force for the task: its own bounds, the default's where it has none."""
        if self.is_default:
            return default
        return RetentionPolicy(max_age_ms=default.max_age_ms if self.max_age_ms is None else self.max_age_ms,
                               max_runs=default.max_runs if self.max_runs is None else self.max_runs)


@dataclass(frozen=True, slots=True)
class RetentionPolicies:
    """The global policy and the tasks that override it (task id -> its own bounds)."""

    default: RetentionPolicy
    tasks: Mapping[str, TaskRetention] = field(default_factory=dict)

    def for_task(self, task_id: str | None) -> RetentionPolicy:
        own = self.tasks.get(task_id) if task_id is not None else None
        return self.default if own is None else own.over(self.default)


def parse_keep_days(text: str) -> int | None:
    """`--keep-days DAYS` (fractional allowed; `default`: the global bound) -> milliseconds or None."""
    if text.strip().lower() == "default":
        return None
    days = parse_decimal("--keep-days", text, "days (or `default`)", RetentionError)
    lo, hi = KEEP_AGE_MS_RANGE
    if not lo <= round(days * DAY_MS) <= hi:
        raise RetentionError(f"--keep-days: {text} is out of range; give 0.0417 (an hour) to 3650 days, "
                             "or `default`")
    return round(days * DAY_MS)


def parse_keep_runs(text: str) -> int | None:
    """`--keep-runs N` (`default`: the global bound) -> N or None."""
    if text.strip().lower() == "default":
        return None
    runs = parse_whole("--keep-runs", text, RetentionError)
    lo, hi = KEEP_RUNS_RANGE
    if not lo <= runs <= hi:
        raise RetentionError(f"--keep-runs: {text} is out of range; give {lo} to {hi}, or `default`")
    return runs


@dataclass(frozen=True, slots=True)
class Candidate:
    """What retention knows about one run when it decides."""

    run_id: str
    terminal: bool
    finished_at_ms: int | None
    newer_in_task: int
    """How many finished runs of the same task finished after this one (0: the newest)."""
    journal_row: bool = False
    receipt_file: bool = False
    task_id: str | None = None
    """Whose bounds apply (RetentionPolicies.for_task); None: the default's."""


@dataclass(frozen=True, slots=True)
class Verdict:
    run_id: str
    retire: RetireReason | None
    hold: HoldReason | None

    @property
    def retired(self) -> bool:
        return self.retire is not None and self.hold is None


def retire_reason(policy: RetentionPolicy, now_ms: int, finished_at_ms: int | None,
                  newer_in_task: int) -> RetireReason | None:
    """Why a finished run is due (age first, then count), or None while it is kept."""
    if finished_at_ms is None:
        return None
    if finished_at_ms <= policy.age_cutoff_ms(now_ms):
        return RetireReason.MAX_AGE
    if newer_in_task >= policy.max_runs:
        return RetireReason.MAX_RUNS
    return None


def hold_reason(*, terminal: bool, journal_row: bool, receipt_file: bool) -> HoldReason | None:
    """Why a due run must be kept for now, or None when its rows and files may go."""
    if not terminal:
        return HoldReason.ACTIVE
    if journal_row:
        return HoldReason.JOURNAL
    if receipt_file:
        return HoldReason.RECEIPT
    return None


Policies = RetentionPolicy | RetentionPolicies


def judge(policy: Policies, now_ms: int, candidate: Candidate) -> Verdict:
    """The verdict on one run, by its task's bounds: due or not, and if due whether something holds it."""
    if not candidate.terminal:
        return Verdict(candidate.run_id, None, HoldReason.ACTIVE)
    reason = retire_reason(policy.for_task(candidate.task_id), now_ms, candidate.finished_at_ms,
                           candidate.newer_in_task)
    hold = None if reason is None else hold_reason(
        terminal=True, journal_row=candidate.journal_row, receipt_file=candidate.receipt_file)
    return Verdict(candidate.run_id, reason, hold)


def plan_page(policy: Policies, now_ms: int, candidates: Iterable[Candidate],
              page: int) -> list[Verdict]:
    """Verdicts in the order given (oldest first), stopping once `page` runs are to be retired."""
    if type(page) is not int or not 1 <= page <= MAX_PAGE:
        raise ValueError(f"a retention page holds 1 to {MAX_PAGE} runs")
    verdicts: list[Verdict] = []
    retiring = 0
    for candidate in candidates:
        if retiring >= page:
            break
        verdict = judge(policy, now_ms, candidate)
        verdicts.append(verdict)
        if verdict.retired:
            retiring += 1
    return verdicts
