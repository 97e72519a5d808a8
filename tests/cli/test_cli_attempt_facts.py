"""What `show`, `runs`, `status` and `task list` say about where a run ran and how it ended, and
why a queued run waits, on edge (a real runtime; issue 18 items 3, 10 and 18)."""

from __future__ import annotations

import json
import socket

import pytest

from edge_harness import Home

# The job prints its parent, the launcher: the process the runtime records as the attempt's pid.
PARENT = "cut -d' ' -f4 /proc/$$/stat"


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    h = Home(tmp_path_factory.mktemp("facts"))
    try:
        h.add_tasks(("where", "--", PARENT),
                    ("three", "--", "sh", "-c", "echo hello; exit 3"),
                    ("stopped", "--timeout", "1", "--stop-grace", "0", "--", "sleep", "30"),
                    ("sleeper", "--", "sleep", "30"))
        h.start_edge()
        yield h
    finally:
        h.close()


def test_show_and_runs_name_the_local_worker_its_generation_and_the_launchers_pid(home):
    run_id = home.ok("run", "where", "--wait").stdout.strip()
    pid = int(home.logs(run_id).strip())
    shown = home.show(run_id)
    [attempt] = shown["attempts"]
    assert (attempt["worker_id"], attempt["session_generation"], attempt["pid"]) == ("local", 1, pid)
    assert attempt["host"] == socket.gethostname() and attempt["boot_id"]
    text = home.ok("show", run_id).stdout
    assert f"local (gen 1, pid {pid})" in text
    header, *rows = home.ok("runs").stdout.splitlines()
    assert header.split()[-3:] == ["EXIT", "ERROR", "WORKER"]
    [row] = [r for r in rows if r.startswith(run_id)]
    assert row.endswith(f"local (gen 1, pid {pid})")
    [listed] = [r for r in json.loads(home.ok("runs", "--json").stdout) if r["id"] == run_id]
    assert (listed["last_attempt"]["worker_id"], listed["last_attempt"]["pid"]) == ("local", pid)


def test_runs_has_an_exit_column_and_a_stop_says_which_signal_and_why(home):
    three = home.ql("run", "three", "--wait")
    stopped = home.ql("run", "stopped", "--wait")
    assert (three.returncode, stopped.returncode) == (3, 124)
    three_id, stopped_id = three.stdout.strip(), stopped.stdout.strip()
    lines = home.ok("runs").stdout.splitlines()
    exit_at = lines[0].index("EXIT")
    by_id = {line.split()[0]: line for line in lines[1:]}
    assert by_id[three_id][exit_at:].split()[0] == "3"
    assert by_id[stopped_id][exit_at:].startswith("143 (SIGTERM)")
    shown = home.ok("show", stopped_id).stdout
    assert "exit code:     143, killed by SIGTERM (stop: timeout)" in shown
    assert [(a["exit_code"], a["signal"]) for a in home.show(stopped_id)["attempts"]] == [(143, 15)]
    assert "exit code:     3\n" in home.ok("show", three_id).stdout


def test_task_list_quotes_an_argv_as_a_shell_would(home):
    rows = {line.split()[0]: line for line in home.ok("task", "list").stdout.splitlines()[1:]}
    assert rows["three"].endswith("sh -c 'echo hello; exit 3'")
    assert rows["sleeper"].endswith("sleep 30")


def test_a_task_whose_labels_the_edge_lacks_is_warned_and_its_queued_run_says_why(home):
    added = home.ql("task", "add", "gpu", "--require-label", "gpu", "--", "true")
    assert added.returncode == 0 and added.stdout == "task gpu added (revision 1)\n"
    assert added.stderr.count("\n") == 1 and "requires label(s) gpu, and the edge runtime has no labels" in added.stderr
    waited = home.ql("run", "gpu", "--wait", "--wait-timeout", "2")
    assert waited.returncode == 75
    said = [line for line in waited.stderr.splitlines() if "stays queued" in line]
    assert said == [f"qlactors: run {waited.stdout.strip()} stays queued: it requires label(s) gpu, and the "
                    "edge runtime has no labels: it never runs here; still waiting"]
    gpu_id = waited.stdout.strip()
    assert "waiting: it requires label(s) gpu, and the edge runtime has no labels" in home.ok("show", gpu_id).stdout
    assert home.show(gpu_id)["waiting"].startswith("it requires label(s) gpu")

    sleeper = home.run("sleeper")
    attempt = home.wait_running(sleeper)
    report = home.ok("status", "--json").stdout
    listed = {r["run_id"]: r for r in json.loads(report)["active_run_list"]}
    assert listed[gpu_id]["waiting"].startswith("it requires label(s) gpu") and listed[gpu_id]["worker_id"] is None
    assert (listed[sleeper]["worker_id"], listed[sleeper]["pid"], listed[sleeper]["waiting"]) == (
        "local", attempt["pid"], None)
    text = home.ok("status").stdout
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("  01")}
    assert f"local (gen 1, pid {attempt['pid']})" in rows[sleeper]
    assert "it requires label(s) gpu" in rows[gpu_id]
    untouched = home.ql("task", "update", "gpu", "--timeout", "5")  # its labels did not change: no warning
    assert untouched.returncode == 0 and untouched.stderr == ""
    lifted = home.ql("task", "update", "gpu", "--no-require-label")
    assert lifted.returncode == 0 and lifted.stderr == ""
    home.ok("cancel", sleeper)
    home.ok("cancel", gpu_id)
