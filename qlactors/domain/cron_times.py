"""Cron expressions and fire times: validation, macros, zones, and the first occurrence after an
instant by SEMANTICS.md §8's zone rule. Pure: every time is passed in (UTC epoch seconds or
milliseconds). croniter does the calendar arithmetic and is imported lazily, so an idle runtime
without triggers never loads it; around DST changes its answers are corrected to Debian cron's
rule (qlactors.domain.cron_dst).
"""

from __future__ import annotations

import copy
import functools
import zoneinfo
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any

from ..errors import BadInput
from . import cron_dst

MAX_EXPR_CHARS = 768  # triggers.cron is String(768)
MAX_ZONE_CHARS = 64  # triggers.tz is String(64)
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
    _check_ranges(text, fields)
    expanded, seconds = " ".join(fields), len(fields) == 6
    try:
        aware = croniter(expanded, datetime.fromtimestamp(_PROBE_FROM_S, tz), second_at_beginning=seconds)
        naive = croniter(expanded, cron_dst.wall(_PROBE_FROM_S, tz), second_at_beginning=seconds)
    except (CroniterError, ValueError, TypeError, KeyError) as exc:
        raise CronError("cron", f"cron expression {text!r} is not valid: {exc}; {_FIELDS_HELP}") from None
    return _Template(aware, naive, tz, cron_dst.is_fixed_time(fields))


_FIELD_RANGES = (("minute", 0, 59), ("hour", 0, 23), ("day", 1, 31), ("month", 1, 12), ("weekday", 0, 7))
_SECOND_RANGE = ("second", 0, 59)


def _check_ranges(text: str, fields: list[str]) -> None:
    """Each number of each field within its range, the field named when one is not (croniter's
    own message names neither)."""
    if len(fields) not in (5, 6):
        return  # croniter's message, with the help on the count of fields
    ranges = ((_SECOND_RANGE,) if len(fields) == 6 else ()) + _FIELD_RANGES
    for field, (name, low, high) in zip(fields, ranges):
        for part in field.split(","):
            values, _, step = part.partition("/")
            if step.isdigit() and int(step) == 0:
                raise CronError("cron", f"cron expression {text!r} is not valid: {name} step 0 in {part!r}; "
                                        f"a step is 1 or more")
            for value in values.split("-"):
                if value.isdigit() and not low <= int(value) <= high:
                    raise CronError("cron", f"cron expression {text!r} is not valid: {name} {int(value)} is "
                                            f"out of range {low}-{high}")


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


def next_after_s(text: str, zone: str, after_s: int) -> int:
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
            if cron_dst.quiet_around(start, found, tz):
                pass  # no offset change near: croniter's answer stands (the common, cheap case)
            elif (repeat := _second_pass_fire(template, text, start)) is not None and repeat < found:
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
    next_after_s(text, "UTC", _PROBE_FROM_S)  # a valid schedule that never fires is refused too
    return CronExpr(text, len(_fields(text)) == 6)


def check_ms(name: str, value: object, low: int = 0) -> int:
    if type(value) is not int or not low <= value <= MAX_TIME_MS:
        raise ValueError(f"{name} must be an integer from {low} to {MAX_TIME_MS} (epoch ms), got {value!r}")
    return value


def next_fire_ms(expr: str, zone: str, after_ms: int) -> int:
    """The first fire time strictly after `after_ms`, computed by croniter in `zone`.

    Occurrences fall on whole seconds, so "after the second containing after_ms" is the same set.
    """
    check_ms("after_ms", after_ms, low=-1)
    return next_after_s(_normalise(expr), zone, after_ms // 1000) * 1000


def first_fire_at_or_after_ms(expr: str, zone: str, at_ms: int) -> int:
    """The first fire time at or after `at_ms` (a fire exactly at `at_ms` counts)."""
    return next_fire_ms(expr, zone, at_ms - 1)
