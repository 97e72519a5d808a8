"""Which finished runs retention may retire, and which it must keep for now: pure rules, no I/O.

A finished run is kept while it is younger than the maximum age AND among the newest
`max_runs` finished runs of its task; past either bound it is due. A due run is still held back
while anything may yet need its rows: it is not terminal, an executor journal row names one of
its attempts, or a receipt file of one of its attempts is still on disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable

MIN_MAX_AGE_MS = 1
MAX_PAGE = 256


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


def judge(policy: RetentionPolicy, now_ms: int, candidate: Candidate) -> Verdict:
    """The verdict on one run: due or not, and if due whether something still holds it."""
    if not candidate.terminal:
        return Verdict(candidate.run_id, None, HoldReason.ACTIVE)
    reason = retire_reason(policy, now_ms, candidate.finished_at_ms, candidate.newer_in_task)
    hold = None if reason is None else hold_reason(
        terminal=True, journal_row=candidate.journal_row, receipt_file=candidate.receipt_file)
    return Verdict(candidate.run_id, reason, hold)


def plan_page(policy: RetentionPolicy, now_ms: int, candidates: Iterable[Candidate],
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
