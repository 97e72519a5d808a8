"""Cron settings, fire times, the admission and overlap decisions, and the system zone (SEMANTICS §8)."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import zoneinfo
from datetime import datetime, timezone

import pytest
from croniter import croniter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qlactors.domain.cron as cron_module
from qlactors.domain.cron import (
    DEFAULT_GRACE_MS,
    MAX_COUNTED_OCCURRENCES,
    MAX_GRACE_SECONDS,
    Admit,
    CronError,
    Initialise,
    Misfire,
    Overlap,
    OverlapAction,
    Skip,
    TriggerSpec,
    Wait,
    check_grace_ms,
    check_misfire,
    check_overlap,
    cron_idempotency_key,
    decide_admission,
    decide_overlap,
    effective_grace_ms,
    first_fire_at_or_after_ms,
    grace_ms_from_seconds,
    load_zone,
    next_fire_ms,
    parse_cron,
)
from qlactors.domain.states import CancelReason
from qlactors.errors import BadInput
from qlactors.scheduling import zones

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ZONES = ["UTC", "Asia/Kolkata", "Europe/Berlin", "America/New_York", "Australia/Sydney"]
HOUR, DAY = 3_600_000, 86_400_000


def utc_ms(*args: int) -> int:
    return int(datetime(*args, tzinfo=timezone.utc).timestamp()) * 1000


# 2024 DST changes (UTC instants) of the zones above, to aim random times at the hard cases.
TRANSITIONS = [utc_ms(2024, 3, 31, 1), utc_ms(2024, 10, 27, 1), utc_ms(2024, 3, 10, 7),
               utc_ms(2024, 11, 3, 6), utc_ms(2024, 4, 6, 16), utc_ms(2024, 10, 5, 16)]


# --- references ------------------------------------------------------------------------------
# The admission properties below are checked against the fire-time function walked one
# occurrence at a time; that function is itself checked against the zone rule, with expected
# instants written out by hand and a brute-force reference, in test_domain_cron_dst.py.

def _croniter(expr: str, zone: str, at_s: int) -> croniter:
    return croniter(expr, datetime.fromtimestamp(at_s, zoneinfo.ZoneInfo(zone)),
                    second_at_beginning=len(expr.split()) == 6)


def ref_next(expr: str, zone: str, after_ms: int) -> int:
    """The first occurrence strictly after `after_ms`."""
    return next_fire_ms(expr, zone, after_ms)


def ref_chain(expr: str, zone: str, start_ms: int, hi_ms: int, limit: int = 100_000) -> list[int]:
    """`start_ms` and the occurrences after it up to `hi_ms`, restarted at each one (the
    schedule as step-by-step admission walks it), at most `limit` of them."""
    out = [start_ms] if start_ms <= hi_ms else []
    while out and len(out) < limit:
        t = next_fire_ms(expr, zone, out[-1])
        if t > hi_ms:
            break
        out.append(t)
    return out


def ref_between(expr: str, zone: str, lo_ms: int, hi_ms: int, limit: int = 100_000) -> list[int]:
    """Occurrences in [lo_ms, hi_ms] by restarts (see ref_chain)."""
    return ref_chain(expr, zone, ref_next(expr, zone, lo_ms - 1), hi_ms, limit)


def ref_iterated(expr: str, zone: str, lo_ms: int, hi_ms: int) -> list[int]:
    """Occurrences in [lo_ms, hi_ms] by plain croniter iteration."""
    it, out = _croniter(expr, zone, (lo_ms - 1) // 1000), []
    while (t := int(it.get_next(float)) * 1000) <= hi_ms:
        out.append(t)
    return out


def spec(expr: str = "0 * * * *", zone: str = "Europe/Berlin", misfire: str = "fire_once",
         grace_ms: int = DEFAULT_GRACE_MS, revision: int = 1) -> TriggerSpec:
    return TriggerSpec("trg-1", revision, expr, zone, misfire, grace_ms)


class Sim:
    """A scheduler driving one trigger with a simulated clock: one decision per observed time,
    plus an immediate second one after Initialise (as the cycle may do), decisions applied."""

    def __init__(self, trigger: TriggerSpec, tick_ms: int = 0) -> None:
        self.trigger, self.tick_ms = trigger, tick_ms
        self.cursor: int | None = None
        self.admitted: list[int] = []
        self.keys: list[str] = []
        self.missed_events: list[tuple[int, bool]] = []  # (count, capped)
        self.skips = 0

    def observe(self, now_ms: int) -> None:
        d = decide_admission(self.trigger, self.cursor, now_ms, tick_ms=self.tick_ms)
        if isinstance(d, Initialise):
            self.cursor = d.cursor_ms
            d = decide_admission(self.trigger, self.cursor, now_ms, tick_ms=self.tick_ms)
        if isinstance(d, Wait):
            assert self.cursor is not None and d.next_due_ms >= self.cursor
            self.cursor = d.next_due_ms
            return
        assert isinstance(d, (Admit, Skip))
        assert self.cursor is not None and d.new_cursor_ms > self.cursor and d.new_cursor_ms > now_ms
        self.cursor = d.new_cursor_ms
        if d.missed_count:
            self.missed_events.append((d.missed_count, d.missed_capped))
        if isinstance(d, Admit):
            self.admitted.append(d.scheduled_for_ms)
            self.keys.append(d.idempotency_key)
        else:
            self.skips += 1


# --- expressions and settings -----------------------------------------------------------------

def test_five_and_six_field_expressions_parse_and_normalise():
    assert parse_cron("  */5   * * * *\t").text == "*/5 * * * *"
    six = parse_cron("*/5 * * * * *")
    assert six.has_seconds and not parse_cron("0 3 * * *").has_seconds


def test_six_fields_put_seconds_first_as_qinglong_writes_them():
    t0 = utc_ms(2024, 1, 1)
    assert next_fire_ms("*/5 * * * * *", "UTC", t0) == t0 + 5_000
    assert next_fire_ms("*/5 * * * * *", "UTC", t0 + 5_000) == t0 + 10_000
    # second 0 of every fifth minute, not every fifth second of minute 0
    assert next_fire_ms("0 */5 * * * *", "UTC", t0) == t0 + 300_000
    assert next_fire_ms("0 */5 * * * *", "UTC", t0 + 300_000) == t0 + 600_000


def test_next_fire_is_strictly_after_and_ignores_the_millisecond_part():
    t0 = utc_ms(2024, 1, 1, 12)
    assert next_fire_ms("0 12 * * *", "UTC", t0) == t0 + DAY
    assert next_fire_ms("0 12 * * *", "UTC", t0 - 1) == t0
    assert next_fire_ms("* * * * * *", "UTC", t0 + 999) == t0 + 1_000
    assert first_fire_at_or_after_ms("0 12 * * *", "UTC", t0) == t0
    assert first_fire_at_or_after_ms("0 12 * * *", "UTC", t0 + 1) == t0 + DAY


def test_fire_times_follow_the_zone():
    t0 = utc_ms(2024, 1, 15)
    assert next_fire_ms("0 9 * * *", "Asia/Kolkata", t0) == utc_ms(2024, 1, 15, 3, 30)
    assert next_fire_ms("0 9 * * *", "America/New_York", t0) == utc_ms(2024, 1, 15, 14)


@pytest.mark.parametrize("bad", ["* * * *", "* * * * * * *", "", "@reboot", "@often", "@Daily", "61 * * * *",
                                 "*/0 * * * *", "H * * * *", "0 0 30 2 *", "x y z a b", "0 0 * 13 *"])
def test_bad_expressions_are_refused_with_a_message_naming_them(bad):
    with pytest.raises(CronError) as err:
        parse_cron(bad)
    assert isinstance(err.value, ValueError) and isinstance(err.value, BadInput)
    assert err.value.field == "cron"
    assert repr(bad) in str(err.value) or repr(" ".join(bad.split())) in str(err.value)
    assert err.value.exit_status == 2


@pytest.mark.parametrize("bad, words", [("61 * * * *", "minute 61 is out of range 0-59"),
                                        ("0 24 * * *", "hour 24 is out of range 0-23"),
                                        ("0 0 0 * *", "day 0 is out of range 1-31"),
                                        ("0 0 * 13 *", "month 13 is out of range 1-12"),
                                        ("0 0 * * 1-8", "weekday 8 is out of range 0-7"),
                                        ("60 0 0 * * *", "second 60 is out of range 0-59"),
                                        ("*/0 * * * *", "minute step 0")])
def test_a_number_out_of_its_fields_range_is_named_with_the_field_and_the_range(bad, words):
    with pytest.raises(CronError) as err:
        parse_cron(bad)
    assert words in str(err.value), str(err.value)


def test_non_string_and_oversized_expressions_are_refused():
    for bad in (None, 5, ["*"] * 5, "* " * 400):
        with pytest.raises(CronError):
            parse_cron(bad)


def test_an_expression_that_never_fires_says_so():
    with pytest.raises(CronError, match="never fires"):
        parse_cron("0 0 31 4 *")


def test_misfire_overlap_and_grace_are_validated():
    assert check_misfire("skip") is Misfire.SKIP and check_misfire("fire_once") is Misfire.FIRE_ONCE
    assert check_overlap("replace") is Overlap.REPLACE
    for bad_misfire in ("once", "", None, 1):
        with pytest.raises(CronError, match="fire_once|skip") as err:
            check_misfire(bad_misfire)
        assert err.value.field == "misfire"
    with pytest.raises(CronError, match="queue|skip|replace"):
        check_overlap("parallel")
    assert grace_ms_from_seconds(0) == 0 and grace_ms_from_seconds(30) == 30_000
    assert grace_ms_from_seconds(MAX_GRACE_SECONDS) == MAX_GRACE_SECONDS * 1000
    for bad_grace in (-1, MAX_GRACE_SECONDS + 1, 1.5, True, "30", None):
        with pytest.raises(CronError) as err:
            grace_ms_from_seconds(bad_grace)
        assert err.value.field == "grace"
    with pytest.raises(CronError):
        check_grace_ms(-5)
    assert effective_grace_ms(0, 5_000) == 5_000 and effective_grace_ms(30_000, 5_000) == 30_000


def test_trigger_spec_validates_and_normalises():
    s = TriggerSpec("t", 3, " 0  *  * * * ", "UTC", "skip", 0)
    assert (s.expr, s.misfire) == ("0 * * * *", Misfire.SKIP)
    for kwargs in ({"trigger_id": ""}, {"revision": 0}, {"expr": "nope"}, {"zone": "Mars/Base"},
                   {"misfire": "sometimes"}, {"grace_ms": -1}):
        base = {"trigger_id": "t", "revision": 1, "expr": "* * * * *", "zone": "UTC"} | kwargs
        with pytest.raises(CronError):
            TriggerSpec(**base)


# --- zones ------------------------------------------------------------------------------------

def test_unknown_and_malformed_zones_are_refused():
    with pytest.raises(CronError, match="unknown time zone 'Mars/Base'"):
        load_zone("Mars/Base")
    for bad in ("../etc/passwd", "/etc/localtime", "", None, "Europe", "x" * 65):
        with pytest.raises(CronError) as err:
            load_zone(bad)
        assert err.value.field == "zone"


def test_a_missing_zone_database_names_the_package_to_install(tmp_path, monkeypatch):
    # No system database (an empty search path) and no `tzdata` Python package, whether or not
    # one is installed here: the import of it fails as it would where it is absent.
    for module in [m for m in sys.modules if m == "tzdata" or m.startswith("tzdata.")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "tzdata", None)
    zoneinfo.reset_tzpath(to=[str(tmp_path)])
    zoneinfo.ZoneInfo.clear_cache()
    try:
        with pytest.raises(CronError) as err:
            load_zone("Europe/Berlin")
        assert "tzdata" in str(err.value) and "apt-get install tzdata" in str(err.value)
        assert "pip install tzdata" in str(err.value)
        assert load_zone("UTC") is timezone.utc  # UTC needs no database
    finally:
        zoneinfo.reset_tzpath()
        zoneinfo.ZoneInfo.clear_cache()


def test_system_zone_comes_from_the_localtime_link(tmp_path):
    link = tmp_path / "localtime"
    link.symlink_to("/usr/share/zoneinfo/Europe/Berlin")
    assert zones.read_system_zone({}, str(link)) == "Europe/Berlin"
    posix = tmp_path / "posix_localtime"
    posix.symlink_to("/usr/share/zoneinfo/posix/America/New_York")  # need not exist
    assert zones.read_system_zone({}, str(posix)) == "America/New_York"
    (tmp_path / "share/zoneinfo/Asia").mkdir(parents=True)
    (tmp_path / "share/zoneinfo/Asia/Kolkata").write_bytes(b"")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/localtime").symlink_to("../share/zoneinfo/Asia/Kolkata")
    assert zones.read_system_zone({}, str(tmp_path / "etc/localtime")) == "Asia/Kolkata"


def test_tz_variable_wins_over_localtime(tmp_path):
    link = tmp_path / "localtime"
    link.symlink_to("/usr/share/zoneinfo/Europe/Berlin")
    assert zones.read_system_zone({"TZ": ":Australia/Sydney"}, str(link)) == "Australia/Sydney"
    assert zones.read_system_zone({"TZ": "Asia/Kolkata"}, str(link)) == "Asia/Kolkata"
    assert zones.read_system_zone({"TZ": "/usr/share/zoneinfo/UTC"}, str(link)) == "UTC"
    assert zones.read_system_zone({"TZ": ""}, str(link)) == "UTC"
    with pytest.raises(CronError, match="TZ='Mars/Base'.*--tz"):
        zones.read_system_zone({"TZ": "Mars/Base"}, str(link))


def test_system_zone_without_a_usable_link(tmp_path):
    missing = tmp_path / "absent"
    assert zones.read_system_zone({}, str(missing)) == "UTC"  # libc's default
    copied = tmp_path / "localtime"
    copied.write_bytes(b"TZif...")
    named = tmp_path / "timezone"
    named.write_text("Europe/Berlin\n")
    assert zones.read_system_zone({}, str(copied), str(named)) == "Europe/Berlin"
    with pytest.raises(CronError, match="copied file.*--tz"):
        zones.read_system_zone({}, str(copied), str(tmp_path / "no-timezone"))
    odd = tmp_path / "odd"
    odd.symlink_to("/opt/somewhere/Berlin")
    with pytest.raises(CronError, match="outside any zoneinfo directory"):
        zones.read_system_zone({}, str(odd))


def test_resolve_zone_checks_names_and_reads_the_system_zone_once():
    assert zones.resolve_zone("Europe/Berlin") == "Europe/Berlin"
    with pytest.raises(CronError):
        zones.resolve_zone("Nowhere/City")
    zones.system_zone.cache_clear()
    first = zones.resolve_zone(None)
    assert zones.resolve_zone(None) == first and zones.system_zone.cache_info().hits >= 1
    load_zone(first)


def test_importing_the_domain_module_does_not_load_croniter(tmp_path):
    code = ("import sys, qlactors.domain.cron as c\n"
            "assert 'croniter' not in sys.modules\n"
            "c.next_fire_ms('* * * * *', 'UTC', 0)\n"
            "assert 'croniter' in sys.modules\n")
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


# --- the admission decision: examples ---------------------------------------------------------

def test_first_sight_initialises_and_a_fire_exactly_at_now_counts():
    t0 = utc_ms(2024, 5, 1, 12)
    d = decide_admission(spec(zone="UTC"), None, t0)
    assert d == Initialise(t0)  # 12:00 is at-or-after 12:00
    admitted = decide_admission(spec(zone="UTC"), d.cursor_ms, t0)
    assert isinstance(admitted, Admit) and admitted.scheduled_for_ms == t0
    assert admitted.new_cursor_ms == t0 + HOUR and admitted.missed_count == 0
    assert decide_admission(spec(zone="UTC"), None, t0 + 1) == Initialise(t0 + HOUR)


def test_initialise_from_the_trigger_update_time():
    updated = utc_ms(2024, 5, 1, 11, 30)
    now = utc_ms(2024, 5, 1, 14, 10)
    d = decide_admission(spec(zone="UTC"), None, now, initialise_from_ms=updated)
    assert d == Initialise(utc_ms(2024, 5, 1, 12))
    catch_up = decide_admission(spec(zone="UTC"), d.cursor_ms, now)
    assert isinstance(catch_up, Admit) and catch_up.scheduled_for_ms == utc_ms(2024, 5, 1, 12)
    assert catch_up.missed_count == 2 and catch_up.missed_first_ms == utc_ms(2024, 5, 1, 13)


def test_nothing_due_waits_without_moving_the_cursor():
    cursor = utc_ms(2024, 5, 1, 12)
    assert decide_admission(spec(zone="UTC"), cursor, cursor - 1) == Wait(cursor)


def test_the_stored_cursor_is_trusted_and_an_off_second_one_is_recomputed():
    # only this module writes the cursor, so it is used as is (see the Sydney gap test below)
    on_second = utc_ms(2024, 5, 1, 12, 17)
    d = decide_admission(spec(zone="UTC"), on_second, on_second + 60_000)
    assert isinstance(d, Admit) and d.scheduled_for_ms == on_second
    assert d.new_cursor_ms == utc_ms(2024, 5, 1, 13)
    damaged = on_second + 1
    assert decide_admission(spec(zone="UTC"), damaged, damaged + 60_000) == Wait(utc_ms(2024, 5, 1, 13))
    d = decide_admission(spec(zone="UTC"), damaged, utc_ms(2024, 5, 1, 13, 0, 1))
    assert isinstance(d, Admit) and d.scheduled_for_ms == utc_ms(2024, 5, 1, 13)


def test_a_wildcard_time_missing_in_a_spring_forward_gap_is_neither_fired_nor_stalls_the_cursor():
    # Sydney 2024-10-06 02:00 AEST -> 03:00 AEDT. croniter 7 maps the missing 02:00:05 to
    # 03:00:05 AEDT; under the zone rule a wildcard entry (minute `*`) does not fire there: the
    # next fire is 02:00:05 AEDT the day after, however the cycle observes the gap.
    expr, zone = "5,35 * 2 * * *", "Australia/Sydney"
    change = utc_ms(2024, 10, 5, 16)
    assert int(_croniter(expr, zone, change // 1000 - 1).get_next(float)) * 1000 == change + 5_000
    next_day = change + 23 * HOUR + 5_000
    assert ref_next(expr, zone, change - 1_000) == next_day
    for observe_at in (change, change + 2_000, change + 5_000, change + 7_000):
        sim = Sim(spec(expr, zone))
        sim.observe(change - 3_600_000)  # Initialise before the gap
        assert sim.cursor == next_day
        for now in range(observe_at, change + 2 * DAY, 10_000):  # shorter than the 30 s period
            sim.observe(now)
        assert sim.admitted == ref_chain(expr, zone, next_day, change + 2 * DAY)
        assert sim.admitted[0] == next_day and len(set(sim.admitted)) == len(sim.admitted)


def test_idempotency_key_names_trigger_revision_and_time():
    t0 = utc_ms(2024, 5, 1, 12)
    d = decide_admission(spec(zone="UTC", revision=7), t0, t0 + 5)
    assert d.idempotency_key == f"cron:trg-1:7:{t0}" == cron_idempotency_key("trg-1", 7, t0)


def test_skip_admits_within_the_grace_and_skips_past_it():
    t0 = utc_ms(2024, 5, 1, 12)
    s = spec(zone="UTC", misfire="skip", grace_ms=30_000)
    on_edge = decide_admission(s, t0, t0 + 30_000)
    assert isinstance(on_edge, Admit) and on_edge.scheduled_for_ms == t0
    late = decide_admission(s, t0, t0 + 30_001)
    assert late == Skip(t0 + HOUR, 1, False, t0)
    # the grace is never below the cadence tick
    assert isinstance(decide_admission(s, t0, t0 + 40_000, tick_ms=60_000), Admit)


def test_skip_runs_the_newest_due_occurrence_and_counts_the_older_ones():
    t0 = utc_ms(2024, 5, 1, 12)
    s = spec("*/10 * * * * *", "UTC", misfire="skip", grace_ms=30_000)
    d = decide_admission(s, t0, t0 + 35_000)
    assert isinstance(d, Admit) and d.scheduled_for_ms == t0 + 30_000
    assert (d.missed_count, d.missed_first_ms, d.new_cursor_ms) == (3, t0, t0 + 40_000)


def test_fire_once_runs_the_oldest_due_occurrence_whatever_its_lateness():
    t0 = utc_ms(2024, 5, 1, 12)
    d = decide_admission(spec(zone="UTC", grace_ms=0), t0, t0 + 3 * HOUR + 5)
    assert isinstance(d, Admit) and d.scheduled_for_ms == t0
    assert (d.missed_count, d.missed_first_ms, d.new_cursor_ms) == (3, t0 + HOUR, t0 + 4 * HOUR)


def test_bad_decision_inputs_are_refused():
    for kwargs in ({"now_ms": -1}, {"now_ms": 1.5}, {"now_ms": True}, {"cursor_ms": "1"},
                   {"count_limit": 0}):
        args = {"spec": spec(), "cursor_ms": 0, "now_ms": 10} | kwargs
        with pytest.raises(ValueError):
            decide_admission(**args)


# --- a week powered off -----------------------------------------------------------------------

def power_cycle(trigger: TriggerSpec, off_ms: int, on_ms: int, tick_ms: int = 5_000) -> tuple[Sim, int]:
    """Run the edge cadence for an hour before `off_ms`, nothing until `on_ms`, then ten minutes.

    Returns the simulation (holding only what happened after power-on) and the last run before.
    """
    sim = Sim(trigger, tick_ms)
    for now in range(off_ms - HOUR, off_ms, tick_ms):
        sim.observe(now)
    last_before = sim.admitted[-1]
    sim.missed_events.clear()
    sim.admitted.clear()
    for now in range(on_ms, on_ms + 600_000, tick_ms):
        sim.observe(now)
    return sim, last_before


@pytest.mark.parametrize("zone", ["Europe/Berlin", "UTC"])
@pytest.mark.parametrize("late_ms", [10_000, 25 * 60_000], ids=["within-grace", "past-grace"])
def test_a_week_powered_off_admits_one_catch_up_run_and_one_missed_count(zone, late_ms):
    off = utc_ms(2024, 10, 23, 20, 2)  # the week spans the Berlin fall-back (a 25-hour day)
    on = utc_ms(2024, 10, 30, 20) + late_ms  # fire_once ignores the grace: same outcome either way
    sim, last_before = power_cycle(spec("0 * * * *", zone), off, on)
    missed = ref_between("0 * * * *", zone, last_before + 1, on)
    assert len(missed) == 7 * 24  # every UTC hour, the repeated wall-clock hour included
    assert sim.admitted == [missed[0]]  # one catch-up run, for the oldest missed occurrence
    assert sim.missed_events == [(len(missed) - 1, False)]  # one event with the right count
    assert len(set(sim.keys)) == len(sim.keys)


def test_a_week_powered_off_under_skip_admits_nothing_past_the_grace():
    off = utc_ms(2024, 10, 23, 20, 2)
    on = off + 7 * DAY + 25 * 60_000
    sim, last_before = power_cycle(spec("0 * * * *", misfire="skip"), off, on)
    missed = ref_between("0 * * * *", "Europe/Berlin", last_before + 1, on)
    assert sim.admitted == [] and sim.skips == 1
    assert sim.missed_events == [(len(missed), False)]


def test_a_week_powered_off_under_skip_runs_the_fire_that_is_still_within_the_grace():
    off = utc_ms(2024, 10, 23, 20, 2)
    on = utc_ms(2024, 10, 30, 20, 0, 10)  # 10 s after the newest fire, grace 30 s
    sim, last_before = power_cycle(spec("0 * * * *", misfire="skip"), off, on)
    missed = ref_between("0 * * * *", "Europe/Berlin", last_before + 1, on)
    assert sim.admitted == [missed[-1]] and sim.skips == 0
    assert sim.missed_events == [(len(missed) - 1, False)]


def test_a_week_powered_off_with_a_per_second_schedule_is_counted_within_the_bound(monkeypatch):
    import qlactors.domain.cron as cron_module

    steps = []
    real_next_after_s = cron_module.next_after_s

    def counted(text: str, zone: str, after_s: int) -> int:
        steps.append(after_s)
        return real_next_after_s(text, zone, after_s)

    monkeypatch.setattr(cron_module, "next_after_s", counted)
    cursor = utc_ms(2024, 10, 23, 20)
    now = cursor + 7 * DAY + 500
    for misfire in ("fire_once", "skip"):
        steps.clear()
        d = decide_admission(spec("* * * * * *", misfire=misfire), cursor, now)
        # Bounded work, counted in croniter steps, not 604,800 of them: the count stops one past
        # its bound (1,001 steps), then a bisection over the week (20 halvings of 604,800 s, plus
        # its ends) finds the newest due second, and one more step gives the cursor: 1,025 here.
        assert MAX_COUNTED_OCCURRENCES < len(steps) <= MAX_COUNTED_OCCURRENCES + 64, len(steps)
        assert isinstance(d, Admit) and d.missed_capped and d.missed_count == MAX_COUNTED_OCCURRENCES
        assert d.new_cursor_ms == (now // 1000 + 1) * 1000
        assert d.scheduled_for_ms == (cursor if misfire == "fire_once" else now // 1000 * 1000)
    small = decide_admission(spec("* * * * * *"), cursor, cursor + 10_000, count_limit=5)
    assert (small.missed_count, small.missed_capped) == (5, True)
    exact = decide_admission(spec("* * * * * *"), cursor, cursor + 5_000, count_limit=5)
    assert (exact.missed_count, exact.missed_capped) == (5, False)
    # skip with no grace: the newest occurrence is 500 ms late, so nothing runs and all are missed
    past = decide_admission(spec("* * * * * *", misfire="skip", grace_ms=0), cursor, now)
    assert isinstance(past, Skip) and past.missed_capped and past.missed_first_ms == cursor
    on_time = decide_admission(spec("* * * * * *", misfire="skip", grace_ms=0), cursor, now - 500)
    assert isinstance(on_time, Admit) and on_time.scheduled_for_ms == now - 500


# --- DST in a zone that has it ----------------------------------------------------------------

@pytest.mark.parametrize("expr", ["0 * * * *", "*/20 * * * *", "0 */30 * * * *"])
@pytest.mark.parametrize("change", [utc_ms(2024, 3, 31, 1), utc_ms(2024, 10, 27, 1)],
                         ids=["spring-forward", "fall-back"])
def test_dst_change_neither_duplicates_nor_drops_a_wall_clock_schedule(expr, change):
    lo, hi = change - 2 * DAY, change + 2 * DAY
    sim = Sim(spec(expr, "Europe/Berlin"))
    for now in range(lo, hi + 1, 60_000):
        sim.observe(now)
    expected = ref_between(expr, "Europe/Berlin", lo, hi)
    assert sim.admitted == expected and sim.missed_events == []
    assert expected == ref_iterated(expr, "Europe/Berlin", lo, hi)  # restarts agree with iteration
    assert len(set(sim.admitted)) == len(sim.admitted)


@PROPS
@given(expr=st.sampled_from(["30 2 * * *", "0 * * * *", "*/15 * * * *", "0 2,3 * * *"]),
       change=st.sampled_from([utc_ms(2024, 3, 31, 1), utc_ms(2024, 10, 27, 1)]),
       start=st.integers(-6 * HOUR, 0),
       steps=st.lists(st.integers(1_000, 15 * 60_000), min_size=60, max_size=60))
def test_dst_change_with_irregular_cadence_matches_the_fire_times(expr, change, start, steps):
    sim = Sim(spec(expr, "Europe/Berlin"))
    now = change + start
    sim.observe(now)
    first_cursor = sim.cursor if sim.admitted == [] else sim.admitted[0]
    for step in steps:
        now += step
        sim.observe(now)
    expected = ref_chain(expr, "Europe/Berlin", first_cursor, now)
    # steps are shorter than the smallest gap between these occurrences: nothing folds
    assert sim.admitted == expected and sim.missed_events == []


# --- the per-second schedule ------------------------------------------------------------------

@PROPS
@given(t0=st.integers(utc_ms(2020, 1, 1), utc_ms(2030, 1, 1)),
       zone=st.sampled_from(ZONES), misfire=st.sampled_from(["fire_once", "skip"]),
       steps=st.lists(st.integers(100, 1_000), min_size=100, max_size=100))
def test_per_second_schedule_observed_for_ten_seconds_admits_nine_to_eleven_runs(t0, zone, misfire, steps):
    sim = Sim(spec("* * * * * *", zone, misfire), tick_ms=1_000)
    now = t0
    sim.observe(now)
    for step in steps:
        if now + step > t0 + 10_000:
            break
        now += step
        sim.observe(now)
    sim.observe(t0 + 10_000)
    assert 9 <= len(sim.admitted) <= 11
    assert sim.admitted == ref_between("* * * * * *", zone, t0, t0 + 10_000)
    assert sim.missed_events == [] and sim.skips == 0


# --- properties of one decision ---------------------------------------------------------------

def _field(values: list[str]):
    return st.sampled_from(values)


EXPRS = st.builds(
    lambda sec, m, h, dom, mon, dow: " ".join(([sec] if sec else []) + [m, h, dom, mon, dow]),
    st.one_of(st.none(), _field(["0", "*/10", "*/20", "5,35", "*", "0-10/5"])),
    _field(["*", "*/5", "*/15", "0", "30", "0,30", "10-20", "5-50/15"]),
    _field(["*", "*/6", "2", "0-5", "1,2,3", "9-17", "2-3"]),
    _field(["*", "1", "15", "1-10", "*/7"]),
    _field(["*", "*/3", "1-6", "3", "10"]),
    _field(["*", "1-5", "0", "6", "mon,wed"]),
)
TIMES = st.one_of(st.integers(utc_ms(2000, 1, 1), utc_ms(2035, 1, 1)),
                  st.builds(lambda t, d: t + d, st.sampled_from(TRANSITIONS), st.integers(-2 * DAY, 2 * DAY)))
DELTAS = st.one_of(st.integers(-HOUR, HOUR), st.integers(0, 3 * DAY))


def _check_missed(d, due: list[int], admitted: int, limit: int) -> None:
    n = len(due) - admitted
    if len(due) <= limit + 1 and n <= limit:
        assert (d.missed_count, d.missed_capped) == (n, False)
    else:
        assert (d.missed_count, d.missed_capped) == (limit, True)


@PROPS
@given(expr=EXPRS, zone=st.sampled_from(ZONES), misfire=st.sampled_from(["fire_once", "skip"]),
       grace_s=st.sampled_from([0, 1, 30, 3600]), base=TIMES, delta=DELTAS,
       cursor_kind=st.sampled_from(["occurrence", "off_second", "none"]),
       limit=st.sampled_from([1, 3, 50, MAX_COUNTED_OCCURRENCES]))
def test_one_decision_admits_at_most_one_croniter_occurrence_and_advances(
        expr, zone, misfire, grace_s, base, delta, cursor_kind, limit):
    s = spec(expr, zone, misfire, grace_s * 1000)
    if cursor_kind == "none":
        now = base + abs(delta)
        d = decide_admission(s, None, now, initialise_from_ms=base, count_limit=limit)
        assert d == Initialise(ref_next(expr, zone, base - 1))
        return
    if cursor_kind == "occurrence":
        cursor = first = ref_next(expr, zone, base)
    else:  # a damaged cursor: not on a whole second, so it cannot be an occurrence
        cursor = base // 1000 * 1000 + 1 + base % 999
        first = ref_next(expr, zone, cursor - 1)
    now = cursor + delta
    d = decide_admission(s, cursor, now, count_limit=limit)
    if cursor > now:
        assert d == Wait(cursor)  # the idle path trusts the stored cursor, no croniter call
        return
    if first > now:
        assert d == Wait(first)
        return
    assert isinstance(d, (Admit, Skip))
    assert d.new_cursor_ms > now >= cursor  # strictly advances
    # the same observed time again finds nothing: at most one admission per occurrence set
    assert isinstance(decide_admission(s, d.new_cursor_ms, now), Wait)
    due = ref_chain(expr, zone, first, now, limit=limit + 2)
    complete = len(due) <= limit + 1
    if complete:
        assert d.new_cursor_ms == ref_next(expr, zone, due[-1])  # croniter's next after the newest due
    if zone in ("UTC", "Asia/Kolkata"):  # no DST: "after the newest due" is "after now"
        assert d.new_cursor_ms == ref_next(expr, zone, now)
    if isinstance(d, Admit):
        assert first <= d.scheduled_for_ms <= now
        assert d.idempotency_key == f"cron:trg-1:1:{d.scheduled_for_ms}"
        if misfire == "fire_once":
            assert d.scheduled_for_ms == first  # the oldest due occurrence
            assert d.missed_first_ms == (due[1] if len(due) > 1 else None)
        else:
            if complete:
                assert d.scheduled_for_ms == due[-1]  # the newest due occurrence
            assert ref_next(expr, zone, d.scheduled_for_ms) > now
            assert now - d.scheduled_for_ms <= grace_s * 1000
            assert d.missed_first_ms == (first if d.scheduled_for_ms != first else None)
        _check_missed(d, due, 1, limit)
    else:
        assert misfire == "skip" and d.missed_first_ms == first
        if complete:
            assert now - due[-1] > grace_s * 1000
        _check_missed(d, due, 0, limit)


@PROPS
@given(expr=EXPRS, zone=st.sampled_from(ZONES), misfire=st.sampled_from(["fire_once", "skip"]),
       start=TIMES, steps=st.lists(st.integers(1, 2 * HOUR), min_size=1, max_size=20))
def test_decisions_applied_step_by_step_never_duplicate_and_account_for_every_occurrence(
        expr, zone, misfire, start, steps):
    sim = Sim(spec(expr, zone, misfire))
    now = start
    sim.observe(now)
    first_cursor = sim.admitted[0] if sim.admitted else sim.cursor
    for step in steps:
        now += step
        before = sim.cursor
        sim.observe(now)
        assert sim.cursor is not None and before is not None and sim.cursor >= before
    assert sim.admitted == sorted(set(sim.admitted))  # strictly increasing: no duplicate run
    assert len(set(sim.keys)) == len(sim.keys)
    if any(capped for _, capped in sim.missed_events):
        return
    handled = len(sim.admitted) + sum(n for n, _ in sim.missed_events)
    if handled <= 5_000:  # keep the reference enumeration cheap
        assert handled == len(ref_chain(expr, zone, first_cursor, now))


# --- overlap ----------------------------------------------------------------------------------

def test_below_the_limit_every_policy_admits():
    for policy in ("queue", "skip", "replace"):
        assert decide_overlap(policy, 2, 1, "run-a").action is OverlapAction.ADMIT
        assert decide_overlap(policy, 1, 0).action is OverlapAction.ADMIT


def test_at_the_limit_each_policy_does_its_own_thing():
    assert decide_overlap("queue", 1, 1, "run-a").action is OverlapAction.ADMIT
    assert decide_overlap(Overlap.SKIP, 1, 1, "run-a").action is OverlapAction.SKIP
    replace = decide_overlap("replace", 2, 3, "run-a")
    assert replace.action is OverlapAction.ADMIT_AND_CANCEL
    assert (replace.cancel_run_id, replace.cancel_reason) == ("run-a", CancelReason.POLICY)
    # nothing left to replace (every active run is already being cancelled): admit and wait
    assert decide_overlap("replace", 1, 1, None).action is OverlapAction.ADMIT


def test_queue_at_the_limit_admits_while_fewer_than_max_queued_cron_runs_wait():
    assert decide_overlap("queue", 1, 1, "run-a", queued_runs=0).action is OverlapAction.ADMIT
    assert decide_overlap("queue", 1, 2, "run-a", queued_runs=1).action is OverlapAction.SKIP  # default 1
    assert decide_overlap("queue", 2, 4, "run-a", queued_runs=2, max_queued=3).action is OverlapAction.ADMIT
    assert decide_overlap("queue", 2, 5, "run-a", queued_runs=3, max_queued=3).action is OverlapAction.SKIP
    # below the limit nothing waits for long: max_queued does not apply
    assert decide_overlap("queue", 3, 2, "run-a", queued_runs=2, max_queued=1).action is OverlapAction.ADMIT
    for bad in ({"queued_runs": -1}, {"max_queued": 0}, {"max_queued": True}):
        with pytest.raises(ValueError):
            decide_overlap("queue", 1, 1, **bad)


def test_overlap_inputs_are_validated():
    with pytest.raises(CronError):
        decide_overlap("parallel", 1, 0)
    for bad in ({"max_concurrent": 0}, {"max_concurrent": True}, {"active_runs": -1}):
        args = {"policy": "queue", "max_concurrent": 1, "active_runs": 0} | bad
        with pytest.raises(ValueError):
            decide_overlap(**args)


def test_the_domain_modules_read_no_clock_or_environment():
    for module in ("cron", "cron_times", "cron_dst", "cron_delay"):
        source = (pathlib.Path(cron_module.__file__).parent / f"{module}.py").read_text()
        for banned in ("time.time", "datetime.now", "datetime.utcnow", "os.environ", "open(", "import random"):
            assert banned not in source, (module, banned)
