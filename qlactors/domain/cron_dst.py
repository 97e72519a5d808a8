"""Wall-clock time and instants around DST changes, for cron's zone rule (SEMANTICS.md §8, Debian cron's).

An entry whose minute and hour fields hold no `*` is a *fixed-time* entry: it fires at most once
for each matching wall-clock time of a local day. A time repeated on a fall-back day fires at its
first instant only, and a time inside a spring-forward gap fires once, at the first instant after
the gap. Any other entry is a *wildcard* entry: it follows the local time as it is, so it fires in
both passes of a repeated hour and never at a wall time that does not exist.

Everything here is pure arithmetic on whole UTC seconds and naive (wall-clock) datetimes; the
calendar matching itself stays croniter's (qlactors.domain.cron_times).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone, tzinfo
from dataclasses import dataclass
from typing import Callable

# No zone changes its offset twice within this long, and no change moves the clock by more: the
# windows below are searched for exactly one transition.
_SEARCH_S = 86_400
# No change moves the clock by more than two hours, and changes are further apart than twice this.
_NEAR_S = 3 * 3600


def is_fixed_time(fields: list[str]) -> bool:
    """True for a fixed-time entry: `fields` (5, or 6 with seconds first) have no `*` in the
    minute and hour fields (`*` and `*/n` alike, as Debian cron reads them)."""
    minute, hour = (fields[1], fields[2]) if len(fields) == 6 else (fields[0], fields[1])
    return "*" not in minute and "*" not in hour


def wall(instant_s: int, tz: tzinfo) -> datetime:
    """The naive local wall-clock time at `instant_s`."""
    return datetime.fromtimestamp(instant_s, tz).replace(tzinfo=None)


def _first_true(lo: int, hi: int, pred: Callable[[int], bool]) -> int:
    """The smallest second in (lo, hi] where `pred` holds, knowing pred(lo) is false, pred(hi)
    true and pred monotone on the range."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid
    return hi


def fixed_instant_s(local: datetime, tz: tzinfo) -> int:
    """The one instant a fixed-time entry fires for wall time `local`: its first instant when
    the time is repeated, the first instant after the gap when the time does not exist."""
    first = int(local.replace(tzinfo=tz, fold=0).timestamp())
    if wall(first, tz) == local:
        return first
    # In a gap, fold=0 reads the time with the offset before the change (an instant after the
    # gap) and fold=1 with the one after (an instant before it): the change lies between them.
    before = int(local.replace(tzinfo=tz, fold=1).timestamp())
    lo, hi = min(before, first), max(before, first)
    return _first_true(lo, hi, lambda s: wall(s, tz) > local)


def fixed_search_start(after_s: int, tz: tzinfo) -> datetime:
    """The naive wall time strictly after which the next fixed-time occurrence after `after_s`
    lies. Usually the wall time of `after_s`; inside the second pass of a repeated hour, every
    repeated time already fired in the first pass, so the search starts at the hour's end."""
    at = datetime.fromtimestamp(after_s, tz)
    if not at.fold:
        return at.replace(tzinfo=None)
    change = _first_true(after_s - _SEARCH_S, after_s,
                         lambda s: datetime.fromtimestamp(s, tz).fold == 1)
    # The first pass ended one second before `change`, at the last repeated wall time.
    return wall(change - 1, tz)


def steady_between(a_s: int, b_s: int, tz: tzinfo) -> bool:
    """True when no offset change can lie between `a_s` and `b_s` (same offset, under a day apart)."""
    if b_s - a_s >= _SEARCH_S:
        return False
    return datetime.fromtimestamp(a_s, tz).utcoffset() == datetime.fromtimestamp(b_s, tz).utcoffset()



def _offset_s(instant_s: int, tz: tzinfo) -> int:
    return int(datetime.fromtimestamp(instant_s, tz).utcoffset().total_seconds())


def at_offset_s(local: datetime, offset_s: int) -> int:
    """The instant of naive wall time `local` read with UTC offset `offset_s`."""
    return int(local.replace(tzinfo=timezone(timedelta(seconds=offset_s))).timestamp())


@dataclass(frozen=True, slots=True)
class SecondPass:
    """The second pass of a repeated hour near an instant: its wall times are [`start`, `end`)
    read with offset `offset_s`; `after` is the wall time strictly after which the second-pass
    fires still to come (after the instant searched from) lie."""

    start: datetime
    end: datetime
    offset_s: int
    after: datetime


def second_pass_near(after_s: int, tz: tzinfo) -> SecondPass | None:
    """The second pass of a fall-back within a few hours of `after_s`, if any, for a wildcard
    entry's search: only there can a fire after `after_s` come before the next one in plain
    wall-clock order (croniter misses some, e.g. Australia/Lord_Howe's half-hour repeat)."""
    lo, hi = after_s - _NEAR_S, after_s + _NEAR_S
    before, after = _offset_s(lo, tz), _offset_s(hi, tz)
    if after >= before:
        return None
    change = _first_true(lo, hi, lambda s: _offset_s(s, tz) == after)
    start = wall(change, tz)
    end = start + timedelta(seconds=before - after)
    if after_s >= change + (before - after):
        return None  # already past the second pass
    here = datetime.fromtimestamp(after_s + after, timezone.utc).replace(tzinfo=None)
    return SecondPass(start, end, after, max(start - timedelta(seconds=1), here))


def quiet_around(after_s: int, found_s: int, tz: tzinfo) -> bool:
    """True when no offset change lies within a few hours of `after_s` and `found_s` is within
    them too: then neither a gap nor a repeated hour can be involved in that step."""
    if found_s - after_s > _NEAR_S:
        return False
    return _offset_s(after_s - _NEAR_S, tz) == _offset_s(after_s + _NEAR_S, tz)
