"""`qlactors retry`, and `logs`/`show` of a run retention retired, as users drive them (real subprocesses)."""

from __future__ import annotations

import json
import re
import time

from qlactors.executor.edge_files import EdgeFiles
from qlactors.executor.journal.journal import Journal
from qlactors.process.logs import LogStore
from qlactors.process.receipts import ReceiptStore
from qlactors.store.repository import Repository
from qlactors.store.cadence.retention import Retention
from cli_harness import UUID, assert_refused, in_parallel, ok, ok_json

DAY = 86_400_000
EXIT_RETIRED = 4


def test_retry_makes_a_new_run_of_the_same_revision_and_refuses_an_unfinished_run(tmp_path):
    home = tmp_path / "home"
    ok("task", "add", "a", "--", "echo hi", home=home)
    first = ok("run", "a", home=home).stdout.strip()
    ok("cancel", first, home=home)
    ok("task", "update", "a", "--max-concurrent", "2", home=home)
    retried = ok("retry", first, home=home)
    new_id = retried.stdout.strip()
    assert UUID.match(new_id) and retried.stdout == new_id + "\n"
    shown, refused = in_parallel([(("show", new_id, "--json"), {"home": home}), (("retry", new_id), {"home": home})])
    view = json.loads(shown.stdout)
    assert (view["task_revision"], view["retry_of_run_id"], view["trigger_type"], view["state"]) == (
        1, first, "manual", "queued")
    assert_refused(refused, "only a finished run can be retried")


def test_logs_and_show_of_a_retired_run_say_it_was_retired_with_exit_status_4(tmp_path):
    home = tmp_path / "home"
    ok("task", "add", "a", "--", "echo hi", home=home)
    run_id = ok("run", "a", home=home).stdout.strip()
    ok("cancel", run_id, home=home)
    repo = Repository.open(f"sqlite:///{home / 'qlactors.db'}")
    try:
        now = time.time_ns() // 1_000_000 + 8 * DAY
        report = Retention(repo.store, EdgeFiles(Journal(repo.store), LogStore(home / "logs"), ReceiptStore(home / "receipts"))).retire_page(
            now, max_age_ms=7 * DAY, max_runs=100, page=16)
        assert report.retired == 1
    finally:
        repo.close()
    day = time.strftime("%Y-%m-%d", time.gmtime(now / 1000))
    results = in_parallel([(("logs", run_id), {"home": home}), (("show", run_id), {"home": home}),
                           (("show", run_id, "--json"), {"home": home}), (("retry", run_id), {"home": home}),
                           (("logs", "01a22a70-6402-7001-a4c5-000000000000"), {"home": home})])
    for result in results[:4]:
        what = (result.args, result.returncode, result.stdout, result.stderr)
        assert result.returncode == EXIT_RETIRED and result.stdout == "", what
        assert re.fullmatch(rf"qlactors: run {run_id} was retired on {day} \d\d:\d\d:\d\dZ \(max_age\); "
                            r"its log was deleted\n", result.stderr), what
    assert results[4].returncode == 2 and "no run with id" in results[4].stderr
    assert ok_json("runs", home=home) == []


def test_keep_days_and_keep_runs_on_task_add_update_show_and_list(tmp_path):
    home = tmp_path / "home"
    added = ok("task", "add", "a", "--keep-days", "2", "--keep-runs", "1", "--", "echo hi", home=home)
    assert added.stdout == ("task a added (revision 1)\n"
                            "retention: finished runs kept 2 days (task), newest 1 (task)\n")
    assert ok("task", "add", "b", "--", "true", home=home).stdout == "task b added (revision 1)\n"
    shown, text, listed = in_parallel([(("task", "show", "a", "--json"), {"home": home}),
                                       (("task", "show", "b"), {"home": home}),
                                       (("task", "list", "--json"), {"home": home})])
    assert json.loads(shown.stdout)["retention"] == {"max_age_ms": 2 * DAY, "max_age_from": "task",
                                                     "max_runs": 1, "max_runs_from": "task"}
    assert "keep for:       7 days (global default)\n" in text.stdout  # the edge profile's defaults
    assert "keep runs:      100 (global default)\n" in text.stdout
    assert [t["retention"] for t in json.loads(listed.stdout)] == [
        {"max_age_ms": 2 * DAY, "max_age_from": "task", "max_runs": 1, "max_runs_from": "task"},
        {"max_age_ms": 7 * DAY, "max_age_from": "global", "max_runs": 100, "max_runs_from": "global"}]

    # A retention change is a head change, not a new revision; `default` goes back to the global bound.
    assert ok("task", "update", "a", "--keep-days", "default", home=home).stdout == (
        "task a at revision 1\nretention: finished runs kept 7 days (global default), newest 1 (task)\n")
    assert ok("task", "update", "a", "--keep-runs", "1", home=home).stdout == "task a at revision 1 (nothing changed)\n"
    assert ok("task", "update", "a", "--keep-runs", "default", "--keep-days", "0.5", "--max-concurrent", "2",
              home=home).stdout == (
        "task a at revision 2\nretention: finished runs kept 12 hours (task), newest 100 (global default)\n")
    shown = ok_json("task", "show", "a", home=home)
    assert shown["revision"] == 2 and shown["max_concurrent"] == 2
    assert shown["retention"] == {"max_age_ms": DAY // 2, "max_age_from": "task",
                                  "max_runs": 100, "max_runs_from": "global"}


def test_bad_keep_days_or_keep_runs_exit_2_and_write_nothing(tmp_path):
    home = tmp_path / "home"
    ok("task", "add", "a", "--keep-runs", "5", "--", "true", home=home)
    before = ok_json("task", "list", home=home)
    cases = [
        (("task", "add", "n", "--keep-days", "0.01", "--", "true"), "--keep-days: 0.01 is out of range"),
        (("task", "add", "n", "--keep-days", "3651", "--", "true"), "--keep-days: 3651 is out of range"),
        (("task", "add", "n", "--keep-days", "week", "--", "true"), "'week' is not a number of days"),
        (("task", "add", "n", "--keep-runs", "0", "--", "true"), "--keep-runs: 0 is out of range"),
        (("task", "add", "n", "--keep-runs", "1000001", "--", "true"), "--keep-runs: 1000001 is out of range"),
        (("task", "update", "a", "--keep-runs", "2.5", "--max-concurrent", "3"), "'2.5' is not a whole number"),
        (("task", "update", "a", "--keep-days", "nan"), "'nan' is not a number of days"),
        (("task", "update", "nope", "--keep-runs", "3"), "no task named 'nope'"),
    ]
    results = in_parallel([(argv, {"home": home}) for argv, _ in cases])
    for (argv, fragment), result in zip(cases, results):
        assert_refused(result, fragment)
    assert ok_json("task", "list", home=home) == before
