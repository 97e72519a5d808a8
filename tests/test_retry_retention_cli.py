"""`qlactors retry`, and `logs`/`show` of a run retention retired, as users drive them (real subprocesses)."""

from __future__ import annotations

import json
import re
import time

from qlactors.process.logs import LogStore
from qlactors.process.receipts import ReceiptStore
from qlactors.store.repository import Repository
from qlactors.store.retention import Retention
from test_cli import UUID, assert_refused, in_parallel, ok, ok_json

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
        report = Retention(repo.store, LogStore(home / "logs"), ReceiptStore(home / "receipts")).retire_page(
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
