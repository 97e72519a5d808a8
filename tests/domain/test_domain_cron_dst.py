"""Zones and DST as SEMANTICS.md §8 says (Debian cron's rule), and the cron macros.

Expected instants are written out by hand in UTC from the rule, never taken from croniter: a
fixed-time entry (no `*` in its minute and hour fields) fires once per matching wall-clock time
of a local day (a repeated time at its first instant, a missing one at the end of the gap); a
wildcard entry follows the local time as it is (both passes of a repeated hour, nothing for a
wall time that does not exist).
"""

from __future__ import annotations

import zoneinfo
from datetime import datetime, timedelta, timezone

import pytest
from croniter import croniter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qlactors.domain import cron_dst
from qlactors.domain.cron import (
    MACROS,
    CronError,
    TriggerSpec,
    decide_admission,
    first_fire_at_or_after_ms,
    next_fire_ms,
    parse_cron,
)

HOUR, DAY = 3_600_000, 86_400_000


def utc(*args: int) -> int:
    return int(datetime(*args, tzinfo=timezone.utc).timestamp()) * 1000


def fires(expr: str, zone: str, lo_ms: int, hi_ms: int) -> list[int]:
    """Every fire in [lo_ms, hi_ms], walked one `next_fire_ms` at a time (as admission walks)."""
    out, t = [], first_fire_at_or_after_ms(expr, zone, lo_ms)
    while t <= hi_ms:
        out.append(t)
        t = next_fire_ms(expr, zone, t)
    return out


# --- the fall-back day: a repeated wall time fires once, at its first instant ------------------

FALL_BACK = [
    # Europe/Berlin 2026-10-25 03:00 CEST -> 02:00 CET (01:00 UTC): 02:00..03:00 twice
    ("0 2 * * *", "Europe/Berlin", (2026, 10, 24, 12),
     [(2026, 10, 25, 0, 0), (2026, 10, 26, 1, 0)]),
    ("15 2,3 * * *", "Europe/Berlin", (2026, 10, 24, 12),
     [(2026, 10, 25, 0, 15), (2026, 10, 25, 2, 15), (2026, 10, 26, 1, 15), (2026, 10, 26, 2, 15)]),
    # America/New_York 2026-11-01 02:00 EDT -> 01:00 EST (06:00 UTC): 01:00..02:00 twice
    ("0 1 * * *", "America/New_York", (2026, 10, 31, 12),
     [(2026, 11, 1, 5, 0), (2026, 11, 2, 6, 0)]),
    ("30 1 * * *", "America/New_York", (2026, 10, 31, 12),
     [(2026, 11, 1, 5, 30), (2026, 11, 2, 6, 30)]),
    # Europe/London 2026-10-25 02:00 BST -> 01:00 GMT (01:00 UTC): 01:00..02:00 twice
    ("0 1 * * *", "Europe/London", (2026, 10, 24, 12),
     [(2026, 10, 25, 0, 0), (2026, 10, 26, 1, 0)]),
    ("30 1 * * *", "Europe/London", (2026, 10, 24, 12),
     [(2026, 10, 25, 0, 30), (2026, 10, 26, 1, 30)]),
    # Australia/Lord_Howe 2026-04-05 02:00 +11 -> 01:30 +10:30 (15:00 UTC on the 4th): half an hour
    ("30 1 * * *", "Australia/Lord_Howe", (2026, 4, 3, 12),
     [(2026, 4, 3, 14, 30), (2026, 4, 4, 14, 30), (2026, 4, 5, 15, 0)]),
    # Pacific/Chatham 2026-04-05 03:45 +13:45 -> 02:45 +12:45 (14:00 UTC on the 4th): 02:45..03:45 twice
    ("0 3 * * *", "Pacific/Chatham", (2026, 4, 3, 12),
     [(2026, 4, 3, 13, 15), (2026, 4, 4, 13, 15), (2026, 4, 5, 14, 15)]),
    # six fields, seconds first: 02:30:10 in Berlin on the fall-back day, once
    ("10 30 2 * * *", "Europe/Berlin", (2026, 10, 24, 12),
     [(2026, 10, 25, 0, 30, 10), (2026, 10, 26, 1, 30, 10)]),
    # a fixed minute and hour with every second: each of the 60 wall times once, in the first pass
    ("* 30 2 25 10 *", "Europe/Berlin", (2026, 10, 24, 12),
     [(2026, 10, 25, 0, 30, s) for s in range(60)]),
]


@pytest.mark.parametrize("expr,zone,start,expected", FALL_BACK, ids=[f"{c[0]} {c[1]}" for c in FALL_BACK])
def test_a_fixed_time_repeated_on_a_fall_back_day_fires_once(expr, zone, start, expected):
    lo = utc(*start)
    want = [utc(*t) for t in expected]
    assert fires(expr, zone, lo, want[-1] + 1) == want


def test_inside_the_second_pass_the_next_fixed_fire_is_after_the_repeated_hour():
    # observed at 02:30 CET (the second 02:30 of the day): 02:15 and 03:15 already had their one
    # fire (00:15 UTC) or come next at 03:15 CET (02:15 UTC)
    second_pass = utc(2026, 10, 25, 1, 30)
    assert next_fire_ms("15 2,3 * * *", "Europe/Berlin", second_pass) == utc(2026, 10, 25, 2, 15)
    assert next_fire_ms("0 2 * * *", "Europe/Berlin", second_pass) == utc(2026, 10, 26, 1)
    assert next_fire_ms("0 1 * * *", "America/New_York", utc(2026, 11, 1, 6, 59)) == utc(2026, 11, 2, 6)


# --- wildcard entries follow the new local time -----------------------------------------------

def test_wildcard_entries_fire_in_both_passes_of_the_repeated_hour():
    quarter = [utc(2026, 10, 25, 0, m) for m in (0, 15, 30, 45)] + \
              [utc(2026, 10, 25, 1, m) for m in (0, 15, 30, 45)] + [utc(2026, 10, 25, 2, 0)]
    assert fires("*/15 * * * *", "Europe/Berlin", utc(2026, 10, 25, 0), utc(2026, 10, 25, 2)) == quarter
    # 00:00 CEST, 02:00 CEST, 02:00 CET, 04:00 CET, 06:00 CET
    two_hourly = [utc(2026, 10, 24, 22), utc(2026, 10, 25, 0), utc(2026, 10, 25, 1), utc(2026, 10, 25, 3),
                  utc(2026, 10, 25, 5)]
    assert fires("0 */2 * * *", "Europe/Berlin", utc(2026, 10, 24, 21), utc(2026, 10, 25, 5)) == two_hourly
    assert fires("30 1 * * *", "America/New_York", utc(2026, 11, 1), utc(2026, 11, 1, 12)) == \
        [utc(2026, 11, 1, 5, 30)]  # fixed: once
    assert fires("30 * * * *", "America/New_York", utc(2026, 11, 1, 4), utc(2026, 11, 1, 7)) == \
        [utc(2026, 11, 1, 4, 30), utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 6, 30)]  # 00:30, 01:30 twice


def test_a_wildcard_entry_does_not_fire_at_a_wall_time_missing_in_a_gap():
    # Berlin 2026-03-29 02:00 CET -> 03:00 CEST (01:00 UTC): 02:00 does not exist, 03:00 does
    # not match `*/2`; croniter would fire at 03:00 CEST for the missing 02:00
    assert fires("0 */2 * * *", "Europe/Berlin", utc(2026, 3, 28, 22), utc(2026, 3, 29, 4)) == \
        [utc(2026, 3, 28, 23), utc(2026, 3, 29, 2), utc(2026, 3, 29, 4)]
    assert fires("*/30 * * * *", "Europe/Berlin", utc(2026, 3, 29, 0), utc(2026, 3, 29, 2)) == \
        [utc(2026, 3, 29, 0), utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1), utc(2026, 3, 29, 1, 30),
         utc(2026, 3, 29, 2)]
    # six fields, hour 2 only: nothing at all on the day hour 2 is skipped
    day = fires("5,35 * 2 * * *", "Australia/Sydney", utc(2026, 10, 3, 14), utc(2026, 10, 4, 14))
    assert day == []  # Sydney 2026-10-04 02:00 AEST -> 03:00 AEDT (16:00 UTC on the 3rd)


# --- the spring-forward gap: a missing fixed time fires once, at the end of the gap ------------

SPRING_FORWARD = [
    ("30 2 * * *", "Europe/Berlin", (2026, 3, 28, 12), [(2026, 3, 29, 1, 0), (2026, 3, 30, 0, 30)]),
    # both missing times fire once together at 03:00 CEST; 02:00 CEST the next day is normal
    ("0,30 2 * * *", "Europe/Berlin", (2026, 3, 28, 12),
     [(2026, 3, 29, 1, 0), (2026, 3, 30, 0, 0), (2026, 3, 30, 0, 30)]),
    # 02:15 is missing (fires at 03:00 CEST), 03:15 CEST is normal
    ("15 2,3 * * *", "Europe/Berlin", (2026, 3, 28, 12),
     [(2026, 3, 29, 1, 0), (2026, 3, 29, 1, 15), (2026, 3, 30, 0, 15)]),
    # 02:00 and 03:00 CEST are one instant: one fire
    ("0 2,3 * * *", "Europe/Berlin", (2026, 3, 28, 12),
     [(2026, 3, 29, 1, 0), (2026, 3, 30, 0, 0)]),
    # America/New_York 2026-03-08 02:00 EST -> 03:00 EDT (07:00 UTC)
    ("30 2 * * *", "America/New_York", (2026, 3, 7, 12), [(2026, 3, 8, 7, 0), (2026, 3, 9, 6, 30)]),
    # Australia/Lord_Howe 2026-10-04 02:00 +10:30 -> 02:30 +11 (15:30 UTC on the 3rd)
    ("15 2 * * *", "Australia/Lord_Howe", (2026, 10, 2, 12), [(2026, 10, 2, 15, 45), (2026, 10, 3, 15, 30),
                                                              (2026, 10, 4, 15, 15)]),
    # six fields: 02:30:10 missing in Berlin fires at 03:00:00 CEST
    ("10 30 2 * * *", "Europe/Berlin", (2026, 3, 28, 12), [(2026, 3, 29, 1, 0, 0), (2026, 3, 30, 0, 30, 10)]),
]


@pytest.mark.parametrize("expr,zone,start,expected", SPRING_FORWARD,
                         ids=[f"{c[0]} {c[1]}" for c in SPRING_FORWARD])
def test_a_fixed_time_inside_a_spring_forward_gap_fires_once_after_the_gap(expr, zone, start, expected):
    lo = utc(*start)
    want = [utc(*t) for t in expected]
    assert fires(expr, zone, lo, want[-1] + 1) == want


def test_admission_admits_the_fall_back_fixed_time_once():
    # the scheduler's own walk: a decision each minute through the Berlin fall-back day
    spec = TriggerSpec("trg-dst", 1, "0 2 * * *", "Europe/Berlin")
    cursor, admitted = None, []
    for now in range(utc(2026, 10, 24, 20), utc(2026, 10, 25, 6), 60_000):
        d = decide_admission(spec, cursor, now, initialise_from_ms=utc(2026, 10, 24, 20))
        if hasattr(d, "cursor_ms"):
            cursor = d.cursor_ms
            continue
        if hasattr(d, "scheduled_for_ms"):
            admitted.append(d.scheduled_for_ms)
        cursor = getattr(d, "new_cursor_ms", getattr(d, "next_due_ms", cursor))
    assert admitted == [utc(2026, 10, 25, 0)]


def test_entries_are_classified_by_their_minute_and_hour_fields():
    assert cron_dst.is_fixed_time("0 2 * * *".split())
    assert cron_dst.is_fixed_time("15 2,3 * * 1-5".split())
    assert cron_dst.is_fixed_time("* 30 2 * * *".split())  # six fields: seconds do not count
    assert not cron_dst.is_fixed_time("*/15 * * * *".split())
    assert not cron_dst.is_fixed_time("0 */2 * * *".split())
    assert not cron_dst.is_fixed_time("0 * 2 * * *".split())


# --- the rule as an independent reference, checked on random entries around real changes -----

def _oracle(expr: str, zone: str, lo_s: int, hi_s: int) -> list[int]:
    """The rule by brute force over minutes: a wildcard entry fires at each minute instant whose
    wall time matches; a fixed-time one at the first minute instant whose wall time is the
    matching time or later (so the end of a gap), once per matching wall time."""
    tz = zoneinfo.ZoneInfo(zone)
    walls = set()  # the matching wall minutes around the window (croniter only matches fields)
    it = croniter(expr, datetime.fromtimestamp(lo_s - 86_400, tz).replace(tzinfo=None))
    while (local := it.get_next(datetime)) < datetime.fromtimestamp(hi_s + 86_400, tz).replace(tzinfo=None):
        walls.add(local)
    minutes = range(lo_s - 86_400, hi_s + 86_400, 60)
    wall_at = {u: datetime.fromtimestamp(u, tz).replace(tzinfo=None) for u in minutes}
    if not cron_dst.is_fixed_time(expr.split()):
        found = {u for u in minutes if wall_at[u] in walls}
    else:
        found = {next(u for u in minutes if wall_at[u] >= local) for local in walls}
    return sorted(u for u in found if lo_s <= u <= hi_s)


CHANGES = [utc(2026, 3, 29, 1), utc(2026, 10, 25, 1), utc(2026, 3, 8, 7), utc(2026, 11, 1, 6),
           utc(2026, 4, 4, 15), utc(2026, 10, 3, 15, 30), utc(2026, 4, 4, 14), utc(2026, 9, 26, 14)]
CHANGE_ZONES = ["Europe/Berlin", "Europe/Berlin", "America/New_York", "America/New_York",
                "Australia/Lord_Howe", "Australia/Lord_Howe", "Pacific/Chatham", "Pacific/Chatham"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.integers(0, len(CHANGES) - 1),
       minute=st.sampled_from(["0", "15", "30", "45", "0,30", "10-50/20", "*", "*/15", "*/20"]),
       hour=st.sampled_from(["1", "2", "3", "1,2", "2-3", "1-4/2", "*", "*/2"]))
def test_fire_times_around_real_changes_follow_the_rule(which, minute, hour):
    expr, zone, change = f"{minute} {hour} * * *", CHANGE_ZONES[which], CHANGES[which] // 1000
    lo_s, hi_s = change - 18 * 3600, change + 18 * 3600
    assert [t // 1000 for t in fires(expr, zone, lo_s * 1000, hi_s * 1000)] == _oracle(expr, zone, lo_s, hi_s)


# --- macros -----------------------------------------------------------------------------------

@pytest.mark.parametrize("macro,fields", sorted(MACROS.items()))
def test_macros_mean_their_five_field_forms(macro, fields):
    assert parse_cron(macro).text == macro  # stored as written
    assert not parse_cron(macro).has_seconds
    start = utc(2026, 1, 7, 13, 17)
    for zone in ("UTC", "Europe/Berlin"):
        t_macro, t_fields = start, start
        for _ in range(3):
            t_macro, t_fields = next_fire_ms(macro, zone, t_macro), next_fire_ms(fields, zone, t_fields)
            assert t_macro == t_fields


def test_macro_fire_times_written_out():
    t0 = utc(2026, 1, 7, 13, 17)  # a Wednesday
    assert next_fire_ms("@hourly", "UTC", t0) == utc(2026, 1, 7, 14)
    assert next_fire_ms("@daily", "UTC", t0) == utc(2026, 1, 8)
    assert next_fire_ms("@weekly", "UTC", t0) == utc(2026, 1, 11)  # Sunday
    assert next_fire_ms("@monthly", "UTC", t0) == utc(2026, 2, 1)
    assert next_fire_ms("@yearly", "UTC", t0) == utc(2027, 1, 1)
    assert next_fire_ms("@daily", "Europe/Berlin", t0) == utc(2026, 1, 7, 23)


def test_reboot_and_unknown_macros_are_refused_with_a_clear_message():
    with pytest.raises(CronError, match="'@reboot' is not supported.*init system") as err:
        parse_cron("@reboot")
    assert err.value.field == "cron" and err.value.exit_status == 2
    with pytest.raises(CronError, match="unknown cron macro '@often'.*@hourly"):
        parse_cron("@often")
    with pytest.raises(CronError, match="unknown cron macro"):
        parse_cron("@daily 5")
