"""Cron triggers: settings validation, fire-time arithmetic and the pure admission and overlap decisions.

The contract is SEMANTICS.md §8. Every time is UTC epoch milliseconds and is passed in: nothing
here reads a clock. croniter does the calendar arithmetic and is imported lazily, so an idle
runtime without triggers never loads it; around DST changes its answers are corrected to
Debian cron's rule (qlactors.domain.cron_dst).
"""

from __future__ import annotations

import copy
import functools
import zoneinfo
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from enum import Enum
from typing import Any, Union

from ..errors import BadInput
from . import cron_dst
from .states import CancelReason

MAX_EXPR_CHARS = 768  # triggers.cron is String(768)
MAX_ZONE_CHARS = 64  # triggers.tz is String(64)
DEFAULT_GRACE_MS = 30_000
# A week: a weekly job may still run if it is found late within its own period; anything longer
# is a typo. fire_once ignores the grace (SEMANTICS §8), so this only bounds `skip`.
MAX_GRACE_SECONDS = 7 * 86_400
# The missed-occurrence count is exact up to this many; beyond it the decision reports the bound
# and `missed_capped`. A week powered off with a per-second schedule is 604,800 occurrences:
# counting them all would cost ~25 s of croniter time per decision; 1,000 steps cost ~40 ms.
MAX_COUNTED_OCCURRENCES = 1_000
# Steps one fire-time search may take past croniter answers that the zone rule corrects.
_MAX_CORRECTIONS = 16
_SECOND = timedelta(seconds=1)
# Year 4000: croniter searches up to 50 years ahead, far from datetime's year-9999 edge.
MAX_TIME_MS = 64_060_588_800_000
# Fixed reference for "does this expression ever fire" checks, so validation stays pure.
_PROBE_FROM_S = 946_684_800  # 2000-01-01T00:00:00Z

_FIELDS_HELP = ("write five fields (minute hour day month weekday), or six with seconds first "
                "(second minute hour day month weekday), e.g. '*/5 * * * * *' for every five seconds, "
                "or a macro (@hourly @daily @midnight @weekly @monthly @yearly @annually)")
# Macros mean their five-field forms (Debian cron's crontab(5)); the macro itself is what is stored.
MACROS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}


class CronError(BadInput):
    """A trigger setting that is refused; `field` names it (cron, zone, misfire, grace, overlap...)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


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


# --- zones -------------------------------------------------------------------------------------

_NO_DATABASE = ("no time zone database found (Python's zoneinfo looked in {path} and for the "
                "'tzdata' Python package); install one: `apt-get install tzdata` (Debian/Ubuntu), "
                "`apk add tzdata` (Alpine) or `pip install tzdata`")


def _database_present() -> bool:
    try:
        zoneinfo.ZoneInfo("UTC")
        return True
    except zoneinfo.ZoneInfoNotFoundError:
        return False


def load_zone(name: object) -> tzinfo:
    """The tzinfo of IANA zone `name`, or CronError saying whether the name or the database is wrong."""
    if type(name) is not str or not name or len(name) > MAX_ZONE_CHARS:
        raise CronError("zone", f"time zone must be an IANA name such as Europe/Berlin or UTC "
                                f"(at most {MAX_ZONE_CHARS} characters), got {name!r}")
    try:
        return zoneinfo.ZoneInfo(name)
    except zoneinfo.ZoneInfoNotFoundError:
        if _database_present():
            raise CronError("zone", f"unknown time zone {name!r}: use an IANA name such as "
                                    f"Europe/Berlin, America/New_York or UTC") from None
        if name in ("UTC", "Etc/UTC"):
            return timezone.utc  # UTC has no rules: a box without tzdata can still use it
        raise CronError("zone", _NO_DATABASE.format(path=":".join(zoneinfo.TZPATH))) from None
    except (ValueError, OSError):  # not a relative key, a directory, or not a TZif file
        raise CronError("zone", f"{name!r} is not a time zone name: use an IANA name such as "
                                f"Europe/Berlin or UTC") from None


def check_zone(name: object) -> str:
    """`name` itself once it is known to load; what a trigger stores."""
    load_zone(name)
    return name  # type: ignore[return-value]


# --- expressions and fire times ----------------------------------------------------------------

def _normalise(expr: object) -> str:
    """The expression with single spaces between fields; refuses anything not 5 or 6 fields."""
    if type(expr) is not str:
        raise CronError("cron", f"cron expression must be a string, got {type(expr).__name__} {expr!r}")
    if len(expr) > MAX_EXPR_CHARS:
        raise CronError("cron", f"cron expression is longer than {MAX_EXPR_CHARS} characters")
    if expr.strip().startswith("@"):
        return _macro(expr.strip())
    fields = expr.split()
    if len(fields) not in (5, 6):
        plural = "" if len(fields) == 1 else "s"
        raise CronError("cron", f"cron expression {expr!r} has {len(fields)} field{plural}; {_FIELDS_HELP}")
    return " ".join(fields)


def _macro(name: str) -> str:
    if name == "@reboot":
        raise CronError("cron", "cron macro '@reboot' is not supported: qlactors fires on the clock, not at boot; "
                                "start the job from your init system, or use a schedule such as @daily")
    if name not in MACROS:
        raise CronError("cron", f"unknown cron macro {name!r}; use one of {' '.join(MACROS)} "
                                f"(lower case), or write the fields")
    return name


def _fields(text: str) -> list[str]:
    """The fields of a normalised expression, a macro expanded to its five-field form."""
    return MACROS.get(text, text).split()


@dataclass(frozen=True, slots=True)
class _Template:
    """Parsed croniters for one (expression, zone): `aware` iterates in the zone, `naive` on wall
    times; `fixed` tells which DST rule applies (cron_dst)."""

    aware: Any
    naive: Any
    tz: tzinfo
    fixed: bool


@functools.lru_cache(maxsize=1024)
def _template(text: str, zone: str) -> _Template:
    """Parsed croniters for (expression, zone), copied per use: parsing costs ~150 µs, a copy ~5 µs.

    Cached objects are never advanced themselves, so sharing them between threads is safe.
    """
    from croniter import croniter, CroniterError  # lazy: see the module docstring

    tz = load_zone(zone)
    fields = _fields(text)
    expanded, seconds = " ".join(fields), len(fields) == 6
    try:
        aware = croniter(expanded, datetime.fromtimestamp(_PROBE_FROM_S, tz), second_at_beginning=seconds)
        naive = croniter(expanded, cron_dst.wall(_PROBE_FROM_S, tz), second_at_beginning=seconds)
    except (CroniterError, ValueError, TypeError, KeyError) as exc:
        raise CronError("cron", f"cron expression {text!r} is not valid: {exc}; {_FIELDS_HELP}") from None
    return _Template(aware, naive, tz, cron_dst.is_fixed_time(fields))


def _never(text: str) -> CronError:
    return CronError("cron", f"cron expression {text!r} never fires (no match within 50 years); "
                             f"check the day and month fields")


def _next_wall(template: _Template, text: str, after: datetime) -> datetime:
    """The first matching wall time strictly after the naive wall time `after` (no zone involved)."""
    from croniter import CroniterBadDateError

    try:
        return copy.copy(template.naive).get_next(datetime, after)
    except CroniterBadDateError:
        raise _never(text) from None


def _next_after_s(text: str, zone: str, after_s: int) -> int:
    """The first occurrence strictly after second `after_s`, in whole seconds, by the zone rule
    of SEMANTICS §8: croniter's answer, corrected where it differs (see cron_dst)."""
    from croniter import CroniterBadDateError

    template = _template(text, zone)
    tz = template.tz
    found, start = None, after_s
    for _ in range(_MAX_CORRECTIONS):
        if template.fixed:
            # Wall times in order map to instants in order (first instant of a repeated time, the
            # end of the gap for a missing one), so the first wall after the start is the answer.
            local = _next_wall(template, text, cron_dst.fixed_search_start(start, tz))
            found = cron_dst.fixed_instant_s(local, tz)
        else:
            try:
                found = int(copy.copy(template.aware).get_next(float, datetime.fromtimestamp(start, tz)))
            except CroniterBadDateError:
                raise _never(text) from None
            repeat = _second_pass_fire(template, text, start)
            if repeat is not None and repeat < found:
                found = repeat  # croniter skipped a fire in the second pass of a repeated hour
            elif not (cron_dst.steady_between(start, found, tz) or _wall_matches(template, text, found)):
                # croniter maps a time missing in a gap to an instant after it; a wildcard entry
                # does not fire there. Without an offset change in between that cannot happen.
                start = found
                continue
        if found > after_s:
            return found
        start = found
    raise CronError("cron", f"no occurrence of {text!r} found after {after_s} (last {found}); this is a bug")


def _second_pass_fire(template: _Template, text: str, after_s: int) -> int | None:
    """The first wildcard fire after `after_s` inside the second pass of a nearby repeated hour."""
    repeat = cron_dst.second_pass_near(after_s, template.tz)
    if repeat is None:
        return None
    local = _next_wall(template, text, repeat.after)
    return cron_dst.at_offset_s(local, repeat.offset_s) if local < repeat.end else None


def _wall_matches(template: _Template, text: str, instant_s: int) -> bool:
    local = cron_dst.wall(instant_s, template.tz)
    return _next_wall(template, text, local - _SECOND) == local


@dataclass(frozen=True, slots=True)
class CronExpr:
    """A validated expression: `text` has single spaces; `has_seconds` when six fields, seconds first."""

    text: str
    has_seconds: bool


def parse_cron(expr: object) -> CronExpr:
    """Validate a user's cron expression: 5 or 6 fields, croniter accepts it, and it ever fires."""
    text = _normalise(expr)
    _next_after_s(text, "UTC", _PROBE_FROM_S)  # a valid schedule that never fires is refused too
    return CronExpr(text, len(_fields(text)) == 6)


def _check_ms(name: str, value: object, low: int = 0) -> int:
    if type(value) is not int or not low <= value <= MAX_TIME_MS:
        raise ValueError(f"{name} must be an integer from {low} to {MAX_TIME_MS} (epoch ms), got {value!r}")
    return value


def next_fire_ms(expr: str, zone: str, after_ms: int) -> int:
    """The first fire time strictly after `after_ms`, computed by croniter in `zone`.

    Occurrences fall on whole seconds, so "after the second containing after_ms" is the same set.
    """
    _check_ms("after_ms", after_ms, low=-1)
    return _next_after_s(_normalise(expr), zone, after_ms // 1000) * 1000


def first_fire_at_or_after_ms(expr: str, zone: str, at_ms: int) -> int:
    """The first fire time at or after `at_ms` (a fire exactly at `at_ms` counts)."""
    return next_fire_ms(expr, zone, at_ms - 1)


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
    what step-by-step admission sees. A step costs ~40 µs (a cached parse, copied).
    """
    count, last = 1, first_s
    while count < stop_after:
        following = _next_after_s(text, zone, last)  # strictly after `last`: never stalls
        if following > now_s:
            return count, last, following
        count, last = count + 1, following
    return count, last, None


def _latest_at_or_before_s(text: str, zone: str, first_s: int, now_s: int) -> int:
    """The last occurrence <= now_s, knowing `first_s` <= now_s is one, in O(log range) croniter calls.

    Bisects on "the next occurrence after t is still due", so it agrees with `next_fire_ms`.
    Only used when the count stopped at its bound; otherwise the count already knows the answer.
    """
    if _next_after_s(text, zone, first_s) > now_s:
        return first_s
    lo, hi = first_s, now_s  # next(lo) is due; next(hi) is not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _next_after_s(text, zone, mid) <= now_s:
            lo = mid
        else:
            hi = mid
    return _next_after_s(text, zone, lo)


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
    now_ms = _check_ms("now_ms", now_ms)
    if type(count_limit) is not int or count_limit < 1:
        raise ValueError(f"count_limit must be an integer >= 1, got {count_limit!r}")
    text, zone = spec.expr, spec.zone
    if cursor_ms is None:
        start = now_ms if initialise_from_ms is None else _check_ms("initialise_from_ms", initialise_from_ms)
        return Initialise(first_fire_at_or_after_ms(text, zone, start))
    cursor_ms = _check_ms("cursor_ms", cursor_ms)
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
    first_s, now_s = first_ms // 1000, now_ms // 1000
    # One admitted plus count_limit missed, plus one more to know the count went past the bound.
    due, last_s, following_s = _count_due(text, zone, first_s, now_s, count_limit + 2)
    complete = following_s is not None
    latest_s = last_s if complete else _latest_at_or_before_s(text, zone, first_s, now_s)
    # The cursor goes to croniter's next occurrence after the newest due one: that is the next
    # occurrence after now, and unlike a restart at `now` it cannot step over a fire croniter
    # places just after a spring-forward gap (seen with croniter 7 in Australia/Sydney).
    new_cursor_s = following_s if complete else _next_after_s(text, zone, latest_s)
    if new_cursor_s <= now_s:  # only if croniter were not monotone: never leave a due cursor
        new_cursor_s = _next_after_s(text, zone, now_s)
    new_cursor_ms = new_cursor_s * 1000
    latest_ms = latest_s * 1000

    def missed(n: int) -> tuple[int, bool]:
        return (n, False) if complete and n <= count_limit else (min(n, count_limit), True)

    if spec.misfire is Misfire.FIRE_ONCE:
        count, capped = missed(due - 1)
        second_ms = None if due == 1 else _next_after_s(text, zone, first_s) * 1000
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
