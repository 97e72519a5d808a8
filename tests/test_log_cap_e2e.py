"""The log cap end to end through `qlactors edge` (SEMANTICS.md §4 step 4, §7, §11).

The issue: "Output beyond the log cap: the job completes with its own exit code, the log holds
exactly the cap, log_dropped_bytes records the rest; a job that writes while being stopped never
gets SIGPIPE." Every case runs under the launcher's default shell and under busybox sh
(`[launcher] shell = "/bin/busybox sh"`), since the launcher must behave the same under both.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from qlactors.process.logs import LogStore
from edge_harness import clean_env, start_ticks

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux /proc")

_EXE = Path(sys.executable).parent / "qlactors"
QLACTORS = [str(_EXE)] if _EXE.exists() else [sys.executable, "-m", "qlactors"]

CAP = 65536  # the smallest cap a config may set
TERMINAL = ("succeeded", "failed", "cancelled", "timed_out")
DEADLINE_S = 10.0
BUSYBOX = "/bin/busybox"
SIGPIPE_STATUS = 128 + signal.SIGPIPE  # 141: what a job killed by SIGPIPE would report
TOTAL = 200_000
LINE = b"0123456789abcde\n"
WRITERS = {  # task name -> (job, the exit status its receipt must carry after a cancel)
    "writer-plain": ("while :; do echo x; done", 128 + signal.SIGTERM),
    "writer-trap": ('trap "echo got-term >&2; exit 77" TERM; while :; do echo x; done', 77),
}
TASKS = {
    "big": ["--", f"yes {LINE.decode().strip()} | head -c {TOTAL}; exit 9"],
    "small": ["--", "printf 'out\\n'; echo err >&2; exit 3"],
    **{name: ["--stop-grace", "5", "--", job] for name, (job, _) in WRITERS.items()},
}



class Home:
    """One home with its config and a running `qlactors edge` (stderr kept for failures)."""

    def __init__(self, base: Path, shell: str) -> None:
        self.home, self.config, self.log = base / "home", base / "qlactors.toml", base / "edge.log"
        self.shell = shell
        self.config.write_text(f'[runtime]\nlog_cap_bytes = {CAP}\nslots = 4\n\n'
                               f'[launcher]\nshell = "{shell}"\n')
        self.proc: subprocess.Popen | None = None

    def ql(self, *args: str, text: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([*QLACTORS, "--home", str(self.home), "--config", str(self.config), *args],
                              capture_output=True, text=text, timeout=60, env=clean_env())

    def ok(self, *args: str, text: bool = True) -> subprocess.CompletedProcess:
        result = self.ql(*args, text=text)
        assert result.returncode == 0, (args, result.returncode, result.stdout, result.stderr,
                                        self.stderr())
        return result

    def show(self, run_id: str) -> dict:
        return json.loads(self.ok("show", run_id, "--json").stdout)

    def start(self) -> None:
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(
                [*QLACTORS, "--home", str(self.home), "--config", str(self.config), "edge"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=clean_env(),
                start_new_session=True)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def stderr(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-6000:]
        except FileNotFoundError:
            return ""

    def attempt(self, run_id: str) -> sqlite3.Row | None:
        """The run's latest attempt straight from the database (polling the CLI costs a second a call)."""
        conn = sqlite3.connect(self.home / "qlactors.db", timeout=10)
        conn.row_factory = sqlite3.Row
        try:
            return conn.execute(
                "SELECT a.*, r.status AS run_status FROM run_attempts a JOIN runs r ON r.id = a.run_id "
                "WHERE a.run_id = ? ORDER BY a.number DESC LIMIT 1", (run_id,)).fetchone()
        finally:
            conn.close()

    def logs_and_show(self, run_id: str) -> tuple[bytes, dict]:
        with ThreadPoolExecutor(max_workers=2) as pool:
            logs = pool.submit(self.ok, "logs", run_id, text=False)
            shown = pool.submit(self.show, run_id)
            return logs.result().stdout, shown.result()

    def log_path(self, run_id: str, attempt_id: str) -> Path:
        return LogStore(self.home / "logs").path_for(run_id, attempt_id)

    def wait_until(self, predicate, what: str, timeout_s: float = DEADLINE_S):
        deadline = time.monotonic() + timeout_s
        while True:
            value = predicate()
            if value:
                return value
            if self.proc is not None and self.proc.poll() is not None:
                pytest.fail(f"edge exited while waiting for {what}:\n{self.stderr()}")
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout_s}s waiting for {what}\nedge stderr:\n{self.stderr()}")
            time.sleep(0.05)



@pytest.fixture(scope="module", params=["/bin/sh", f"{BUSYBOX} sh"], ids=["sh", "busybox"])
def edge(request, tmp_path_factory):
    shell = request.param
    if shell.startswith(BUSYBOX) and not os.access(BUSYBOX, os.X_OK):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{BUSYBOX} is required in CI")
        pytest.skip(f"{BUSYBOX} is not installed (set CI=true to make this a failure)")
    home = Home(tmp_path_factory.mktemp("logcap"), shell)
    launched: list[tuple[int, int, int]] = []
    home.launched = launched
    home.ok("task", "add", "big", *TASKS["big"])  # alone first: it creates the database
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda name: home.ok("task", "add", name, *TASKS[name]),
                      [n for n in TASKS if n != "big"]))
    home.start()
    try:
        yield home
    finally:
        home.stop()
        # The runtime leaves jobs running when stopped: end any of ours by exact identity.
        for pid, pgid, ticks in launched:
            if start_ticks(pid) == ticks:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)


def _remember(edge: Home, run_id: str) -> sqlite3.Row:
    row = edge.wait_until(lambda: (a := edge.attempt(run_id)) is not None and a["pid"] is not None and a,
                          "the attempt's process identity")
    edge.launched.append((row["pid"], row["pgid"], row["start_ticks"]))
    return row


def test_output_beyond_the_cap_keeps_exactly_the_cap_counts_the_rest_and_keeps_the_exit_code(edge):
    waited = edge.ql("run", "big", "--wait")
    run_id = waited.stdout.strip()
    assert waited.returncode == 9, (waited, edge.stderr())  # the job's own exit code

    logs, run = edge.logs_and_show(run_id)
    expected = (LINE * (TOTAL // len(LINE) + 1))[:TOTAL]
    assert len(logs) == CAP
    assert logs == expected[:CAP]

    [attempt] = run["attempts"]
    assert run["state"] == "failed" and attempt["state"] == "failed", run
    assert attempt["exit_code"] == 9
    assert attempt["log_dropped_bytes"] == TOTAL - CAP
    assert attempt["signal"] is None


def test_a_small_job_runs_end_to_end_with_its_output_and_exit_code(edge):
    waited = edge.ql("run", "small", "--wait")
    run_id = waited.stdout.strip()
    assert waited.returncode == 3, (waited, edge.stderr())
    logs, run = edge.logs_and_show(run_id)
    assert logs == b"out\nerr\n"
    [attempt] = run["attempts"]
    assert attempt["exit_code"] == 3
    assert attempt["log_dropped_bytes"] == 0  # a cap applied and nothing was dropped


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_job_writing_while_it_is_cancelled_ends_by_term_never_by_sigpipe(edge, name):
    expected_exit = WRITERS[name][1]
    run_id = edge.ok("run", name).stdout.strip()
    row = _remember(edge, run_id)

    # The launcher runs under the configured shell.
    argv0 = Path(f"/proc/{row['pid']}/cmdline").read_bytes().split(b"\0")[0].decode()
    assert argv0 == edge.shell.split()[0], argv0

    # Cancel once the cap is reached: the reader is then draining and counting, the job still writing.
    log = edge.log_path(run_id, row["id"])
    edge.wait_until(lambda: log.exists() and log.stat().st_size >= CAP, "the log to reach the cap")
    edge.ok("cancel", run_id)
    edge.wait_until(lambda: edge.attempt(run_id)["run_status"] in TERMINAL, "the run to end")

    data, run = edge.logs_and_show(run_id)
    [attempt] = run["attempts"]
    what = (run, edge.stderr())
    assert run["state"] == "cancelled", what
    assert attempt["state"] == "cancelled", what
    # A receipt landed (the launcher survives TERM to publish it) and names TERM, not SIGPIPE.
    assert attempt["exit_code"] != SIGPIPE_STATUS, what
    assert attempt["exit_code"] == expected_exit, what
    assert attempt["log_dropped_bytes"] is not None and attempt["log_dropped_bytes"] > 0, what
    assert len(data) == CAP
    assert data == b"x\n" * (CAP // 2)
