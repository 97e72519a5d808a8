"""`qlactors edge` end to end: a real runtime process, real jobs under the launcher, the real CLI.

SEMANTICS.md §4-§7 and ARCHITECTURE.md "Command line". Each test owns a home (`home` fixture)
unless it only needs a healthy runtime, in which case it shares one (`shared`, started once for
the module). The harness (tests/harness/edge_harness.py) stops every edge it started and SIGKILLs every
job process group the home recorded, by pid/group, whatever the outcome.

Jobs that must still be running at a chosen moment wait for a "go" file the test creates, so
nothing depends on a fixed sleep being long enough.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge_harness import (
    FAULT_EXIT,
    QLACTORS,
    TERMINAL_EVENTS,
    Home,
    clean_env,
    group_members,
    pid_alive,
    wait_until,
)

SECRET = "s3cr3t-VALUE-42"


def gated(go: Path, then: str) -> str:
    """A shell string: wait until the file `go` exists, then run `then`."""
    return f"while [ ! -e '{go}' ]; do sleep 0.05; done; {then}"


def terminal_events(events: list[dict]) -> list[str]:
    return [e["type"] for e in events if e["type"] in TERMINAL_EVENTS]


def count(events: list[dict], kind: str) -> int:
    return sum(1 for e in events if e["type"] == kind)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One healthy runtime for the tests that do not crash or restart it."""
    h = Home(tmp_path_factory.mktemp("shared"))
    try:
        h.add_tasks(
            ("ok0", "--", "echo out; exit 0"),
            ("fail3", "--", r"printf 'a\377b\n'; echo err >&2; printf 'tail'; exit 3"),
            ("sleeper", "--", "sleep", "30"),
            ("follow", "--", "i=0; while [ $i -lt 5 ]; do echo $i; i=$((i+1)); done; "
             + gated(h.tmp / "go-follow", "while [ $i -lt 10 ]; do echo $i; i=$((i+1)); done; exit 0")),
            ("early", "--", "echo started; " + gated(h.tmp / "go-early", "exit 0")),
            ("killed", "--timeout", "1", "--stop-grace", "0", "--",
             "sh", "-c", 'echo before-kill; trap "" TERM; sleep 30'),
        )
        h.start_edge()
        yield h
    finally:
        h.close()


# --- 1. end to end -------------------------------------------------------------------------------


def test_job_runs_end_to_end_exit_status_and_logs_are_byte_exact(shared):
    ok_run, fail_run = _run_wait_both(shared)
    assert ok_run.returncode == 0, (ok_run.stdout, ok_run.stderr)
    assert fail_run.returncode == 3, (fail_run.stdout, fail_run.stderr)
    ok_id, fail_id = ok_run.stdout.strip(), fail_run.stdout.strip()
    assert ok_run.stdout == ok_id + "\n" and fail_run.stdout == fail_id + "\n"  # the run id alone

    ok_view, fail_view, ok_log, fail_log = shared.gather(
        lambda: shared.show(ok_id), lambda: shared.show(fail_id),
        lambda: shared.logs(ok_id), lambda: shared.logs(fail_id))
    assert ok_view["state"] == "succeeded"
    assert [a["exit_code"] for a in ok_view["attempts"]] == [0]
    assert terminal_events(ok_view["events"]) == ["run.succeeded"]
    assert fail_view["state"] == "failed"
    assert [a["exit_code"] for a in fail_view["attempts"]] == [3]
    assert terminal_events(fail_view["events"]) == ["run.failed"]
    assert count(fail_view["events"], "attempt.failed") == 1

    assert ok_log == b"out\n"
    assert fail_log == b"a\xffb\nerr\ntail"  # stdout and stderr, byte for byte (0xff kept)


def _run_wait_both(h: Home) -> list[subprocess.CompletedProcess]:
    """`run ok0 --wait` and `run fail3 --wait` side by side (their exit status is the point)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda name: h.ql("run", name, "--wait"), ["ok0", "fail3"]))


# --- 2. kill -9 of the runtime while a job writes --------------------------------------------------


def test_job_survives_kill_9_of_edge_and_its_failure_is_recorded_once_after_restart(home):
    # A short numbered line every 50 ms: the log-cap reader writes each read through at once.
    lines = 60
    home.add_tasks(("counter", "--", "i=0; while [ $i -lt " + str(lines) + " ]; do "
                                     "printf 'line %04d\\n' $i; i=$((i+1)); sleep 0.05; done; exit 7"))
    edge = home.start_edge()
    run_id = home.run("counter")
    attempt = home.wait_running(run_id)
    log = home.log_path(run_id)
    wait_until(lambda: log.stat().st_size > 0, 5, "the job's first lines in its log")

    edge.kill9()
    size_at_kill = log.stat().st_size
    wait_until(lambda: log.stat().st_size > size_at_kill, 3,
               "the log to keep growing after kill -9 of edge (the job survived)")
    assert pid_alive(attempt["pid"])

    home.start_edge()
    assert home.wait_terminal(run_id, timeout=15) == "failed"
    view, output = home.gather(lambda: home.view(run_id), lambda: home.logs(run_id))
    assert [a["exit_code"] for a in view["attempts"]] == [7]
    assert terminal_events(view["events"]) == ["run.failed"]
    assert count(view["events"], "attempt.failed") == 1
    numbers = [int(line.split(b" ")[1]) for line in output.splitlines()]
    assert numbers == list(range(lines))  # every line once, in order, no gap
    assert output == b"".join(b"line %04d\n" % i for i in range(lines))


# --- 3. crash windows ------------------------------------------------------------------------------


def test_crash_before_completion_commit_completes_from_the_receipt_after_restart(home):
    home.add_tasks(("quick", "--", "echo done; exit 5"))
    edge = home.start_edge(fault="before_completion_commit")
    run_id = home.run("quick")
    assert edge.wait_exit(10) == FAULT_EXIT, edge.describe()

    attempt = home.attempt_row(run_id)
    assert home.state(run_id) not in {"succeeded", "failed"}  # nothing committed
    assert home.receipt_path(attempt["id"]).exists()  # published, read, left for the restart

    home.start_edge()
    assert home.wait_terminal(run_id) == "failed"
    view = home.view(run_id)
    assert [a["exit_code"] for a in view["attempts"]] == [5]
    assert terminal_events(view["events"]) == ["run.failed"]
    assert count(view["events"], "attempt.failed") == 1
    wait_until(lambda: not home.receipt_path(attempt["id"]).exists(), 5, "the receipt to be deleted")
    wait_until(lambda: home.journal_row(attempt["id"]) is None, 5, "the journal row to be cleared")
    assert home.quarantined() == []


def _crash_after_completion_commit(home: Home) -> tuple[str, str]:
    """Edge dies after committing a completion (exit 6), before deleting the receipt."""
    home.add_tasks(("quick", "--", "exit 6"))
    edge = home.start_edge(fault="after_completion_commit")
    run_id = home.run("quick")
    assert edge.wait_exit(10) == FAULT_EXIT, edge.describe()
    attempt_id = home.attempt_row(run_id)["id"]
    assert home.state(run_id) == "failed"  # committed
    assert home.receipt_path(attempt_id).exists()  # not yet deleted
    assert home.journal_row(attempt_id) is not None
    return run_id, attempt_id


def _assert_replayed_as_already_terminal(home: Home, run_id: str, attempt_id: str, timeout: float) -> None:
    wait_until(lambda: not home.receipt_path(attempt_id).exists(), timeout,
               lambda: f"the leftover receipt to be replayed and deleted\n{home.edge_logs()}")
    wait_until(lambda: home.journal_row(attempt_id) is None, 5, "the journal row to be cleared")
    assert home.quarantined() == []
    view = home.view(run_id)
    assert view["state"] == "failed"
    assert [a["exit_code"] for a in view["attempts"]] == [6]
    assert terminal_events(view["events"]) == ["run.failed"]  # no second event
    assert count(view["events"], "attempt.failed") == 1


def test_crash_after_completion_commit_replays_as_already_terminal_without_a_second_event(home):
    home.path.mkdir(parents=True)
    # The leftover is picked up by the ReceiptConsumer's cleanup cadence: make it 1 s here (the
    # default-configuration case is the next test).
    (home.path / "qlactors.toml").write_text("[runtime]\nreceipt_cleanup_interval_ms = 1000\n")
    run_id, attempt_id = _crash_after_completion_commit(home)
    home.start_edge()
    _assert_replayed_as_already_terminal(home, run_id, attempt_id, timeout=8)


def test_crash_after_completion_commit_leftover_is_replayed_soon_after_restart_by_default(home):
    run_id, attempt_id = _crash_after_completion_commit(home)
    home.start_edge()
    _assert_replayed_as_already_terminal(home, run_id, attempt_id, timeout=6)


def test_crash_after_spawn_job_keeps_running_and_is_recovered_from_its_start_marker(home):
    go = home.tmp / "go"
    home.add_tasks(("gated", "--", gated(go, "echo finished; exit 4")))
    edge = home.start_edge(fault="after_spawn")
    run_id = home.run("gated")
    assert edge.wait_exit(10) == FAULT_EXIT, edge.describe()

    attempt = home.attempt_row(run_id)
    assert attempt["pid"] is None  # the identity was never recorded in the database...
    journal = home.journal_row(attempt["id"])
    assert journal is not None and journal["pid"] is None  # ...nor in the journal
    marker = home.marker_path(attempt["id"])
    wait_until(marker.exists, 5, "the launcher's start marker")
    fields = dict(tok.split("=", 1) for tok in marker.read_text().split())
    pgid = int(fields["pgid"])
    home.remember_group(pgid, int(fields["start_ticks"]))
    assert pid_alive(int(fields["pid"]))  # the job keeps running without its runtime

    home.start_edge()
    home.wait_running(run_id)  # recovery found it through the marker and re-bound it
    assert home.attempt_row(run_id)["pid"] == int(fields["pid"])
    go.touch()
    assert home.wait_terminal(run_id) == "failed"
    view = home.view(run_id)
    assert [a["exit_code"] for a in view["attempts"]] == [4]
    assert terminal_events(view["events"]) == ["run.failed"]
    assert home.logs(run_id) == b"finished\n"


# --- 4. the launcher dies --------------------------------------------------------------------------


def test_launcher_killed_with_sigkill_makes_the_run_lost_then_failed_without_retry(home):
    home.add_tasks(("sleeper", "--", "sleep", "30"))
    home.start_edge()
    run_id = home.run("sleeper")
    attempt = home.wait_running(run_id)
    os.kill(attempt["pid"], signal.SIGKILL)  # the launcher only; its job child is left alone

    assert home.wait_terminal(run_id, timeout=15) == "failed"
    view = home.view(run_id)
    assert view["error_code"] == "RUN_LOST_RETRY_DISABLED"
    assert [a["state"] for a in view["attempts"]] == ["lost"]
    assert view["attempts"][0]["exit_code"] is None
    types = [e["type"] for e in view["events"]]
    assert "run.lost" in types and types.index("run.lost") < types.index("run.failed"), types
    assert "run.succeeded" not in types
    assert terminal_events(view["events"]) == ["run.failed"]


# --- 5. deadlines while the runtime is down --------------------------------------------------------


def test_deadline_passed_while_down_stops_the_job_term_then_kill_and_times_out(home):
    home.add_tasks(("stubborn", "--timeout", "2", "--stop-grace", "1", "--",
                    "sh", "-c", 'trap "" TERM; sleep 30'))
    edge = home.start_edge()
    run_id = home.run("stubborn")
    attempt = home.wait_running(run_id)
    deadline = attempt["deadline_at_ms"]
    assert deadline is not None
    edge.kill9()
    wait_until(lambda: now_ms() > deadline + 1000, 5, "the deadline to pass while qlactors is down")
    assert group_members(attempt["pgid"]), "the job should still run (it ignores TERM)"

    edge = home.start_edge()
    assert home.wait_terminal(run_id, timeout=15) == "timed_out"
    view = home.view(run_id)
    assert view["cancel_reason"] == "timeout"
    # The KILL went to the job's group; the launcher outlived its job and published its receipt.
    assert (view["attempts"][0]["exit_code"], view["attempts"][0]["signal"]) == (137, 9)
    assert terminal_events(view["events"]) == ["run.timed_out"]
    wait_until(lambda: not group_members(attempt["pgid"]), 5, "the job's processes to be gone")
    log = edge.log()
    term = log.find(f"event=stop_term attempt={attempt['id']}")
    kill = log.find(f"event=stop_kill attempt={attempt['id']}")
    assert 0 <= term < kill, log[-3000:]  # TERM first, KILL after the stop grace


def test_job_that_finished_in_time_while_down_succeeds_although_the_deadline_passed(home):
    home.add_tasks(("brief", "--timeout", "2", "--", "sleep 0.5; exit 0"))
    edge = home.start_edge()
    run_id = home.run("brief")
    attempt = home.wait_running(run_id)
    edge.kill9()
    receipt = home.receipt_path(attempt["id"])
    wait_until(receipt.exists, 5, "the job to finish and publish its receipt while qlactors is down")
    wait_until(lambda: now_ms() > attempt["deadline_at_ms"] + 300, 5, "the deadline to pass")

    home.start_edge()
    assert home.wait_terminal(run_id) == "succeeded"
    view = home.view(run_id)
    assert view["cancel_reason"] is None
    assert [a["exit_code"] for a in view["attempts"]] == [0]
    assert terminal_events(view["events"]) == ["run.succeeded"]


# --- 6. cancel versus completion -------------------------------------------------------------------


def test_cancel_of_a_running_job_ends_cancelled_and_run_wait_exits_130(shared):
    waiter = subprocess.Popen([*QLACTORS, "--home", str(shared.path), "run", "sleeper", "--wait"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=clean_env())
    try:
        run_id = waiter.stdout.readline().decode().strip()
        attempt = shared.wait_running(run_id)
        result = shared.ok("cancel", run_id)
        assert "cancel requested" in result.stdout, result.stdout
        rc = waiter.wait(15)
    finally:
        if waiter.poll() is None:
            waiter.kill()
        _, err = waiter.communicate()
    assert rc == 130, err
    view = shared.view(run_id)
    assert view["state"] == "cancelled" and view["cancel_reason"] == "user"
    assert terminal_events(view["events"]) == ["run.cancelled"]
    assert count(view["events"], "run.cancel_requested") == 1
    wait_until(lambda: not group_members(attempt["pgid"]), 5, "the job's processes to be gone")


def test_cancel_after_completion_is_committed_says_already_finished_and_adds_no_event(shared):
    run = shared.ql("run", "ok0", "--wait")
    assert run.returncode == 0, run.stderr
    run_id = run.stdout.strip()
    before = shared.view(run_id)
    assert before["state"] == "succeeded"

    first = shared.ok("cancel", run_id)
    assert "already finished" in first.stdout, first.stdout
    second = shared.ok("cancel", run_id)
    assert "already finished" in second.stdout, second.stdout
    after = shared.view(run_id)
    assert after["events"] == before["events"]
    assert after["state"] == "succeeded" and after["cancel_reason"] is None


# --- 7. shutdown -----------------------------------------------------------------------------------


def test_sigterm_leaves_a_running_job_running_and_the_next_start_recovers_it(home):
    go = home.tmp / "go"
    home.add_tasks(("gated", "--", gated(go, "echo finished; exit 0")))
    edge = home.start_edge()
    run_id = home.run("gated")
    attempt = home.wait_running(run_id)

    assert edge.terminate() == 0, edge.describe()
    assert pid_alive(attempt["pid"]), "SIGTERM to edge must leave the job running"
    assert home.state(run_id) == "running"

    edge = home.start_edge()
    edge.wait_log(f"event=adopted run={run_id}", 5)
    go.touch()
    assert home.wait_terminal(run_id) == "succeeded"
    view = home.view(run_id)
    assert [a["exit_code"] for a in view["attempts"]] == [0]
    assert terminal_events(view["events"]) == ["run.succeeded"]
    assert home.logs(run_id) == b"finished\n"


def test_edge_cancel_running_cancels_a_running_job_with_reason_shutdown(home):
    home.add_tasks(("sleeper", "--", "sleep", "30"))
    edge = home.start_edge("--cancel-running")
    run_id = home.run("sleeper")
    attempt = home.wait_running(run_id)

    assert edge.terminate() == 0, edge.describe()
    view = home.view(run_id)
    assert view["state"] == "cancelled", (view["state"], edge.describe())
    assert view["cancel_reason"] == "shutdown"
    assert terminal_events(view["events"]) == ["run.cancelled"]
    assert not group_members(attempt["pgid"])


def test_edge_cancel_running_never_overwrites_a_user_cancel_intent(home):
    # On TERM the job takes 2 s more to finish (stop grace 5 s): the user's cancel is pending
    # while the runtime shuts down with --cancel-running.
    home.add_tasks(("slow-stop", "--stop-grace", "5", "--",
                    "trap 'sleep 2; exit 9' TERM; while :; do sleep 0.05; done"))
    edge = home.start_edge("--cancel-running")
    run_id = home.run("slow-stop")
    home.wait_running(run_id)
    home.ok("cancel", run_id)
    row = home.run_row(run_id)
    assert row["cancel_reason"] == "user" and row["status"] == "running", dict(row)

    assert edge.terminate() == 0, edge.describe()
    view = home.view(run_id)
    assert view["state"] == "cancelled", (view["state"], edge.describe())
    assert view["cancel_reason"] == "user"
    assert count(view["events"], "run.cancel_requested") == 1
    assert terminal_events(view["events"]) == ["run.cancelled"]


# --- 8. one runtime per home -----------------------------------------------------------------------


def test_a_second_edge_on_the_same_home_refuses_to_start_and_the_first_keeps_working(shared):
    first = shared.edges[-1]
    second = subprocess.run([*QLACTORS, "--home", str(shared.path), "edge"], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=20, env=clean_env())
    assert second.returncode == 1, (second.stdout, second.stderr)
    assert "already runs" in second.stderr and str(first.pid) in second.stderr, second.stderr
    assert "Traceback" not in second.stderr

    assert first.proc.poll() is None
    status = json.loads(shared.ok("status", "--json").stdout)
    assert status["up"] is True and status["pid"] == first.pid
    run = shared.ql("run", "ok0", "--wait")
    assert run.returncode == 0, (run.stdout, run.stderr)


# A slow thread start widens the window deterministically: the Executor's `started()` hook sends
# Register from its own thread while profiles/edge.py has not yet put its ref into the Directory.
SLOW_REGISTRATION = """
import sys, time
from qlactors.runtime import context as base
from qlactors.cli import main

plain_set = base.Directory.set

def late_set(self, name, ref):
    if name == "executor" and ref is not None:
        time.sleep(0.5)  # a busy machine: the actor runs before its name is registered
    plain_set(self, name, ref)

base.Directory.set = late_set
sys.exit(main(sys.argv[1:]))
"""


def test_runtime_whose_executor_registers_slowly_still_runs_jobs(home):
    home.add_tasks(("ok0", "--", "exit 0"))
    script = home.tmp / "slow_registration.py"
    script.write_text(SLOW_REGISTRATION)
    home.start_edge(command=[sys.executable, str(script)])
    run_id = home.run("ok0")
    assert home.wait_terminal(run_id, timeout=6) == "succeeded"


# --- 9. status -------------------------------------------------------------------------------------


def test_status_exits_3_when_down_and_0_when_up_with_up_in_json(home):
    down = home.ql("status")
    assert down.returncode == 3, (down.stdout, down.stderr)
    assert json.loads(home.ql("status", "--json").stdout)["up"] is False

    edge = home.start_edge()
    up = home.ql("status", "--json")
    assert up.returncode == 0, up.stderr
    report = json.loads(up.stdout)
    assert report["up"] is True and report["pid"] == edge.pid

    assert edge.terminate() == 0
    assert home.ql("status").returncode == 3


# --- 10. no secret leaks ---------------------------------------------------------------------------


def test_a_task_secret_reaches_only_the_job_and_the_task_revision(home):
    home.add_tasks(("secret", "--env", f"SECRET_TOKEN={SECRET}", "--", 'echo "token=$SECRET_TOKEN"; exit 0'))
    # Crash before the completion commit, so that the receipt is still on disk to be inspected.
    edge = home.start_edge(fault="before_completion_commit")
    run_id = home.run("secret")
    assert edge.wait_exit(10) == FAULT_EXIT, edge.describe()
    attempt_id = home.attempt_row(run_id)["id"]
    receipt = home.receipt_path(attempt_id)
    assert receipt.exists()
    secret = SECRET.encode()
    for path in (home.path / "receipts").rglob("*"):
        if path.is_file():
            assert secret not in path.read_bytes(), path

    home.start_edge()
    assert home.wait_terminal(run_id) == "succeeded"
    assert home.logs(run_id) == f"token={SECRET}\n".encode()  # the job's own output

    shown = home.ok("show", run_id, "--json").stdout
    assert SECRET not in shown
    for edge in home.edges:
        assert secret not in edge.log_path.read_bytes(), edge.log_path
    for row in home.query("SELECT payload_json FROM run_events"):
        raw = row["payload_json"]
        assert secret not in (raw.encode() if isinstance(raw, str) else raw)
    # Every text of every table, but the revision's env_json, is free of it...
    for (table,) in home.query("SELECT name FROM sqlite_master WHERE type = 'table'"):
        for column in home.query(f"PRAGMA table_info({table})"):
            if (table, column["name"]) == ("task_revisions", "env_json"):
                continue
            hits = home.query(f'SELECT count(*) FROM "{table}" WHERE instr(CAST("{column["name"]}" AS BLOB), ?)',
                              (secret,))
            assert hits[0][0] == 0, (table, column["name"])
    # ...and the live database bytes hold it exactly as often as env_json rows do.
    with_env = home.query("SELECT count(*) FROM task_revisions WHERE instr(env_json, ?)", (SECRET,))[0][0]
    assert with_env == 1
    copy = home.tmp / "vacuumed.db"
    with contextlib.closing(sqlite3.connect(f"file:{home.db_path}?mode=ro", uri=True, timeout=5)) as conn:
        conn.execute("VACUUM INTO ?", (str(copy),))
    assert copy.read_bytes().count(secret) == with_env


# --- 11. logs -f -----------------------------------------------------------------------------------


def test_logs_follow_follows_a_running_job_until_it_ends_with_its_output_complete(shared):
    run_id = shared.run("follow")
    shared.wait_running(run_id)
    out_path = shared.tmp / f"follow-{run_id}.out"
    with open(out_path, "wb") as out:
        follower = subprocess.Popen([*QLACTORS, "--home", str(shared.path), "logs", run_id, "-f"],
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.PIPE,
                                    env=clean_env())
    try:
        time.sleep(0.6)  # three of its polls: time to (wrongly) stop while the job still runs
        assert follower.poll() is None, "logs -f must keep following while the job runs"
        assert shared.state(run_id) == "running"
        (shared.tmp / "go-follow").touch()
        rc = follower.wait(15)
    finally:
        if follower.poll() is None:
            follower.kill()
        _, err = follower.communicate()
    assert rc == 0, err
    assert shared.state(run_id) == "succeeded"
    assert out_path.read_bytes() == b"".join(f"{i}\n".encode() for i in range(10))


# --- the log-cap reader's buffering ----------------------------------------------------------------

LOG_BUFFERING_BUG = (
    "BUG: qlactors/process/launcher.sh runs the log-cap reader as `head -c \"$q_cap\" >>\"$q_log\"`; "
    "GNU head writes through stdio, fully buffered for a regular file, so a job's output reaches "
    "its log only per 4 KiB block or when the job ends")


def test_output_of_a_running_job_reaches_its_log_while_it_runs(shared):
    run_id = shared.run("early")
    try:
        shared.wait_running(run_id)
        log = shared.log_path(run_id)
        wait_until(lambda: log.read_bytes() == b"started\n", 3,
                   "the job's first line in its log while it runs")
    finally:
        (shared.tmp / "go-early").touch()
        shared.wait_terminal(run_id)


def test_output_written_before_a_kill_stop_is_kept_in_the_log(shared):
    run_id = shared.run("killed")
    assert shared.wait_terminal(run_id, timeout=10) == "timed_out"
    assert shared.logs(run_id) == b"before-kill\n"


# --- 9. the run ends when the job ends (issue 9 §3) --------------------------------------------------


def test_a_job_that_leaves_a_background_child_ends_when_it_exits_and_the_child_is_stopped(home):
    # The repro: the child held the log open until it ended, so the run stayed `running` and
    # `run --wait` blocked. Now the job's exit ends the run and its group is stopped.
    pidfile = home.tmp / "child.pid"
    home.add_tasks(("bg", "--", f"sh -c 'echo $$ >{pidfile}; sleep 60; echo late' & "
                                f"while [ ! -s {pidfile} ]; do sleep 0.01; done; echo done; exit 0"))
    home.start_edge()
    started = time.monotonic()
    run = home.ql("run", "bg", "--wait", timeout=30)
    waited = time.monotonic() - started
    assert run.returncode == 0, run.stderr
    run_id = run.stdout.split()[0]
    assert waited < 30, f"run --wait took {waited:.1f} s: it waited for the child's 60 s"
    view = home.view(run_id)
    assert view["state"] == "succeeded"
    assert [(a["exit_code"], a["signal"]) for a in view["attempts"]] == [(0, None)]
    assert view["attempts"][0]["log_dropped_bytes"] == 0
    assert "attempt.output_left_open" not in [e["type"] for e in view["events"]]
    assert home.logs(run_id) == b"done\n"
    assert not pid_alive(int(pidfile.read_text()))


def test_an_escaped_child_cannot_hold_the_run_and_the_jobs_exit_code_stands(home):
    # The second repro: a setsid child left the group; with --timeout 3 the run used to end
    # `timed_out` with exit code null although the job itself exited 4 at once.
    pidfile = home.tmp / "escaped.pid"
    home.add_tasks(("esc", "--timeout", "3", "--",
                    f"setsid sh -c 'echo $$ >{pidfile}; exec sleep 8' & "
                    f"while [ ! -s {pidfile} ]; do sleep 0.01; done; exit 4"))
    home.start_edge()
    run_id = home.run("esc")
    try:
        assert home.wait_terminal(run_id, timeout=10) == "failed"
        view = home.view(run_id)
        assert view["cancel_reason"] is None
        attempt = view["attempts"][0]
        assert (attempt["exit_code"], attempt["error_code"], attempt["log_dropped_bytes"]) == (4, "EXIT_NONZERO", None)
        types = [e["type"] for e in view["events"]]
        assert types.index("attempt.output_left_open") < types.index("attempt.failed"), types
    finally:
        escaped = int(pidfile.read_text())
        home.remember_group(escaped)  # its own session and group: the harness kills it too
        with contextlib.suppress(ProcessLookupError):
            os.kill(escaped, signal.SIGKILL)


def test_cancel_stops_the_jobs_group_and_records_the_signal_that_ended_it(home):
    home.add_tasks(("sleepy", "--", "sleep", "30"))
    home.start_edge()
    run_id = home.run("sleepy")
    attempt = home.wait_running(run_id)
    home.ok("cancel", run_id)
    assert home.wait_terminal(run_id) == "cancelled"
    view = home.view(run_id)
    # TERM went to the job's group, not the launcher's: the launcher lived on and published.
    assert [(a["exit_code"], a["signal"]) for a in view["attempts"]] == [(143, 15)]
    wait_until(lambda: not group_members(attempt["pgid"]), 5, "the launcher to be gone")


def test_keep_leftovers_is_a_task_setting_that_reaches_the_launcher(home):
    pidfile = home.tmp / "kept.pid"
    home.ok("task", "add", "keeper", "--keep-leftovers", "--",
            f"sh -c 'echo $$ >{pidfile}; exec sleep 30' >/dev/null 2>&1 & "
            f"while [ ! -s {pidfile} ]; do sleep 0.01; done; exit 0")
    shown = json.loads(home.ok("task", "show", "keeper", "--json").stdout)
    assert shown["keep_leftovers"] is True
    assert "keep leftovers" in home.ok("task", "show", "keeper").stdout
    home.start_edge()
    run_id = home.run("keeper")
    assert home.wait_terminal(run_id) == "succeeded"
    kept = int(pidfile.read_text())
    home.remember_group(int(home.attempt_row(run_id)["pgid"]))
    try:
        assert pid_alive(kept), "a kept leftover was stopped"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(kept, signal.SIGKILL)
    home.ok("task", "update", "keeper", "--no-keep-leftovers")
    assert json.loads(home.ok("task", "show", "keeper", "--json").stdout)["keep_leftovers"] is False


def test_a_working_directory_removed_after_task_add_is_a_start_failure(home):
    workdir = home.tmp / "workdir"
    workdir.mkdir()
    home.ok("task", "add", "gone", "--cwd", str(workdir), "--", "echo ran")
    workdir.rmdir()
    home.start_edge()
    run_id = home.run("gone")
    assert home.wait_terminal(run_id) == "failed"
    view = home.view(run_id)
    assert view["error_code"] == "EXECUTOR_START_FAILED"
    assert [a["exit_code"] for a in view["attempts"]] == [None]
