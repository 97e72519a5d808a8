"""`run --wait` and `logs` say what is going on (issue 9, §5): a real runtime, real commands, real SIGINT.

`run --wait` with no runtime up says so once and keeps waiting; `--wait-timeout` exits 75 and
Ctrl-C exits 130, both leaving the run going on; a cancelled run's 130 says it was cancelled.
`logs` of a run that never started says so. `status --json` names the active runs as the text.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from default_signals import default_signals
from edge_harness import QLACTORS, TERMINAL, Home, clean_env, wait_until
from cli_harness import assert_refused

NO_RUNTIME = "no runtime is up for"


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One runtime with room for several sleepers at once."""
    home = Home(tmp_path_factory.mktemp("wait"), config="[runtime]\nslots = 4\n")
    try:
        home.add_tasks(("sleeper", "--", "sleep 30"), ("quick", "--", "echo hi"))
        home.start_edge()
        yield home
    finally:
        home.close()


class Waiter:
    """`qlactors run NAME --wait ...` in the background, stderr into a file read as it grows."""

    def __init__(self, home: Home, *args: str) -> None:
        self.err_path = home.tmp / f"waiter-{id(self)}.err"
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen([*QLACTORS, "--home", str(home.path), "run", *args],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                         env=clean_env(), preexec_fn=default_signals)
        self.run_id = self.proc.stdout.readline().decode().strip()
        assert self.run_id, self.stderr()

    def stderr(self) -> str:
        return self.err_path.read_bytes().decode("utf-8", "replace")

    def wait(self, timeout: float = 15.0) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc.stdout.close()


def _lines(text: str, fragment: str) -> list[str]:
    return [line for line in text.splitlines() if fragment in line]


def test_run_wait_with_no_runtime_up_says_so_once_keeps_waiting_and_follows_when_one_starts(tmp_path):
    home = Home(tmp_path)
    waiter = None
    try:
        home.add_tasks(("t", "--", "echo hi; exit 7"))
        waiter = Waiter(home, "t", "--wait")
        wait_until(lambda: NO_RUNTIME in waiter.stderr(), 15, lambda: f"the no-runtime line: {waiter.stderr()!r}")
        assert waiter.proc.poll() is None, waiter.stderr()  # it keeps waiting
        assert home.state(waiter.run_id) == "queued"
        home.start_edge()
        assert waiter.wait() == 7, (waiter.stderr(), home.edge_logs())
        err = waiter.stderr()
        assert len(_lines(err, NO_RUNTIME)) == 1, err  # said once, not at every poll
        [line] = _lines(err, NO_RUNTIME)
        assert line == (f"qlactors: no runtime is up for {home.path}: run {waiter.run_id} stays queued "
                        "until one starts (`qlactors edge`); still waiting"), line
        assert len(_lines(err, "a runtime is up for")) == 1, err  # and again once when it changed
        assert "Traceback" not in err
    finally:
        if waiter is not None:
            waiter.close()
        home.close()


def test_wait_timeout_exits_75_and_the_run_goes_on(shared):
    waiter = Waiter(shared, "sleeper", "--wait", "--wait-timeout", "1.5")
    shared.wait_running(waiter.run_id)
    assert waiter.wait() == 75, waiter.stderr()
    [line] = waiter.stderr().splitlines()
    assert line.startswith(f"qlactors: run {waiter.run_id} is still running after --wait-timeout 1.5s; "
                           "it goes on"), line
    assert shared.state(waiter.run_id) == "running"  # the wait gave up, the run did not
    shared.ok("cancel", waiter.run_id)
    shared.wait_terminal(waiter.run_id)

    retried = shared.ql("retry", waiter.run_id, "--wait", "--wait-timeout", "0.5")  # the same for retry
    assert retried.returncode == 75, retried
    new_id = retried.stdout.strip()
    assert new_id != waiter.run_id and f"qlactors: run {new_id} is still " in retried.stderr, retried
    assert shared.state(new_id) not in TERMINAL
    shared.ok("cancel", new_id)
    shared.wait_terminal(new_id)


def test_sigint_on_run_wait_exits_130_and_says_the_run_goes_on(shared):
    waiter = Waiter(shared, "sleeper", "--wait")
    shared.wait_running(waiter.run_id)
    waiter.proc.send_signal(signal.SIGINT)
    assert waiter.wait() == 130, waiter.stderr()
    [line] = waiter.stderr().splitlines()
    assert line.startswith(f"qlactors: interrupted: run {waiter.run_id} goes on (running)"), line
    assert "Traceback" not in waiter.stderr()
    assert shared.state(waiter.run_id) == "running"  # Ctrl-C stopped the waiting only
    shared.ok("cancel", waiter.run_id)
    shared.wait_terminal(waiter.run_id)


def test_a_cancelled_runs_130_says_it_was_cancelled(shared):
    waiter = Waiter(shared, "sleeper", "--wait")
    shared.wait_running(waiter.run_id)
    shared.ok("cancel", waiter.run_id)
    assert waiter.wait() == 130, waiter.stderr()
    assert waiter.stderr().splitlines() == [f"qlactors: run {waiter.run_id} was cancelled (user)"]


def test_wait_timeout_without_wait_or_not_above_zero_is_refused_and_requests_no_run(shared):
    cases = [(("run", "quick", "--wait-timeout", "5"), "--wait-timeout needs --wait"),
             (("run", "quick", "--wait", "--wait-timeout", "0"), "above 0"),
             (("run", "quick", "--wait", "--wait-timeout", "1e3"), "not a number of seconds")]
    before = shared.query("SELECT COUNT(*) AS n FROM runs")[0]["n"]
    results = shared.gather(*[lambda argv=argv: shared.ql(*argv) for argv, _ in cases])
    for (_, fragment), result in zip(cases, results):
        assert_refused(result, fragment)
    assert shared.query("SELECT COUNT(*) AS n FROM runs")[0]["n"] == before


# --- logs of a run that never started ----------------------------------------------------------------


def test_logs_of_a_run_that_never_started_says_so_plainly(tmp_path):
    home = Home(tmp_path)  # no runtime: runs stay queued, or end cancelled before they start
    home.add_tasks(("t", "--", "echo never"))
    queued, cancelled = home.run("t"), home.run("t")
    home.main("cancel", cancelled)
    waiting, ended, ended_attempt = home.gather(lambda: home.ql("logs", queued),
                                                lambda: home.ql("logs", cancelled),
                                                lambda: home.ql("logs", cancelled, "--attempt", "1"))
    for result in (waiting, ended, ended_attempt):
        assert result.returncode == 0 and result.stdout == "", result
        assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr, result
    assert waiting.stderr.startswith(f"qlactors: run {queued} has not started yet (attempt 1 claimed): "
                                     "no output so far"), waiting.stderr
    assert ended.stderr.startswith(f"qlactors: run {cancelled} attempt 1 never started (cancelled"), ended.stderr
    assert ended_attempt.stderr == ended.stderr


def _follow_a_queued_run(tmp_path):
    """`logs -f` of a run no runtime takes, once it has said that the run has not started yet."""
    home = Home(tmp_path)
    home.add_tasks(("t", "--", "echo never"))
    run_id = home.run("t")
    err_path = tmp_path / "follow.err"
    with open(err_path, "wb") as err:
        follower = subprocess.Popen([*QLACTORS, "--home", str(home.path), "logs", run_id, "-f"],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=clean_env(),
                                    preexec_fn=default_signals)
    try:
        wait_until(lambda: b"has not started yet" in err_path.read_bytes(), 15, "the follower's first line")
    except BaseException:
        follower.kill()
        follower.communicate()
        raise
    return home, run_id, err_path, follower


def test_logs_follow_of_a_queued_run_cancelled_before_it_starts_says_it_never_started(tmp_path):
    home, run_id, err_path, follower = _follow_a_queued_run(tmp_path)
    try:
        home.main("cancel", run_id)
        out, _ = follower.communicate(timeout=15)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert follower.returncode == 0 and out == b""
    lines = err_path.read_text().splitlines()
    assert lines == [f"qlactors: run {run_id} has not started yet (claimed); waiting for it",
                     f"qlactors: run {run_id} attempt 1 never started (cancelled, "
                     f"{home.view(run_id)['attempts'][0]['error_code']}): it has no output"], lines


# --- status --json names the active runs as the text does ------------------------------------------


def _active_line(text: str) -> str:
    [line] = [line for line in text.splitlines() if line.startswith("active runs: ")]
    return line


def test_status_json_names_the_active_runs_as_the_text_does_runtime_down(tmp_path):
    home = Home(tmp_path)
    home.add_tasks(("t", "--", "true"))
    home.run("t")
    home.main("cancel", home.run("t"))
    as_json, as_text = home.gather(lambda: home.ql("status", "--json"), lambda: home.ql("status"))
    assert as_json.returncode == 3 and as_text.returncode == 3
    report = json.loads(as_json.stdout)
    assert report["active_runs"] == {"queued": 1}  # the cancelled run is not active
    assert report["runs"] == {"cancelled": 1, "queued": 1}
    assert _active_line(as_text.stdout) == "active runs: queued 1"


def test_status_json_names_the_active_runs_as_the_text_does_runtime_up(shared):
    run_id = shared.run("sleeper")
    try:
        shared.wait_running(run_id)
        as_json, as_text = shared.gather(lambda: shared.ql("status", "--json"), lambda: shared.ql("status"))
        assert as_json.returncode == 0 and as_text.returncode == 0, (as_json, as_text)
        active = json.loads(as_json.stdout)["active_runs"]
        assert active == {"running": 1}, active
        assert _active_line(as_text.stdout) == "active runs: running 1"
        assert json.loads(shared.ql("status", "--json").stdout)["up"] is True
    finally:
        shared.ok("cancel", run_id)
        shared.wait_terminal(run_id)


# --- the documentation of all this -------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


def test_docs_cli_has_one_exit_status_table_with_every_code():
    text = (REPO / "docs" / "cli.md").read_text()
    assert text.count("## Exit status") == 1
    section = text.split("## Exit status", 1)[1].split("\n## ", 1)[0]
    codes = [line.split("|")[1].strip() for line in section.splitlines()
             if line.startswith("| ") and not line.startswith("| ---")]
    assert codes[0] == "status"
    assert codes[1:] == ["0", "1", "2", "3", "4", "75", "124", "125", "130", "other"]


def test_user_docs_point_at_no_design_file_users_do_not_have():
    for path in [REPO / "README.md", REPO / "benchmarks" / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = path.read_text()
        assert "../shared" not in text and "SEMANTICS.md" not in text and "ARCHITECTURE.md" not in text, path.name


def test_readme_says_the_edge_default_runs_one_job_at_a_time_and_names_the_real_setting():
    from qlactors.config import DEFAULTS

    readme = (REPO / "README.md").read_text()
    assert "one job at a time" in readme
    assert DEFAULTS["edge"].slots == 1 and "slots = 1" in (REPO / "configs" / "edge.toml").read_text()
    assert "[runtime]\nslots = 4\n" in readme


def test_ctrl_c_on_any_other_command_exits_130_with_one_line(tmp_path):
    home, run_id, err_path, follower = _follow_a_queued_run(tmp_path)
    try:
        follower.send_signal(signal.SIGINT)
        follower.communicate(timeout=15)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert follower.returncode == 130
    assert err_path.read_text().splitlines()[1:] == ["qlactors: interrupted"]
    assert home.state(run_id) == "queued"
