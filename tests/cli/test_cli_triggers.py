"""Cron schedules through the real `qlactors task` command: add, update, remove, show and refusals.

Same harness as tests/cli/test_cli.py (tests/harness/cli_harness.py): a real subprocess per
command, a fresh home per test.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import uuid

from cli_harness import assert_refused, clean_env, in_parallel, ok, ok_json, ql

ISO_KOLKATA = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+05:30")  # no DST there: a fixed offset


def test_task_add_with_cron_stores_every_schedule_option_and_show_prints_the_next_fire_time(tmp_path):
    home = tmp_path / "home"
    added = ok("task", "add", "t", "--cron", "*/5 * * * * *", "--tz", "Asia/Kolkata", "--misfire", "skip",
               "--grace", "12", "--overlap", "replace", "--max-concurrent", "2", "--", "true", home=home)
    assert "revision 1" in added.stdout
    assert re.search(r"^schedule: \*/5 \* \* \* \* \* in Asia/Kolkata \(trigger revision 1\), next fire "
                     + ISO_KOLKATA.pattern + "$", added.stdout, re.M), added.stdout

    shown, text, listed = in_parallel([(("task", "show", "t", "--json"), {"home": home}),
                                       (("task", "show", "t"), {"home": home}),
                                       (("task", "list"), {"home": home})])
    task = json.loads(shown.stdout)
    trigger = task["trigger"]
    assert {k: trigger[k] for k in ("revision", "cron", "tz", "misfire", "grace_ms", "overlap")} == {
        "revision": 1, "cron": "*/5 * * * * *", "tz": "Asia/Kolkata", "misfire": "skip", "grace_ms": 12_000,
        "overlap": "replace"}
    assert task["max_concurrent"] == 2  # the overlap limit
    assert type(trigger["next_fire_at_ms"]) is int and trigger["next_fire_at_ms"] % 5_000 == 0  # seconds first
    assert trigger["last_scheduled_at_ms"] is None and trigger["events"] == []

    assert re.search(r"^schedule:\s+\*/5 \* \* \* \* \* in Asia/Kolkata \(trigger revision 1\)$", text.stdout, re.M)
    assert re.search(r"^next fire:\s+" + ISO_KOLKATA.pattern + "$", text.stdout, re.M), text.stdout
    assert re.search(r"^misfire:\s+skip, grace 12s$", text.stdout, re.M)
    assert re.search(r"^overlap:\s+replace", text.stdout, re.M)
    assert "trigger events:" in text.stdout

    header, row = listed.stdout.splitlines()
    assert "CRON" in header and "NEXT FIRE" in header
    assert "*/5 * * * * *" in row and ISO_KOLKATA.search(row), row


def test_the_zone_defaults_to_the_system_zone_written_by_name(tmp_path):
    home = tmp_path / "home"
    ok("task", "add", "t", "--cron", "0 3 * * *", "--", "true", home=home,
       env=clean_env(TZ="America/New_York"))
    assert ok_json("task", "show", "t", home=home, env=clean_env(TZ="Asia/Tokyo"))["trigger"]["tz"] == \
        "America/New_York"


def test_task_update_changes_the_schedule_as_a_new_trigger_revision_and_no_cron_removes_it(tmp_path):
    home = tmp_path / "home"
    ok("task", "add", "t", "--cron", "0 3 * * *", "--tz", "UTC", "--", "true", home=home)

    edited = ok("task", "update", "t", "--misfire", "skip", home=home)
    assert "task t at revision 1\n" in edited.stdout and "(nothing changed)" not in edited.stdout
    assert "trigger revision 2" in edited.stdout
    same = ok("task", "update", "t", "--cron", "0  3 * * *", "--misfire", "skip", home=home)
    assert "(nothing changed)" in same.stdout and "schedule" not in same.stdout
    trigger = ok_json("task", "show", "t", home=home)["trigger"]
    assert (trigger["revision"], trigger["cron"], trigger["tz"], trigger["misfire"]) == (2, "0 3 * * *", "UTC", "skip")

    both = ok("task", "update", "t", "--timeout", "5", "--overlap", "skip", home=home)
    assert "revision 2" in both.stdout and "trigger revision 3" in both.stdout

    removed = ok("task", "update", "t", "--no-cron", home=home)
    assert "schedule removed" in removed.stdout
    shown, listed = in_parallel([(("task", "show", "t", "--json"), {"home": home}),
                                 (("task", "list", "--json"), {"home": home})])
    assert json.loads(shown.stdout)["trigger"] is None
    assert json.loads(listed.stdout)[0]["trigger"] is None
    assert "(nothing changed)" in ok("task", "update", "t", "--no-cron", home=home).stdout


def test_show_lists_the_recent_trigger_events_and_a_disabled_task_has_no_next_fire(tmp_path):
    home = tmp_path / "home"
    ok("task", "add", "t", "--cron", "0 * * * *", "--tz", "UTC", "--", "true", home=home)
    with contextlib.closing(sqlite3.connect(home / "qlactors.db")) as conn:
        [(trigger_id,)] = conn.execute("SELECT id FROM triggers").fetchall()
        conn.execute("INSERT INTO trigger_events (id, trigger_id, trigger_revision, type, scheduled_for_ms, "
                     "occurrences, run_id, created_at_ms) VALUES (?, ?, 1, 'missed', ?, 167, NULL, ?)",
                     (str(uuid.uuid4()), trigger_id, 1_700_002_800_000, 1_700_600_000_000))
        conn.commit()
    ok("task", "disable", "t", home=home)
    as_json, text = in_parallel([(("task", "show", "t", "--json"), {"home": home}),
                                 (("task", "show", "t"), {"home": home})])
    trigger = json.loads(as_json.stdout)["trigger"]
    assert trigger["events"] == [{"type": "missed", "scheduled_for_ms": 1_700_002_800_000, "count": 167,
                                  "trigger_revision": 1, "run_id": None, "at_ms": 1_700_600_000_000}]
    assert trigger["next_fire_at_ms"] is None
    assert re.search(r"^next fire:\s+- \(task disabled\)$", text.stdout, re.M), text.stdout
    assert re.search(r"^\s+missed\s+2023-11-14T23:00:00\+00:00\s+167\s+1\s", text.stdout, re.M), text.stdout

    ok("task", "enable", "t", home=home)
    assert type(ok_json("task", "show", "t", home=home)["trigger"]["next_fire_at_ms"]) is int


def test_bad_schedule_input_exits_2_with_one_clear_line_and_writes_nothing(tmp_path):
    home = tmp_path / "home"
    ok("task", "add", "existing", "--cron", "0 3 * * *", "--tz", "UTC", "--", "true", home=home)
    ok("task", "add", "plain", "--", "true", home=home)
    cases = [
        (("task", "add", "n", "--cron", "* * *", "--", "true"), "has 3 fields"),
        (("task", "add", "n", "--cron", "61 * * * *", "--", "true"), "not valid"),
        (("task", "add", "n", "--cron", "0 0 30 2 *", "--", "true"), "never fires"),
        (("task", "add", "n", "--cron", "* * * * *", "--tz", "Mars/Olympus", "--", "true"), "unknown time zone"),
        (("task", "add", "n", "--cron", "* * * * *", "--misfire", "twice", "--", "true"), "fire_once|skip"),
        (("task", "add", "n", "--cron", "* * * * *", "--overlap", "both", "--", "true"), "queue|skip|replace"),
        (("task", "add", "n", "--cron", "* * * * *", "--grace", "-1", "--", "true"), "grace must be"),
        (("task", "add", "n", "--cron", "* * * * *", "--grace", "1.5", "--", "true"), "--grace"),
        (("task", "add", "n", "--cron", "* * * * *", "--grace", "999999999", "--", "true"), "grace must be"),
        (("task", "add", "n", "--tz", "UTC", "--", "true"), "give --cron"),
        (("task", "update", "plain", "--overlap", "skip"), "give --cron"),
        (("task", "update", "existing", "--cron", "bad"), "has 1 field"),
        (("task", "update", "existing", "--timeout", "5", "--tz", "Nowhere/Land"), "unknown time zone"),
        (("task", "update", "existing", "--no-cron", "--tz", "UTC"), "--no-cron"),
        (("task", "update", "existing", "--no-cron", "--cron", "* * * * *"), "not allowed with"),
        (("task", "add", "n", "--no-cron", "--", "true"), "unrecognized arguments"),
    ]
    results = in_parallel([(argv, {"home": home}) for argv, _ in cases])
    for (argv, fragment), result in zip(cases, results):
        assert_refused(result, fragment)

    listed = json.loads(ok("task", "list", "--json", home=home).stdout)
    assert [t["name"] for t in listed] == ["existing", "plain"]
    existing = listed[0]
    assert existing["revision"] == 1 and existing["timeout_ms"] is None
    assert (existing["trigger"]["revision"], existing["trigger"]["cron"], existing["trigger"]["tz"]) == (
        1, "0 3 * * *", "UTC")
    assert listed[1]["trigger"] is None
    assert ql("task", "show", "n", home=home).returncode == 2


def test_max_queued_and_random_delay_are_task_options_shown_by_task_show(tmp_path):
    home = tmp_path / "home"
    ok("task", "add", "t", "--cron", "@daily", "--tz", "UTC", "--max-queued", "3", "--random-delay", "90",
       "--", "true", home=home)
    shown, text = in_parallel([(("task", "show", "t", "--json"), {"home": home}),
                               (("task", "show", "t"), {"home": home})])
    task = json.loads(shown.stdout)
    assert (task["max_queued"], task["random_delay_ms"], task["trigger"]["cron"]) == (3, 90_000, "@daily")
    assert re.search(r"^overlap:\s+queue \(limit: max concurrent 1, max queued 3\)$", text.stdout, re.M), text.stdout
    assert re.search(r"^random delay:\s+up to 90s$", text.stdout, re.M), text.stdout
    assert re.search(r"^schedule:\s+@daily in UTC", text.stdout, re.M), text.stdout

    updated = ok("task", "update", "t", "--max-queued", "1", "--random-delay", "0", home=home)
    assert "revision 2" in updated.stdout
    task = ok_json("task", "show", "t", home=home)
    assert (task["revision"], task["max_queued"], task["random_delay_ms"]) == (2, 1, 0)
    assert re.search(r"^random delay:\s+none$", ok("task", "show", "t", home=home).stdout, re.M)
    assert task["trigger"]["revision"] == 1  # task options: the schedule itself did not change


def test_bad_max_queued_random_delay_and_macros_exit_2_and_write_nothing(tmp_path):
    home = tmp_path / "home"
    cases = [
        (("task", "add", "n", "--cron", "* * * * *", "--max-queued", "0", "--", "true"), "--max-queued"),
        (("task", "add", "n", "--cron", "* * * * *", "--max-queued", "1025", "--", "true"), "--max-queued"),
        (("task", "add", "n", "--cron", "* * * * *", "--max-queued", "two", "--", "true"), "--max-queued"),
        (("task", "add", "n", "--cron", "* * * * *", "--random-delay", "86401", "--", "true"), "--random-delay"),
        (("task", "add", "n", "--cron", "* * * * *", "--random-delay", "-1", "--", "true"), "--random-delay"),
        (("task", "add", "n", "--cron", "@reboot", "--", "true"), "'@reboot' is not supported"),
        (("task", "add", "n", "--cron", "@fortnightly", "--", "true"), "unknown cron macro"),
    ]
    results = in_parallel([(argv, {"home": home}) for argv, _ in cases])
    for (argv, fragment), result in zip(cases, results):
        assert_refused(result, fragment)
    assert json.loads(ok("task", "list", "--json", home=home).stdout) == []
