"""A harness for end-to-end tests of `qlactors edge`: a real runtime process, driven by the real CLI.

`Home` owns one home directory (optionally with a config file, `<home>/qlactors.toml`, which every
command and runtime finds there on its own): it runs `qlactors --home H ...` commands as
subprocesses, starts and stops edge processes (`Edge`), and on `close()` stops every edge it
started (SIGTERM, 10 s, SIGKILL by pid) and SIGKILLs the process group of every job launcher the
home recorded (database rows, journal rows, start markers) — only groups that still hold a process
of that session started no earlier than the launcher; never by name.

Every `qlactors` subprocess costs close to a second of CPU (its imports), so what a test is not
about stays in-process: conditions are polled on the SQLite file opened read-only, set-up
(`task add`) and plain run requests call the CLI's own `main()`, and final checks read the same
read model `show --json` prints (`Home.view`). The runtime, and every command whose behaviour a
test checks (`run --wait`, `cancel`, `logs`, `logs -f`, `status`, `show --json` where its output
is the point), run as real processes.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

_EXE = Path(sys.executable).parent / "qlactors"
QLACTORS = [str(_EXE)] if _EXE.exists() else [sys.executable, "-m", "qlactors"]
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "timed_out"})
TERMINAL_EVENTS = frozenset({"run.succeeded", "run.failed", "run.cancelled", "run.timed_out"})
FAULT_EXIT = 86
STARTUP_RACE = "event=undeliverable to=executor"


def clean_env(**extra: str) -> dict[str, str]:
    """The inherited environment without what chooses a home or injects a fault, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("QLACTORS_HOME", "XDG_DATA_HOME", "QLACTORS_FAULT", "QLACTORS_TEST_BOOT_ID_FILE",
                         "QLACTORS_TEST_FREE_BYTES_FILE")}
    env.update(extra)
    return env


def wait_until(predicate: Callable[[], Any], timeout: float, what: str | Callable[[], str],
               interval: float = 0.05) -> Any:
    """Poll `predicate` until it returns something truthy (returned), or fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g} s waiting for {detail}")
        time.sleep(interval)


# --- /proc ---------------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, pgrp, session, start ticks) of a pid, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return fields[0], int(fields[2]), int(fields[3]), int(fields[19])


def start_ticks(pid: int) -> int | None:
    """A pid's start time in clock ticks (its identity together with the pid), None when gone."""
    st = _stat(pid)
    return None if st is None else st[3]


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X", "x")


def group_alive(pgid: int) -> bool:
    """True while process group `pgid` has a member (zombies included: `killpg(pgid, 0)`)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def group_members(pgid: int, min_ticks: int | None = None) -> list[int]:
    """Live (non-zombie) pids of process group `pgid` in session `pgid` (a launcher's own session)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = _stat(int(entry))
        if st is None or st[0] in ("Z", "X", "x"):
            continue
        if st[1] == pgid and st[2] == pgid and (min_ticks is None or st[3] >= min_ticks):
            members.append(int(entry))
    return members


def kill_group(pgid: int, min_ticks: int | None = None) -> None:
    """SIGKILL a launcher's process group, only while it still holds a process of ours."""
    if pgid > 1 and pgid != os.getpgrp() and group_members(pgid, min_ticks):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


# --- the runtime process -------------------------------------------------------------------------


class Edge:
    """One `qlactors edge` process (stdout and stderr into one file)."""

    def __init__(self, home: "Home", args: tuple[str, ...], fault: str | None, index: int,
                 command: list[str] | None = None, env: dict[str, str] | None = None) -> None:
        self.home = home
        self.log_path = home.tmp / f"edge-{index}.log"
        env = clean_env(**({"QLACTORS_FAULT": fault} if fault else {}), **(env or {}))
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen([*(command or QLACTORS), "--home", str(home.path), "edge", *args],
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_bytes().decode("utf-8", "replace")

    def describe(self) -> str:
        return f"edge pid {self.pid} rc={self.proc.poll()} log:\n{self.log()[-3000:]}"

    def wait_up(self, timeout: float = 10.0) -> None:
        """Until the runtime is up and its actors started (startup recovery done, admission open).

        "Up" is what `qlactors status` exits 0 on: the home's runtime lock is held
        (`qlactors.runtime.home.runtime_is_up`, polled in-process: a `status` subprocess costs ~1 s).
        """
        from qlactors.runtime.home import runtime_is_up

        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"edge exited early: {self.describe()}")
            return runtime_is_up(self.home.path) and "event=edge_started" in self.log()
        wait_until(up, timeout, lambda: f"the runtime to be up; {self.describe()}")

    def lost_its_welcome(self) -> bool:
        """The startup race (see test_edge_e2e.py): the Executor's Welcome arrived before its name."""
        time.sleep(0.1)
        return STARTUP_RACE in self.log()

    def wait_log(self, fragment: str, timeout: float = 10.0) -> None:
        def seen() -> bool:
            if fragment in self.log():
                return True
            if self.proc.poll() is not None:
                raise AssertionError(f"edge exited before logging {fragment!r}: {self.describe()}")
            return False
        wait_until(seen, timeout, lambda: f"{fragment!r} in the edge log; {self.describe()}")

    def wait_exit(self, timeout: float = 10.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"edge did not exit within {timeout:g} s: {self.describe()}") from None

    def kill9(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait `timeout` s, then SIGKILL by pid; the exit status (-9 if it was killed)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(10)


# --- one home ------------------------------------------------------------------------------------


class Home:
    def __init__(self, tmp: Path, config: str | None = None) -> None:
        """A home at `tmp/home`; `config` (TOML text) becomes its `qlactors.toml`, which the CLI and
        the runtime read from the home when no `--config` is given."""
        self.tmp = Path(tmp)
        self.path = self.tmp / "home"
        self.edges: list[Edge] = []
        self.groups: dict[int, int | None] = {}  # pgid -> launcher start ticks, to clean up
        if config is not None:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
            (self.path / "qlactors.toml").write_text(config)

    @property
    def db_path(self) -> Path:
        return self.path / "qlactors.db"

    # -- commands ---------------------------------------------------------------------------------

    def ql(self, *args: Any, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """`qlactors --home H ARGS...`; stdout and stderr as text (decoding errors replaced)."""
        result = subprocess.run([*QLACTORS, "--home", str(self.path), *map(str, args)],
                                stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                                env=clean_env())
        result.stdout = result.stdout.decode("utf-8", "replace")
        result.stderr = result.stderr.decode("utf-8", "replace")
        return result

    def ql_bytes(self, *args: Any, timeout: float = 60.0) -> subprocess.CompletedProcess:
        return subprocess.run([*QLACTORS, "--home", str(self.path), *map(str, args)],
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                              env=clean_env())

    def ok(self, *args: Any, timeout: float = 60.0) -> subprocess.CompletedProcess:
        result = self.ql(*args, timeout=timeout)
        assert result.returncode == 0, (args, result.returncode, result.stdout, result.stderr,
                                        self.edge_logs())
        return result

    @staticmethod
    def gather(*calls: Callable[[], Any]) -> list[Any]:
        """Independent calls (CLI commands, mostly) side by side; results in the order given."""
        with ThreadPoolExecutor(max_workers=4) as pool:
            return list(pool.map(lambda call: call(), calls))

    def main(self, *args: Any) -> str:
        """The CLI's own `main()` in this process (no interpreter start-up: ~1 s saved a call).

        For set-up and requests whose command line is not what a test is about; the runtime and
        the commands under test always run as real subprocesses.
        """
        from qlactors.cli import main

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(["--home", str(self.path), *map(str, args)])
        assert status == 0, (args, status, out.getvalue(), err.getvalue())
        return out.getvalue()

    def add_tasks(self, *tasks: tuple) -> None:
        """`task add NAME [OPTIONS...] -- COMMAND...` for each tuple given."""
        for task in tasks:
            self.main("task", "add", *task)

    def run(self, name: str) -> str:
        """`run NAME` (requests a run and nudges the runtime); the run id."""
        run_id = self.main("run", name).strip()
        assert run_id and "\n" not in run_id, run_id
        return run_id

    def show(self, run_id: str) -> dict:
        """`qlactors show RUN --json`, the real command."""
        return json.loads(self.ok("show", run_id, "--json").stdout)

    def view(self, run_id: str) -> dict:
        """What `show RUN --json` prints (the same read model, `RunView.to_json()`), read in-process."""
        from qlactors.store.repository import Repository

        repo = Repository.open(f"sqlite:///{self.db_path}")
        try:
            return repo.runs.get(run_id).to_json()
        finally:
            repo.close()

    def logs(self, run_id: str, *extra: str) -> bytes:
        result = self.ql_bytes("logs", run_id, *extra)
        assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
        return result.stdout

    # -- the runtime ------------------------------------------------------------------------------

    def start_edge(self, *args: str, fault: str | None = None, wait_up: bool = True,
                   command: list[str] | None = None, env: dict[str, str] | None = None) -> Edge:
        """Start `qlactors --home H edge ARGS...`; by default wait until it is up.

        A runtime whose Executor lost its Welcome (the startup race that
        `test_runtime_whose_executor_registers_slowly_still_runs_jobs` pins) fails the test.
        """
        edge = Edge(self, args, fault, len(self.edges), command, env)
        self.edges.append(edge)
        if not wait_up:
            return edge
        edge.wait_up()
        assert not edge.lost_its_welcome(), self.edge_logs()
        return edge

    def edge_logs(self) -> str:
        return "\n".join(f"--- {e.log_path.name} (pid {e.pid}, rc {e.proc.poll()})\n{e.log()[-2500:]}"
                         for e in self.edges)

    # -- the database, read-only ------------------------------------------------------------------

    def query(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
        with contextlib.closing(sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=5)) as conn:
            conn.row_factory = sqlite3.Row
            return conn.execute(sql, params).fetchall()

    def run_row(self, run_id: str) -> sqlite3.Row:
        rows = self.query("SELECT * FROM runs WHERE id = ?", (run_id,))
        assert rows, f"no run {run_id}"
        return rows[0]

    def attempt_row(self, run_id: str) -> sqlite3.Row | None:
        """The run's latest attempt, plus its run's `run_status` and `run_error_code`."""
        rows = self.query("SELECT a.*, r.status AS run_status, r.error_code AS run_error_code "
                          "FROM run_attempts a JOIN runs r ON r.id = a.run_id "
                          "WHERE a.run_id = ? ORDER BY a.number DESC LIMIT 1", (run_id,))
        if rows:
            self._remember(rows[0])
        return rows[0] if rows else None

    def journal_row(self, attempt_id: str) -> sqlite3.Row | None:
        rows = self.query("SELECT * FROM executor_journal WHERE attempt_id = ?", (attempt_id,))
        return rows[0] if rows else None

    def event_types(self, run_id: str) -> list[str]:
        return [r["type"] for r in self.query("SELECT type FROM run_events WHERE run_id = ? ORDER BY sequence",
                                              (run_id,))]

    def state(self, run_id: str) -> str:
        return self.run_row(run_id)["status"]

    def wait_state(self, run_id: str, states: str | set | frozenset, timeout: float = 15.0) -> str:
        wanted = {states} if isinstance(states, str) else set(states)

        def reached() -> str | None:
            state = self.state(run_id)
            return state if state in wanted else None
        return wait_until(reached, timeout, lambda: (
            f"run {run_id} to reach {sorted(wanted)} (now {self.state(run_id)}, events "
            f"{self.event_types(run_id)})\n{self.edge_logs()}"))

    def wait_terminal(self, run_id: str, timeout: float = 15.0) -> str:
        return self.wait_state(run_id, TERMINAL, timeout)

    def wait_running(self, run_id: str, timeout: float = 15.0) -> sqlite3.Row:
        """Until the run is `running` with the launcher's identity recorded; the attempt row."""
        self.wait_state(run_id, "running", timeout)
        row = self.attempt_row(run_id)
        assert row is not None and row["pid"] is not None and row["pgid"] == row["pid"], dict(row or {})
        return row

    def log_path(self, run_id: str) -> Path:
        from qlactors.process.logs import LogStore

        row = self.attempt_row(run_id)
        assert row is not None, run_id
        return LogStore(self.path / "logs").path_for(run_id, row["id"])

    def receipt_path(self, attempt_id: str) -> Path:
        from qlactors.process.receipts import ReceiptStore

        return ReceiptStore(self.path / "receipts").final_path(attempt_id)

    def marker_path(self, attempt_id: str) -> Path:
        from qlactors.process.receipts import ReceiptStore

        return ReceiptStore(self.path / "receipts").marker_path(attempt_id)

    def quarantined(self) -> list[Path]:
        root = self.path / "receipts" / ".quarantine"
        return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []

    # -- cleanup ----------------------------------------------------------------------------------

    def _remember(self, row: Any) -> None:
        if row["pgid"]:
            self.groups.setdefault(int(row["pgid"]), row["start_ticks"])

    def remember_group(self, pgid: int, start_ticks: int | None = None) -> None:
        self.groups.setdefault(pgid, start_ticks)

    def _recorded_groups(self) -> dict[int, int | None]:
        groups = dict(self.groups)
        if self.db_path.exists():
            with contextlib.suppress(sqlite3.Error):
                for table in ("run_attempts", "executor_journal"):
                    for row in self.query(f"SELECT pgid, start_ticks FROM {table} WHERE pgid IS NOT NULL"):
                        groups.setdefault(int(row["pgid"]), row["start_ticks"])
        receipts = self.path / "receipts"
        if receipts.exists():
            for marker in receipts.glob("*/*.start"):
                with contextlib.suppress(OSError, ValueError):
                    fields = dict(tok.split("=", 1) for tok in marker.read_text().split())
                    groups.setdefault(int(fields["pgid"]), int(fields["start_ticks"]))
                    if "job_pid" in fields:  # the job's own group (and session): its pid
                        groups.setdefault(int(fields["job_pid"]), int(fields["job_start_ticks"]))
        return groups

    def close(self) -> None:
        try:
            for edge in self.edges:
                edge.terminate()
        finally:
            for pgid, ticks in self._recorded_groups().items():
                kill_group(pgid, ticks)
