"""The audit trail through the real `qlactors` command: every change records the user who made it
(`task show`'s history, `show`'s event actors), and `runs --since/--until` filter by creation time.

Same harness as tests/cli/test_cli.py (tests/harness/cli_harness.py): a real subprocess per
command, a fresh home per test.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import sqlite3

import pytest

from cli_cluster_harness import cluster  # noqa: F401 - fixtures
from cli_harness import assert_refused, clean_env, ok, ok_json, ql

HISTORY_LINE = re.compile(r"^  (\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ)  (\w+) *  rev (\d+)  by (\S+)(?:  \((.*)\))?$")


def as_user(name: str) -> dict[str, str]:
    """The environment of a user called `name` (getpass reads LOGNAME first, then USER)."""
    return clean_env(LOGNAME=name, USER=name)


def history_lines(text: str) -> list[tuple]:
    """`task show`'s history: (type, revision, user, changed) per line, as printed."""
    after = text.split("\nhistory:\n", 1)[1]
    found = [HISTORY_LINE.match(line) for line in after.splitlines()]
    assert all(found), after
    return [(m.group(2), int(m.group(3)), m.group(4), m.group(5)) for m in found]


def test_task_changes_record_their_user_and_task_show_prints_the_history_newest_first(tmp_path):
    home = tmp_path / "home"
    ok("task", "add", "t", "--env", "TOKEN=s3cret", "--", "echo", "first", home=home, env=as_user("alice"))
    ok("task", "update", "t", "--timeout", "5", "--", "echo", "second", home=home, env=as_user("bob"))
    ok("task", "update", "t", "--timeout", "5", home=home, env=as_user("bob"))  # nothing changed: no event
    ok("task", "update", "t", "--cron", "*/5 * * * *", "--tz", "UTC", "--keep-runs", "3", home=home,
       env=as_user("carol"))
    ok("task", "disable", "t", home=home, env=as_user("dave"))
    ok("task", "disable", "t", home=home, env=as_user("dave"))  # already disabled: no event
    ok("task", "enable", "t", home=home, env=as_user("erin"))

    text = ok("task", "show", "t", home=home).stdout
    assert history_lines(text) == [
        ("enabled", 2, "erin", None), ("disabled", 2, "dave", None),
        ("updated", 2, "carol", "retention, schedule"), ("updated", 2, "bob", "command, timeout_ms"),
        ("added", 1, "alice", None)]
    history_text = text.split("\nhistory:\n", 1)[1]
    assert "s3cret" not in history_text and "second" not in history_text

    shown = ok_json("task", "show", "t", home=home)
    assert [(e["type"], e["revision"], e["actor_name"], e["changed"]) for e in shown["history"]] == [
        ("enabled", 2, "erin", []), ("disabled", 2, "dave", []),
        ("updated", 2, "carol", ["retention", "schedule"]), ("updated", 2, "bob", ["command", "timeout_ms"]),
        ("added", 1, "alice", [])]
    assert all(type(e["at_ms"]) is int for e in shown["history"])
    assert "s3cret" not in json.dumps(shown["history"])


def test_a_removed_task_s_history_is_kept_and_its_successor_starts_its_own(tmp_path):
    home = tmp_path / "home"
    ok("task", "add", "t", "--", "true", home=home, env=as_user("alice"))
    ok("task", "rm", "t", home=home, env=as_user("bob"))
    with contextlib.closing(sqlite3.connect(home / "qlactors.db")) as conn:
        stored = conn.execute("SELECT type, revision, actor_name FROM task_events ORDER BY created_at_ms, id").fetchall()
    assert stored == [("added", 1, "alice"), ("removed", 1, "bob")]
    ok("task", "add", "t", "--", "true", home=home, env=as_user("carol"))
    assert history_lines(ok("task", "show", "t", home=home).stdout) == [("added", 1, "carol", None)]


def test_run_cancel_and_retry_record_their_user_and_show_prints_it(tmp_path):
    home = tmp_path / "home"
    ok("task", "add", "t", "--", "true", home=home, env=as_user("alice"))
    run_id = ok("run", "t", home=home, env=as_user("bob")).stdout.strip()
    ok("cancel", run_id, home=home, env=as_user("carol"))
    retried = ok("retry", run_id, home=home, env=as_user("dave")).stdout.strip()

    events = ok_json("show", run_id, home=home)["events"]
    by_type = {e["type"]: (e["actor_type"], e["actor_name"]) for e in events}
    assert by_type["run.created"] == ("user", "bob")
    assert by_type["run.cancel_requested"] == by_type["run.cancelled"] == ("user", "carol")
    retried_events = ok_json("show", retried, home=home)["events"]
    assert {e["actor_name"] for e in retried_events if e["type"] != "attempt.claimed"} == {"dave"}
    # the attempt a run claims is the runtime's own step, whoever asked (issue 28)
    assert {(e["actor_type"], e["actor_name"]) for e in retried_events if e["type"] == "attempt.claimed"} == {
        ("system", None)}

    text = ok("show", run_id, home=home).stdout
    rows = text.split("\nevents:\n", 1)[1].splitlines()
    assert re.search(r"\bACTOR\b", rows[0]), rows[0]
    created = next(r for r in rows if " run.created " in r)
    cancelled = next(r for r in rows if " run.cancelled " in r)
    assert "user (bob)" in created and "user (carol)" in cancelled, text


def test_a_user_name_that_cannot_be_recorded_is_refused_with_nothing_written(tmp_path):
    home = tmp_path / "home"
    ok("task", "add", "t", "--", "true", home=home)
    refused = ql("task", "update", "t", "--timeout", "5", home=home, env=as_user("x" * 200))
    assert_refused(refused, "printable characters")
    assert ok_json("task", "show", "t", home=home)["revision"] == 1


@pytest.mark.postgres
def test_on_a_cluster_database_the_same_changes_record_the_same_names(cluster):
    cluster.env.update(LOGNAME="alice", USER="alice")
    cluster.ok("task", "add", "t", "--", "true")
    cluster.env.update(LOGNAME="bob", USER="bob")
    cluster.ok("task", "update", "t", "--max-concurrent", "2")
    run_id = cluster.ok("run", "t").stdout.strip()
    cluster.ok("cancel", run_id)
    history = json.loads(cluster.ok("task", "show", "t", "--json").stdout)["history"]
    assert [(e["type"], e["actor_name"], e["changed"]) for e in history] == [
        ("updated", "bob", ["max_concurrent"]), ("added", "alice", [])]
    events = json.loads(cluster.ok("show", run_id, "--json").stdout)["events"]
    assert events and {e["actor_name"] for e in events if e["type"] != "attempt.claimed"} == {"bob"}
    since = json.loads(cluster.ok("runs", "--since", "1970-01-01T00:00:00Z", "--until", "9999-01-01",
                                  "--json").stdout)
    assert [r["id"] for r in since] == [run_id]
    assert json.loads(cluster.ok("runs", "--since", "9999-01-01", "--json").stdout) == []


# -- runs --since / --until ------------------------------------------------------------------------

T = 1_796_533_200_000  # 2026-12-06T05:00:00Z


@pytest.fixture(scope="module")
def dated_runs(tmp_path_factory):
    """A home with five runs of task t created a minute apart from T (set in the database), oldest first."""
    home = tmp_path_factory.mktemp("dated") / "home"
    ok("task", "add", "t", "--max-concurrent", "8", "--", "true", home=home)
    ids = [ok("run", "t", home=home).stdout.strip() for _ in range(5)]
    with contextlib.closing(sqlite3.connect(home / "qlactors.db")) as conn, conn:
        for n, run_id in enumerate(ids):
            conn.execute("UPDATE runs SET created_at_ms = ? WHERE id = ?", (T + n * 60_000, run_id))
    return home, ids


def listed(home, *args) -> list[str]:
    return [r["id"] for r in ok_json("runs", *args, home=home)]


def test_since_and_until_take_iso_times_offsets_and_epoch_milliseconds(dated_runs):
    home, (r0, r1, r2, r3, r4) = dated_runs
    assert listed(home, "--since", "2026-12-06T05:01:00Z") == [r4, r3, r2, r1]  # at or after
    assert listed(home, "--until", "2026-12-06T05:03:00Z") == [r2, r1, r0]  # strictly before
    assert listed(home, "--since", "2026-12-06T07:01:00+02:00", "--until", str(T + 3 * 60_000)) == [r2, r1]
    assert listed(home, "--since", "2026-12-06T05:01:00") == [r4, r3, r2, r1]  # naive: UTC
    assert listed(home, "--since", "2026-12-07") == []
    assert listed(home, "--task", "t", "--state", "queued", "--until", "2026-12-06") == []


def test_since_and_until_pages_follow_the_printed_cursor_with_the_filters(dated_runs):
    home, (r0, r1, r2, r3, r4) = dated_runs
    args = ["runs", "--since", "2026-12-06T05:01:00Z", "--until", "2026-12-06T05:04:00Z", "--limit", "2"]
    seen = []
    while True:
        page = ok(*args, home=home)
        seen += [line.split()[0] for line in page.stdout.splitlines()[1:]]
        match = re.search(r"^more: qlactors (runs .*)$", page.stderr, re.M)
        if match is None:
            break
        args = [*shlex.split(match.group(1)), "--limit", "2"]
        assert "--since" in args and "--until" in args, args  # the hint repeats the filters
    assert seen == [r3, r2, r1]


@pytest.mark.parametrize("option, text, fragment", [
    ("--since", "yesterday", "--since: 'yesterday' is not a time"),
    ("--until", "2026-13-01", "names no real date-time"),
    ("--since", "-5", "out of range"),
    ("--until", "1e12", "is not a time"),
])
def test_a_bad_time_exits_2_with_a_clear_message(dated_runs, option, text, fragment):
    home, _ = dated_runs
    assert_refused(ql("runs", option, text, home=home), fragment)
