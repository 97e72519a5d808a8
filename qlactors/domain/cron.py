"""Cron triggers: settings validation and the pure admission and overlap decisions.

The contract is SEMANTICS.md §8. Every time is UTC epoch milliseconds and is passed in: nothing
here reads a clock. Expressions, zones and fire times are qlactors.domain.cron_times' (re-exported
here: this module is the cron vocabulary the rest of qlactors imports).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Union

from .cron_times import (
    MACROS,
    MAX_EXPR_CHARS,
    MAX_TIME_MS,
    MAX_ZONE_CHARS,
    CronError,
    CronExpr,
    check_ms,
    check_zone,
    first_fire_at_or_after_ms,
    load_zone,
    next_after_s,
    next_fire_ms,
    parse_cron,
)
from .states import CancelReason

__all__ = [
    "MACROS", "MAX_EXPR_CHARS", "MAX_TIME_MS", "MAX_ZONE_CHARS", "CronError", "CronExpr", "check_zone",
    "first_fire_at_or_after_ms", "load_zone", "next_fire_ms", "parse_cron",
    "DEFAULT_GRACE_MS", "MAX_GRACE_SECONDS", "MAX_COUNTED_OCCURRENCES", "Misfire", "Overlap",
    "check_misfire", "check_overlap", "grace_ms_from_seconds", "check_grace_ms", "effective_grace_ms",
    "TriggerSpec", "Initialise", "Wait", "Admit", "Skip", "AdmissionDecision", "cron_idempotency_key",
    "decide_admission", "OverlapAction", "OverlapDecision", "decide_overlap",
]

DEFAULT_GRACE_MS = 30_000
# A week: a weekly job may still run if it is found late within its own period; anything longer
# is a typo. fire_once ignores the grace (SEMANTICS §8), so this only bounds `skip`.
MAX_GRACE_SECONDS = 7 * 86_400
# The missed-occurrence count is exact up to this many; beyond it the decision reports the bound
# and `missed_capped`. A week powered off with a per-second schedule is 604,800 occurrences:
# counting them all would cost about a minute per decision; 1,000 steps cost ~100 ms (a step
# is ~100 µs with the DST checks, measured on a shared two-core box).
MAX_COUNTED_OCCURRENCES = 1_000


class Misfire(str, Enum):
    """What happens to occurrences that passed while nothing could admit them."""

    FIRE_ONCE = "fire_once"
    SKIP = "skip"


class Overlap(str, Enum):
    """What a fire does when the task is already at `max_concurrent`."""

    QUEUE = "queue"
    SKIP = "skip"
    REPLACE = "replace"


def _choice(enum: type[Enum], field: str, value: object) -> Any:
    try:
        return enum(value)
    except (ValueError, TypeError):
        allowed = "|".join(m.value for m in enum)  # type: ignore[attr-defined]
        raise CronError(field, f"{field} must be one of {allowed}, got {value!r}") from None


def check_misfire(value: object) -> Misfire:
    """The misfire policy named by `value`, or CronError."""
    return _choice(Misfire, "misfire", value)


def check_overlap(value: object) -> Overlap:
    """The overlap policy named by `value`, or CronError."""
    return _choice(Overlap, "overlap", value)


def grace_ms_from_seconds(seconds: object) -> int:
    """`--grace SEC` as stored milliseconds; a whole number from 0 to MAX_GRACE_SECONDS."""
    if type(seconds) is not int or not 0 <= seconds <= MAX_GRACE_SECONDS:
        raise CronError("grace", f"grace must be a whole number of seconds from 0 to {MAX_GRACE_SECONDS}, "
                                 f"got {seconds!r}")
    return seconds * 1000


def check_grace_ms(grace_ms: object) -> int:
    """A stored grace in milliseconds, within the same bounds as `grace_ms_from_seconds`."""
    if type(grace_ms) is not int or not 0 <= grace_ms <= MAX_GRACE_SECONDS * 1000:
        raise CronError("grace", f"grace_ms must be an integer from 0 to {MAX_GRACE_SECONDS * 1000}, "
                                 f"got {grace_ms!r}")
    return grace_ms


def effective_grace_ms(grace_ms: int, tick_ms: int) -> int:
    """The grace actually applied: never below the cadence tick (SEMANTICS §8), or a schedule
    noticed one tick late would be skipped although nothing was down."""
    return max(grace_ms, tick_ms)


# --- the admission decision --------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TriggerSpec:
    """The columns of one trigger revision that admission reads; validated at construction."""

    trigger_id: str
    revision: int
    expr: str
    zone: str
    misfire: Misfire = Misfire.FIRE_ONCE
    grace_ms: int = DEFAULT_GRACE_MS

    def __post_init__(self) -> None:
        if type(self.trigger_id) is not str or not self.trigger_id:
            raise CronError("trigger_id", f"trigger_id must be a non-empty string, got {self.trigger_id!r}")
        if type(self.revision) is not int or self.revision < 1:
            raise CronError("revision", f"trigger revision must be an integer >= 1, got {self.revision!r}")
        object.__setattr__(self, "expr", parse_cron(self.expr).text)
        check_zone(self.zone)
        object.__setattr__(self, "misfire", check_misfire(self.misfire))
        check_grace_ms(self.grace_ms)


@dataclass(frozen=True, slots=True)
class Initialise:
    """First sight of the trigger (cursor NULL): store `cursor_ms`, admit nothing."""

    cursor_ms: int


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing is due before `next_due_ms`; keep (or store, if it differs) that cursor."""

    next_due_ms: int


@dataclass(frozen=True, slots=True)
class Admit:
    """Admit one run for `scheduled_for_ms` and compare-and-set the cursor to `new_cursor_ms`.

    `missed_count` occurrences were folded into it (one `missed` trigger event when > 0, its
    scheduled time `missed_first_ms`); exact unless `missed_capped`, which means "at least".
    """

    scheduled_for_ms: int
    new_cursor_ms: int
    missed_count: int
    missed_capped: bool
    missed_first_ms: int | None
    idempotency_key: str


@dataclass(frozen=True, slots=True)
class Skip:
    """Admit nothing (every due occurrence is past the grace under `skip`); move the cursor on and
    record `missed_count` occurrences from `missed_first_ms` as one `missed` trigger event."""

    new_cursor_ms: int
    missed_count: int
    missed_capped: bool
    missed_first_ms: int


AdmissionDecision = Union[Initialise, Wait, Admit, Skip]


def cron_idempotency_key(trigger_id: str, revision: int, scheduled_for_ms: int) -> str:
    """`cron:<trigger id>:<revision>:<scheduled for>`: unique on runs, so a replay finds the run."""
    return f"cron:{trigger_id}:{revision}:{scheduled_for_ms}"


def _count_due(text: str, zone: str, first_s: int, now_s: int,
               stop_after: int) -> tuple[int, int, int | None]:
    """(count, last, following): occurrences from `first_s` up to `now_s`, at most `stop_after`;
    `following` is the first one after `now_s`, or None when the count stopped early.

    Each step restarts croniter at the previous occurrence, exactly as `next_fire_ms` does: plain
    iteration can disagree with a restart around a spring-forward gap, and the count must match
    what step-by-step admission sees. A step costs ~100 µs (a cached parse, copied, and the DST checks).
    """
    count, last = 1, first_s
    while count < stop_after:
        following = next_after_s(text, zone, last)  # strictly after `last`: never stalls
        if following > now_s:
            return count, last, following
        count, last = count + 1, following
    return count, last, None


def _latest_at_or_before_s(text: str, zone: str, first_s: int, now_s: int) -> int:
    """The last occurrence <= now_s, knowing `first_s` <= now_s is one, in O(log range) croniter calls.

    Bisects on "the next occurrence after t is still due", so it agrees with `next_fire_ms`.
    Only used when the count stopped at its bound; otherwise the count already knows the answer.
    """
    if next_after_s(text, zone, first_s) > now_s:
        return first_s
    lo, hi = first_s, now_s  # next(lo) is due; next(hi) is not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if next_after_s(text, zone, mid) <= now_s:
            lo = mid
        else:
            hi = mid
    return next_after_s(text, zone, lo)


def decide_admission(spec: TriggerSpec, cursor_ms: int | None, now_ms: int, *,
                     initialise_from_ms: int | None = None, tick_ms: int = 0,
                     count_limit: int = MAX_COUNTED_OCCURRENCES) -> AdmissionDecision:
    """What one cycle does with one trigger, observed at `now_ms` (one observed time per cycle).

    `cursor_ms` is the stored `next_fire_at_ms`: the oldest occurrence not yet handled, None when
    not initialised (new trigger, new revision, or re-enabled task: the caller passes None then).
    Initialise takes the first occurrence at or after `initialise_from_ms` (the trigger's update
    time, or the re-enable time; default `now_ms`); a fire exactly at that time counts and is
    admitted by the next decision, which the caller may make at once with the same `now_ms`.
    When due, at most one run is admitted and the cursor moves past `now_ms` to croniter's next
    occurrence after the newest due one: never a backlog replay. `fire_once` runs the oldest due occurrence whatever its
    lateness; `skip` runs the newest due one only if it is at most max(grace, tick) late.
    At most `count_limit` missed occurrences are counted (see MAX_COUNTED_OCCURRENCES).
    """
    now_ms = check_ms("now_ms", now_ms)
    if type(count_limit) is not int or count_limit < 1:
        raise ValueError(f"count_limit must be an integer >= 1, got {count_limit!r}")
    text, zone = spec.expr, spec.zone
    if cursor_ms is None:
        start = now_ms if initialise_from_ms is None else check_ms("initialise_from_ms", initialise_from_ms)
        return Initialise(first_fire_at_or_after_ms(text, zone, start))
    cursor_ms = check_ms("cursor_ms", cursor_ms)
    if cursor_ms > now_ms:
        return Wait(cursor_ms)  # the idle path: no croniter call at all
    # The cursor is trusted as an occurrence: only this module computes it (Initialise, or the
    # occurrence after the last one handled), and an edited schedule is a new revision with a
    # NULL cursor. Recomputing it as "first at or after cursor" would be wrong: croniter 7 can
    # see an occurrence just after a spring-forward gap from before the gap but not from inside
    # it, so a restart one second earlier may skip the very fire the cursor names. A cursor off
    # the whole second cannot be an occurrence (a damaged row): only then is it recomputed.
    first_ms = cursor_ms
    if cursor_ms % 1000:
        first_ms = first_fire_at_or_after_ms(text, zone, cursor_ms)
        if first_ms > now_ms:
            return Wait(first_ms)
    return _decide_due(spec, first_ms, now_ms, tick_ms, count_limit)


def _decide_due(spec: TriggerSpec, first_ms: int, now_ms: int, tick_ms: int, count_limit: int) -> AdmissionDecision:
    """The decision once the oldest unhandled occurrence `first_ms` is due (at or before `now_ms`)."""
    text, zone = spec.expr, spec.zone
    first_s, now_s = first_ms // 1000, now_ms // 1000
    # One admitted plus count_limit missed, plus one more to know the count went past the bound.
    due, last_s, following_s = _count_due(text, zone, first_s, now_s, count_limit + 2)
    complete = following_s is not None
    latest_s = last_s if complete else _latest_at_or_before_s(text, zone, first_s, now_s)
    # The cursor goes to croniter's next occurrence after the newest due one: that is the next
    # occurrence after now, and unlike a restart at `now` it cannot step over a fire croniter
    # places just after a spring-forward gap (seen with croniter 7 in Australia/Sydney).
    new_cursor_s = following_s if complete else next_after_s(text, zone, latest_s)
    if new_cursor_s <= now_s:  # only if croniter were not monotone: never leave a due cursor
        new_cursor_s = next_after_s(text, zone, now_s)
    new_cursor_ms = new_cursor_s * 1000
    latest_ms = latest_s * 1000

    def missed(n: int) -> tuple[int, bool]:
        return (n, False) if complete and n <= count_limit else (min(n, count_limit), True)

    if spec.misfire is Misfire.FIRE_ONCE:
        count, capped = missed(due - 1)
        second_ms = None if due == 1 else next_after_s(text, zone, first_s) * 1000
        return Admit(first_ms, new_cursor_ms, count, capped, second_ms,
                     cron_idempotency_key(spec.trigger_id, spec.revision, first_ms))
    if now_ms - latest_ms <= effective_grace_ms(spec.grace_ms, tick_ms):
        count, capped = missed(due - 1)
        return Admit(latest_ms, new_cursor_ms, count, capped, first_ms if due > 1 else None,
                     cron_idempotency_key(spec.trigger_id, spec.revision, latest_ms))
    count, capped = missed(due)
    return Skip(new_cursor_ms, count, capped, first_ms)


# --- the overlap decision ----------------------------------------------------------------------

class OverlapAction(str, Enum):
    ADMIT = "admit"
    SKIP = "skip"  # admit nothing; record a `skipped` trigger event
    ADMIT_AND_CANCEL = "admit_and_cancel"


@dataclass(frozen=True, slots=True)
class OverlapDecision:
    """What a due fire does given the task's load; `cancel_*` set only for ADMIT_AND_CANCEL."""

    action: OverlapAction
    cancel_run_id: str | None = None
    cancel_reason: CancelReason | None = None


def decide_overlap(policy: Overlap | str, max_concurrent: int, active_runs: int,
                   oldest_running_run_id: str | None = None, *, queued_runs: int = 0,
                   max_queued: int = 1) -> OverlapDecision:
    """Apply the overlap policy when a fire is due (SEMANTICS §8).

    `active_runs` counts the task's runs that hold one of its `max_concurrent` places (the same
    count dispatch uses); `oldest_running_run_id` is the oldest of them without a cancel intent.
    Below the limit every policy admits. At the limit: `queue` admits (the run waits) while
    fewer than `max_queued` of the task's cron runs wait `queued` (`queued_runs`: manual runs
    and retries are never counted), else admits nothing, like `skip`; `replace` admits and
    cancels the oldest with reason `policy` — or just admits when no such run is known (all
    already cancelling), since there is nothing left to replace.
    """
    policy = check_overlap(policy)
    for name, value, low in (("max_concurrent", max_concurrent, 1), ("active_runs", active_runs, 0),
                             ("queued_runs", queued_runs, 0), ("max_queued", max_queued, 1)):
        if type(value) is not int or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if active_runs < max_concurrent:
        return OverlapDecision(OverlapAction.ADMIT)
    if policy is Overlap.QUEUE:
        return OverlapDecision(OverlapAction.ADMIT if queued_runs < max_queued else OverlapAction.SKIP)
    if policy is Overlap.SKIP:
        return OverlapDecision(OverlapAction.SKIP)
    if oldest_running_run_id is None:
        return OverlapDecision(OverlapAction.ADMIT)
    return OverlapDecision(OverlapAction.ADMIT_AND_CANCEL, oldest_running_run_id, CancelReason.POLICY)
