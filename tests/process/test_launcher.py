"""The launcher script under dash and busybox sh, with real processes, signals and file systems."""

from __future__ import annotations

import contextlib
import importlib.resources
import os
import pathlib
import re
import select
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

import pytest

from qlactors.domain.receipt import Receipt, decode_receipt, encode_receipt
from default_signals import default_signals
from requires import unavailable
from qlactors.process.identity import (
    parse_marker,
    read_boot_id,
    read_identity,
    read_job_marker,
    read_marker,
)

TIMEOUT_S = 10.0
TOKEN = "tOk3n_-" + "A" * 36  # 43 characters of base64url, like a real one
TOKEN_FD = 3
RUN_ID = "run-0190a1b2-c3d4"
ATTEMPT_ID = "att-0190a1b2_c3d4"
PSS_BUDGET_KIB = 2048

SHELLS = [pytest.param(("/bin/sh",), id="dash"), pytest.param(("busybox", "sh"), id="busybox")]
# Where the launcher takes its own tools from first (its PATH line), so a PATH shim cannot stand in.
LAUNCHER_TOOL_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture(params=SHELLS)
def shell(request) -> tuple[str, ...]:
    """The launcher's interpreter; a missing busybox skips on a laptop and fails in CI."""
    argv = request.param
    if shutil.which(argv[0]) is None:
        unavailable(argv[0], "not on PATH (apt-get install busybox)")
    return argv


@pytest.fixture(scope="module")
def launcher() -> str:
    with importlib.resources.as_file(importlib.resources.files("qlactors.process") / "launcher.sh") as p:
        yield str(p)


def clock_base_ms() -> int:
    """What the executor passes: wall ms minus uptime ms (/proc/uptime counts CLOCK_BOOTTIME)."""
    return int(time.time() * 1000) - int(time.clock_gettime(time.CLOCK_BOOTTIME) * 1000)


@dataclass
class Paths:
    receipts: pathlib.Path  # the shard directory
    run: pathlib.Path  # marker, log and dropped-bytes file live here
    root: pathlib.Path

    @property
    def receipt(self) -> pathlib.Path:
        return self.receipts / f"{ATTEMPT_ID}.json"

    @property
    def marker(self) -> pathlib.Path:
        return self.run / "marker"

    @property
    def log(self) -> pathlib.Path:
        return self.run / "log"

    @property
    def dropped(self) -> pathlib.Path:
        return self.run / "dropped"

    @property
    def fifo(self) -> pathlib.Path:
        return self.run / "fifo"


@pytest.fixture
def paths(tmp_path) -> Paths:
    receipts = tmp_path / "receipts" / "ab"
    receipts.mkdir(parents=True, mode=0o700)
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    p = Paths(receipts=receipts, run=run, root=tmp_path)
    fd = os.open(p.log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
    os.close(fd)
    return p


def launcher_env(paths: Paths, *, cap: int = 0, cwd: str | None = None,
                 fifo: bool = True) -> dict[str, str]:
    """The executor's environment for the launcher; under a cap it makes the FIFO, as the executor does."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "QLT_NORMAL": "visible",
        "QLACTORS_RUN_ID": RUN_ID,
        "QLACTORS_ATTEMPT_ID": ATTEMPT_ID,
        "QLACTORS_RECEIPT_DIR": str(paths.receipts),
        "QLACTORS_MARKER": str(paths.marker),
        "QLACTORS_LOG": str(paths.log),
        "QLACTORS_LOG_CAP": str(cap),
        "QLACTORS_DROPPED": str(paths.dropped),
        "QLACTORS_CLOCK_BASE_MS": str(clock_base_ms()),
    }
    if cwd is not None:
        env["QLACTORS_CWD"] = cwd
    if cap > 0 and fifo:
        if not paths.fifo.exists():
            os.mkfifo(paths.fifo, 0o600)
        env["QLACTORS_FIFO"] = str(paths.fifo)
    return env


@contextlib.contextmanager
def launched(shell, launcher, argv, env, prefix: tuple[str, ...] = ()):
    """Start the launcher in its own session; whatever is left of its group is killed at the end.

    `prefix` is a command that ends by exec'ing the launcher (same pid, same group).
    """
    # The token comes on descriptor 3, a pipe, as the executor passes it (never in the environment).
    read_end, write_end = os.pipe()
    os.write(write_end, TOKEN.encode() + b"\n")
    os.close(write_end)
    try:
        proc = subprocess.Popen([*prefix, *shell, launcher, *argv], env=env, start_new_session=True,
                                stdin=subprocess.DEVNULL, pass_fds=(TOKEN_FD,),
                                preexec_fn=lambda: (default_signals(), os.dup2(read_end, TOKEN_FD)))
    finally:
        os.close(read_end)
    try:
        yield proc
    finally:
        if proc.returncode is None:
            # Not reaped yet, so the pgid is still ours: kill the job's group (while the
            # launcher lives its job's pid, or what is left in that group, pins the id), then
            # the launcher's, then reap.
            for pid in children(proc.pid):
                fields = proc_stat_fields(pid)
                if fields and int(fields[2]) == pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=TIMEOUT_S)


def wait_exited(proc: subprocess.Popen, timeout: float = TIMEOUT_S) -> None:
    """Wait for the launcher to exit without reaping it (a zombie keeps its /proc entry)."""
    fd = os.pidfd_open(proc.pid)
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    if not ready:
        pytest.fail(f"launcher {proc.pid} still running after {timeout} s")


def finish(proc: subprocess.Popen) -> int:
    """Wait for the launcher, kill any straggler in its group while the pgid is still held, reap."""
    wait_exited(proc)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait(timeout=TIMEOUT_S)


def run_job(shell, launcher, paths, argv, **env_kw) -> int:
    with launched(shell, launcher, argv, launcher_env(paths, **env_kw)) as proc:
        return finish(proc)


def read_receipt(paths: Paths) -> Receipt:
    data = paths.receipt.read_bytes()
    receipt = decode_receipt(data, expected_attempt_id=ATTEMPT_ID)
    assert encode_receipt(receipt) == data, "receipt bytes differ from the canonical encoding"
    return receipt


def assert_no_leftovers(paths: Paths) -> None:
    """Only final names remain: no receipt temp, nothing beside the marker, log, dropped file and
    the executor's FIFO (which the launcher leaves alone)."""
    assert sorted(p.name for p in paths.receipts.iterdir()) in ([], [paths.receipt.name])
    assert {p.name for p in paths.run.iterdir()} <= {"marker", "log", "dropped", "fifo"}


def proc_stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/PID/stat (after the comm), None if the process is gone."""
    try:
        text = pathlib.Path(f"/proc/{pid}/stat").read_bytes().decode("utf-8", "replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text.rpartition(")")[2].split()


def cmdline(pid: int) -> list[str]:
    try:
        raw = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def group_members(pgid: int) -> dict[int, list[str]]:
    """Every live process of a process group, with its ppid (field 4) and pgrp (field 5)."""
    members = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = proc_stat_fields(int(entry))
        if fields and int(fields[2]) == pgid and fields[0] != "Z":
            members[int(entry)] = fields
    return members


def wait_for(predicate, what: str, timeout: float = 5.0):
    """Poll /proc-level state (there is no event to wait on) until `predicate` returns truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    pytest.fail(f"timed out waiting for {what}")


def children(ppid: int) -> list[int]:
    """Every live child of `ppid`, whatever its group."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = proc_stat_fields(int(entry))
            if fields and int(fields[1]) == ppid and fields[0] != "Z":
                found.append(int(entry))
    return found


def job_pid(launcher_pid: int, program: str) -> int | None:
    """The launcher's child that has exec'd `program` (the job), if any yet."""
    for pid in children(launcher_pid):
        argv = cmdline(pid)
        if argv and os.path.basename(argv[0]) == program:
            return pid
    return None


def job_group(paths: Paths) -> int:
    """The job's process group, as the runtime finds it: the start marker's job_pid, once the
    job's process has made it a group of its own (setsid)."""
    def ready():
        identity = read_job_marker(paths.marker)
        if identity is None:
            return None
        fields = proc_stat_fields(identity.pid)
        return identity.pgid if fields and int(fields[2]) == identity.pid else None
    return wait_for(ready, "the job's own process group")


# --- exit status and receipt ------------------------------------------------------------------

@pytest.mark.parametrize("code", [0, 3, 255])
def test_job_exit_status_is_launcher_status_and_receipt_exit_code(shell, launcher, paths, code):
    before_ms = int(time.time() * 1000)
    status = run_job(shell, launcher, paths, ["sh", "-c", f"exit {code}"])
    after_ms = int(time.time() * 1000)
    assert status == code
    r = read_receipt(paths)
    assert r.exit_code == code
    assert (r.run_id, r.attempt_id, r.token, r.callback_sequence) == (RUN_ID, ATTEMPT_ID, TOKEN, 1)
    assert r.started_at_ms <= r.finished_at_ms
    assert before_ms - 2000 <= r.started_at_ms <= after_ms + 2000
    assert before_ms - 2000 <= r.finished_at_ms <= after_ms + 2000
    assert_no_leftovers(paths)


def test_receipt_times_span_the_job(shell, launcher, paths):
    status = run_job(shell, launcher, paths, ["sleep", "0.3"])
    assert status == 0
    r = read_receipt(paths)
    # /proc/uptime has centisecond resolution.
    assert 250 <= r.finished_at_ms - r.started_at_ms <= 2000


@pytest.mark.parametrize(("sig", "code"), [("TERM", 143), ("KILL", 137)])
def test_job_killed_by_its_own_signal_reports_128_plus_n(shell, launcher, paths, sig, code):
    status = run_job(shell, launcher, paths, ["sh", "-c", f"kill -{sig} $$"])
    assert status == code
    assert read_receipt(paths).exit_code == code


# --- signals to the job's process group (stop, SEMANTICS.md §7) -------------------------------

@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_group_signal_kills_the_job_and_launcher_publishes_receipt(shell, launcher, paths, sig, code):
    with launched(shell, launcher, ["sleep", "5"], launcher_env(paths)) as proc:
        wait_for(lambda: job_pid(proc.pid, "sleep"), "the job to exec sleep")
        os.killpg(job_group(paths), sig)
        # The job had the default disposition (INT included): it died at once, not after 5 s.
        started = time.monotonic()
        status = finish(proc)
        assert time.monotonic() - started < 3
    assert status == code
    assert read_receipt(paths).exit_code == code
    assert_no_leftovers(paths)


def test_job_that_traps_term_and_exits_zero_reports_zero(shell, launcher, paths):
    script = 'trap "exit 0" TERM; echo ready; while :; do sleep 0.05; done'
    with launched(shell, launcher, ["sh", "-c", script], launcher_env(paths)) as proc:
        wait_for(lambda: b"ready" in paths.log.read_bytes(), "the job to install its trap")
        os.killpg(job_group(paths), signal.SIGTERM)
        status = finish(proc)
    assert status == 0
    assert read_receipt(paths).exit_code == 0


def test_launcher_waits_for_the_real_status_after_a_trapped_signal(shell, launcher, paths):
    # The job ignores TERM and lives on; the launcher's no-op trap must not cut its wait short.
    script = 'trap "" TERM; echo ready; sleep 0.5; exit 4'
    with launched(shell, launcher, ["sh", "-c", script], launcher_env(paths, cap=1000)) as proc:
        wait_for(lambda: b"ready" in paths.log.read_bytes(), "the job to ignore TERM")
        os.killpg(job_group(paths), signal.SIGTERM)
        status = finish(proc)
    assert status == 4
    r = read_receipt(paths)
    assert r.exit_code == 4
    assert r.finished_at_ms - r.started_at_ms >= 400


# --- the job's environment --------------------------------------------------------------------

@pytest.mark.parametrize("cap", [0, 100000])
def test_job_sees_no_qlactors_variables_but_its_own(shell, launcher, paths, cap):
    assert run_job(shell, launcher, paths, ["env"], cap=cap) == 0
    out = paths.log.read_text()
    names = {line.partition("=")[0] for line in out.splitlines()}
    assert "QLT_NORMAL=visible" in out.splitlines()
    assert f"PATH={os.environ.get('PATH', '/usr/bin:/bin')}" in out.splitlines()
    assert not [n for n in names if n.startswith("QLACTORS_")]
    assert TOKEN not in out


def test_job_stdin_is_dev_null(shell, launcher, paths):
    # `cat` would block on any other stdin; with /dev/null it ends at once with no output.
    status = run_job(shell, launcher, paths, ["sh", "-c", 'readlink /proc/$$/fd/0; cat; echo "cat=$?"'])
    assert status == 0
    assert paths.log.read_text() == "/dev/null\ncat=0\n"


def test_job_gets_default_signal_dispositions(shell, launcher, paths):
    # SigIgn and SigBlk of the job itself: nothing ignored (so INT/QUIT/TERM/HUP kill it), nothing
    # blocked. The job is grep reading its own status (a job shell would show its own fork-time mask).
    assert run_job(shell, launcher, paths, ["grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"]) == 0
    lines = dict(line.split(":\t") for line in paths.log.read_text().splitlines())
    assert int(lines["SigBlk"], 16) == 0
    ignored = int(lines["SigIgn"], 16)
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        assert not ignored & (1 << (sig - 1)), f"{sig.name} is ignored in the job"


# --- start marker -----------------------------------------------------------------------------

def test_start_marker_names_the_launcher_and_exists_before_the_job(shell, launcher, paths):
    env = launcher_env(paths)
    with launched(shell, launcher, ["sh", "-c", 'cat "$1"', "job", str(paths.marker)], env) as proc:
        wait_exited(proc)
        live = read_identity(proc.pid)  # the launcher is a zombie now, still readable
        status = finish(proc)
    assert status == 0
    ident = read_marker(paths.marker)
    assert ident is not None
    assert parse_marker(paths.log.read_text()) == ident  # the job could read it: it was there first
    assert ident.pid == proc.pid
    assert ident.pgid == proc.pid  # own session, own group
    assert ident.start_ticks == live.start_ticks
    assert ident.boot_id == read_boot_id()
    assert ident == live
    assert (paths.marker.stat().st_mode & 0o777) == 0o600


def test_job_runs_in_a_process_group_and_session_of_its_own_named_by_the_marker(shell, launcher, paths):
    argv = ["sh", "-c", "read -r s </proc/self/stat; echo \"$s\"", "job"]
    with launched(shell, launcher, argv, launcher_env(paths)) as proc:
        status = finish(proc)
    assert status == 0
    fields = paths.log.read_text().rpartition(")")[2].split()
    job = read_job_marker(paths.marker)
    assert job is not None
    assert paths.log.read_text().split()[0] == str(job.pid)  # the marker names the job's own pid
    assert (int(fields[1]), int(fields[2]), int(fields[3])) == (proc.pid, job.pid, job.pid)  # ppid, pgrp, session
    assert job.pgid == job.pid and job.start_ticks == int(fields[19])
    assert read_marker(paths.marker).pid == proc.pid


def test_without_a_marker_the_job_stays_in_the_launchers_group_where_a_stop_can_find_it(shell, launcher, paths):
    env = {**launcher_env(paths), "QLACTORS_MARKER": str(paths.root / "missing-dir" / "marker")}
    argv = ["sh", "-c", "read -r s </proc/self/stat; echo \"$s\"", "job"]
    with launched(shell, launcher, argv, env) as proc:
        status = finish(proc)
    assert status == 0
    fields = paths.log.read_text().rpartition(")")[2].split()
    assert int(fields[2]) == proc.pid  # the launcher's group
    assert read_receipt(paths).exit_code == 0


def test_job_does_not_inherit_the_token_descriptor(shell, launcher, paths):
    argv = ["sh", "-c", 'if [ -e /proc/$$/fd/3 ]; then echo has3; else echo no3; fi']
    assert run_job(shell, launcher, paths, argv) == 0
    assert paths.log.read_text() == "no3\n"
    assert read_receipt(paths).token == TOKEN


def _alive(pid: int) -> bool:
    fields = proc_stat_fields(pid)
    return fields is not None and fields[0] != "Z"


@pytest.mark.parametrize("cap", [0, 4096])
def test_what_the_job_left_in_its_group_is_stopped_when_it_ends(shell, launcher, paths, cap):
    # The repro: the background child holds the log open for 8 s; the run is the job's.
    script = ('sh -c \'echo $$ >"$1"; exec sleep 8\' child "$1" & '
              'while ! [ -s "$1" ]; do sleep 0.01; done; echo done; exit 0')
    pidfile = paths.root / "child.pid"
    with launched(shell, launcher, ["sh", "-c", script, "job", str(pidfile)],
                  launcher_env(paths, cap=cap)) as proc:
        wait_exited(proc, timeout=6)  # long before the child's 8 s
        status = finish(proc)
    assert status == 0
    r = read_receipt(paths)
    assert (r.exit_code, r.output_open) == (0, 0)
    assert paths.log.read_text() == "done\n"
    assert not _alive(int(pidfile.read_text()))
    if cap:
        assert paths.dropped.read_text() == "0\n"
    assert_no_leftovers(paths)


def test_a_leftover_that_ignores_term_is_killed_after_the_stop_grace(shell, launcher, paths):
    script = 'sh -c \'trap "" TERM; echo $$ >"$1"; exec sleep 8\' child "$1" & sleep 0.2; exit 3'
    pidfile = paths.root / "child.pid"
    env = {**launcher_env(paths, cap=4096), "QLACTORS_STOP_GRACE_MS": "700"}
    with launched(shell, launcher, ["sh", "-c", script, "job", str(pidfile)], env) as proc:
        wait_exited(proc, timeout=6)
        exited_ms = int(time.time() * 1000)
        status = finish(proc)
    assert status == 3
    r = read_receipt(paths)
    assert r.exit_code == 3
    assert not _alive(int(pidfile.read_text()))
    # The run's end is the job's main process's, not the end of the stop grace that followed it
    # (the launcher's clock has 10 ms steps).
    assert r.finished_at_ms <= exited_ms - 700 + 20


def test_keep_leftovers_leaves_them_running_and_the_receipt_says_the_output_stayed_open(shell, launcher, paths):
    script = 'sh -c \'echo $$ >"$1"; exec sleep 8\' child "$1" & sleep 0.2; exit 0'
    pidfile = paths.root / "child.pid"
    env = {**launcher_env(paths, cap=4096), "QLACTORS_KEEP_LEFTOVERS": "1", "QLACTORS_DRAIN_MS": "200"}
    with launched(shell, launcher, ["sh", "-c", script, "job", str(pidfile)], env) as proc:
        wait_exited(proc, timeout=6)
        child = int(pidfile.read_text())
        try:
            assert _alive(child)
        finally:
            os.kill(child, signal.SIGKILL)
        status = finish(proc)
    assert status == 0
    r = read_receipt(paths)
    assert (r.exit_code, r.output_open) == (0, 1)


def test_an_escaped_child_cannot_hold_the_receipt_past_the_drain_bound(shell, launcher, paths):
    # The second repro: a child that called setsid left the job's group and session, so
    # nothing stops it; it keeps the log-cap FIFO open. The job's own exit code still lands.
    script = ('setsid sh -c \'echo $$ >"$1"; exec sleep 8\' esc "$1" & '
              'while ! [ -s "$1" ]; do sleep 0.01; done; echo quick; exit 4')
    pidfile = paths.root / "child.pid"
    env = {**launcher_env(paths, cap=4096), "QLACTORS_DRAIN_MS": "300"}
    with launched(shell, launcher, ["sh", "-c", script, "job", str(pidfile)], env) as proc:
        wait_exited(proc, timeout=6)
        child = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), "the escaped pid"))
        status = finish(proc)
        r = read_receipt(paths)
        assert (status, r.exit_code, r.output_open) == (4, 4, 1)
        assert not paths.dropped.exists()
        assert _alive(child)
        os.kill(child, signal.SIGKILL)
        # The reader (still in the launcher's group) ends at end of input and, told the receipt
        # went without a count, writes none.
        wait_for(lambda: not group_members(proc.pid), "the log reader to end")
    assert not paths.dropped.exists()
    assert paths.log.read_text() == "quick\n"


# --- log cap (SEMANTICS.md §11) ---------------------------------------------------------------

@pytest.fixture
def payload(tmp_path) -> pathlib.Path:
    p = tmp_path / "payload"
    p.write_bytes(os.urandom(100 * 1024))
    return p


def test_log_cap_keeps_first_bytes_counts_the_rest_and_keeps_exit_code(shell, launcher, paths, payload):
    paths.log.write_bytes(b"PRE\n")  # the launcher only appends
    status = run_job(shell, launcher, paths, ["sh", "-c", 'cat "$1"; exit 7', "job", str(payload)], cap=10000)
    assert status == 7
    data = payload.read_bytes()
    assert paths.log.read_bytes() == b"PRE\n" + data[:10000]
    assert paths.dropped.read_text() == f"{len(data) - 10000}\n"
    assert read_receipt(paths).exit_code == 7
    assert_no_leftovers(paths)


def test_log_cap_with_little_output_drops_nothing(shell, launcher, paths):
    assert run_job(shell, launcher, paths, ["echo", "hello"], cap=10000) == 0
    assert paths.log.read_bytes() == b"hello\n"
    assert paths.dropped.read_text() == "0\n"


def test_no_cap_logs_everything_and_writes_no_dropped_file(shell, launcher, paths, payload):
    paths.log.write_bytes(b"PRE\n")
    status = run_job(shell, launcher, paths, ["sh", "-c", 'cat "$1"; exit 7', "job", str(payload)], cap=0)
    assert status == 7
    assert paths.log.read_bytes() == b"PRE\n" + payload.read_bytes()
    assert not paths.dropped.exists()
    assert_no_leftovers(paths)


def test_job_writing_through_a_group_term_never_gets_sigpipe(shell, launcher, paths):
    # The job survives TERM (trap), keeps writing well past the cap, then dies of TERM itself.
    # Had the log reader died of that TERM, those writes would kill the job with SIGPIPE (141).
    # t is cleared before "ready" announces the trap: a TERM may land as soon as "ready" is out.
    script = ('t=; trap "t=1" TERM; echo ready; while [ -z "$t" ]; do echo before; done; '
              'n=0; while [ $n -lt 3000 ]; do echo "after $n"; n=$((n+1)); done; '
              'trap - TERM; kill -TERM $$')
    with launched(shell, launcher, ["sh", "-c", script], launcher_env(paths, cap=100)) as proc:
        wait_for(lambda: b"ready" in paths.log.read_bytes(), "the job to start writing")
        os.killpg(job_group(paths), signal.SIGTERM)
        status = finish(proc)
    assert status == 143
    assert read_receipt(paths).exit_code == 143
    assert len(paths.log.read_bytes()) == 100
    assert int(paths.dropped.read_text()) > 3000 * len("after 0\n")
    assert_no_leftovers(paths)


@pytest.mark.parametrize("fifo", ["absent", "regular file"])
def test_cap_without_a_usable_fifo_runs_the_job_uncapped(shell, launcher, paths, payload, fifo):
    # The executor makes the FIFO; if it could not (or something else sits at the path), the job
    # still runs, straight onto the log, and no dropped-bytes file claims a cap applied.
    env = launcher_env(paths, cap=1000, fifo=False)
    if fifo == "regular file":
        paths.fifo.write_bytes(b"")
        env["QLACTORS_FIFO"] = str(paths.fifo)
    with launched(shell, launcher, ["sh", "-c", 'cat "$1"; exit 7', "job", str(payload)], env) as proc:
        status = finish(proc)
    assert status == 7
    assert paths.log.read_bytes() == payload.read_bytes()
    assert not paths.dropped.exists()
    assert read_receipt(paths).exit_code == 7
    if fifo == "regular file":
        assert paths.fifo.read_bytes() == b""
    assert_no_leftovers(paths)


def _is_gnu_dd(dd: str) -> bool:
    out = subprocess.run([dd, "--version"], capture_output=True, text=True, timeout=TIMEOUT_S)
    return "coreutils" in out.stdout


@pytest.fixture(params=["gnu", "busybox"], ids=["gnu-dd", "busybox-dd"])
def dd_prefix(request) -> tuple[str, ...]:
    """A launch prefix that makes the launcher's `dd` GNU dd or busybox dd.

    The launcher takes its tools from the standard directories first, so busybox dd is
    bind-mounted over the system dd in a private user + mount namespace (`unshare -Urm`);
    run as `dd`, busybox runs its dd applet.
    """
    dd = shutil.which("dd", path=LAUNCHER_TOOL_PATH)
    if dd is None:
        pytest.fail("no dd in the launcher's tool path")
    if request.param == "gnu":
        if not _is_gnu_dd(dd):
            unavailable("GNU dd", f"{dd} is not GNU dd (apt-get install coreutils)")
        return ()
    busybox = shutil.which("busybox")
    if busybox is None:
        unavailable("busybox", "not on PATH (apt-get install busybox)")
    return dd_bind_prefix(os.path.realpath(busybox), dd, "BusyBox")


def dd_bind_prefix(source: str, dd: str, expect: str) -> tuple[str, ...]:
    """A launch prefix with `source` bind-mounted over the system `dd` (skips if not possible,
    fails in CI)."""
    if shutil.which("unshare") is None:
        unavailable("unshare", "not on PATH, so no other dd can stand in place of the system dd "
                               "(apt-get install util-linux)")
    prefix = ("unshare", "-Urm", "/bin/sh", "-c", 'mount --bind "$1" "$2" && shift 2 && exec "$@"',
              "bind-dd", source, dd)
    probe = subprocess.run([*prefix, dd, "--help"], capture_output=True, text=True, timeout=TIMEOUT_S)
    if expect not in probe.stdout + probe.stderr:
        unavailable("a private mount namespace (unshare -Urm; mount --bind)",
                    f"cannot bind-mount {source} over {dd}: {probe.stderr.strip()[:300]}")
    return prefix


def wait_for_size(path: pathlib.Path, size: int, timeout: float = 5.0) -> None:
    """A tight poll (one per chunk below, hundreds per test): the log reaching `size` bytes."""
    deadline = time.monotonic() + timeout
    while (now := path.stat().st_size) != size:
        if now > size:
            pytest.fail(f"{path} grew past {size} bytes to {now}")
        if time.monotonic() > deadline:
            pytest.fail(f"{path} has {now} bytes, not {size}, after {timeout} s")
        time.sleep(0.0005)


@pytest.mark.parametrize("cap", [1024, 65536])
def test_each_read_reaches_the_log_at_once_and_the_cap_is_exact(shell, launcher, paths, dd_prefix, cap):
    # The job (cat) passes on what the test feeds it. Each chunk must be in the log before the
    # next is fed: dd may not hold a short read back (no fullblock, no stdio). 300 chunks of half
    # a dd block (bs = cap / 256), each its own short read, take GNU dd past the reads it is
    # allowed (ceil(count / bs): GNU counts a short read as a record), so the launcher must run dd
    # again and still stop at exactly CAP bytes; busybox dd counts bytes and just goes on.
    feed = paths.root / "feed"
    os.mkfifo(feed, 0o600)
    chunk_size = max(1, cap // 256 // 2)
    sent = bytearray()
    env = launcher_env(paths, cap=cap)
    with launched(shell, launcher, ["cat", str(feed)], env, prefix=dd_prefix) as proc:
        w = os.open(feed, os.O_WRONLY)  # returns once cat has opened the other end
        try:
            for i in range(300):
                chunk = bytes([ord("a") + i % 26]) * chunk_size
                os.write(w, chunk)
                sent += chunk
                wait_for_size(paths.log, len(sent))
            rest = os.urandom(2 * cap)  # past the cap: kept up to it, the rest drained and counted
            os.write(w, rest)
            sent += rest
        finally:
            os.close(w)
        status = finish(proc)
    assert status == 0
    assert paths.log.read_bytes() == bytes(sent[:cap])
    assert paths.dropped.read_text() == f"{len(sent) - cap}\n"
    assert read_receipt(paths).exit_code == 0
    assert_no_leftovers(paths)


def test_output_already_read_survives_a_kill_of_the_job(shell, launcher, paths, dd_prefix):
    env = launcher_env(paths, cap=65536)
    argv = ["sh", "-c", "printf partial; exec sleep 5"]
    with launched(shell, launcher, argv, env, prefix=dd_prefix) as proc:
        wait_for(lambda: paths.log.read_bytes() == b"partial", "the partial line to reach the log")
        job = wait_for(lambda: job_pid(proc.pid, "sleep"), "the job to exec sleep")
        os.kill(job, signal.SIGKILL)
        status = finish(proc)
    assert status == 137
    assert paths.log.read_bytes() == b"partial"
    assert paths.dropped.read_text() == "0\n"
    assert read_receipt(paths).exit_code == 137


def test_a_dd_without_count_bytes_still_keeps_the_log_up_to_the_cap(shell, launcher, paths, payload):
    # An old dd refuses iflag=count_bytes before reading anything: the reader then copies with
    # one read per dd (count=1) instead of counting the whole output as dropped.
    dd = shutil.which("dd", path=LAUNCHER_TOOL_PATH)
    if dd is None or not _is_gnu_dd(dd):
        unavailable("GNU dd", f"{dd} is not GNU dd, and only GNU dd can stand behind the old-dd wrapper "
                              "(apt-get install coreutils)")
    real = paths.root / "real-dd"
    shutil.copy2(dd, real)
    old_dd = paths.root / "old-dd"
    old_dd.write_text('#!/bin/sh\n'
                      '# old-dd: no iflag operand\n'
                      'case " $* " in *" iflag="*) echo "dd: invalid argument" >&2; exit 1 ;; esac\n'
                      f'exec {real} "$@"\n')
    old_dd.chmod(0o755)
    prefix = dd_bind_prefix(str(old_dd), dd, "Usage")
    argv = ["sh", "-c", 'cat "$1"; exit 7', "job", str(payload)]
    with launched(shell, launcher, argv, launcher_env(paths, cap=10000), prefix=prefix) as proc:
        status = finish(proc)
    assert status == 7
    data = payload.read_bytes()
    assert paths.log.read_bytes() == data[:10000]
    assert paths.dropped.read_text() == f"{len(data) - 10000}\n"
    assert read_receipt(paths).exit_code == 7


# --- exec count -------------------------------------------------------------------------------

MAX_EXECS = 7  # the shell, dd, setsid, the job, and ln, rm, sync for the receipt


@pytest.mark.parametrize("cap", [0, 4096])
def test_a_quiet_job_costs_at_most_seven_execs(shell, launcher, paths, cap):
    # Every program the launcher runs costs ~1 ms of CPU per job: only the reader's dd (under a
    # cap), setsid (the job's own group), the job and the receipt's ln, rm, sync may run; the
    # rest are builtins. Under a cap one short `sleep` may come on top, when the reader had not
    # written its count yet at the moment the launcher looked.
    strace = shutil.which("strace")
    if strace is None:
        unavailable("strace", "not on PATH (apt-get install strace)")
    trace = paths.root / "trace"
    prefix = (strace, "-f", "-ff", "-qq", "-e", "trace=execve", "-o", str(trace))
    with launched(shell, launcher, ["true"], launcher_env(paths, cap=cap), prefix=prefix) as proc:
        returncode = proc.wait(timeout=TIMEOUT_S * 3)
    traces = sorted(paths.root.glob("trace.*"))
    assert traces, "strace traced nothing"
    assert returncode == 0
    assert read_receipt(paths).exit_code == 0
    # One file per process: a successful execve ends in "= 0"; PATH misses (ENOENT) do not count.
    execs = [m.group(1) for t in traces for line in t.read_text().splitlines()
             if (m := re.match(r'execve\("([^"]+)".*\) = 0$', line))]
    print(f"\n{len(execs)} execs with {' '.join(shell)}, cap {cap}: {' '.join(execs)}")
    names = sorted(os.path.basename(e) for e in execs)
    if cap and "sleep" in names:
        names.remove("sleep")
    assert len(names) <= MAX_EXECS, execs
    names.remove(os.path.basename(shutil.which(shell[0])))  # the shell itself, as strace started it
    expected = ["dd", "ln", "rm", "setsid", "sync", "true"] if cap else ["ln", "rm", "setsid", "sync", "true"]
    assert names == expected


# --- publication ------------------------------------------------------------------------------

@pytest.mark.parametrize("cap", [0, 1000])
def test_existing_final_receipt_is_never_overwritten(shell, launcher, paths, cap):
    paths.receipt.write_bytes(b"X")
    status = run_job(shell, launcher, paths, ["sh", "-c", "exit 5"], cap=cap)
    assert status == 5
    assert paths.receipt.read_bytes() == b"X"
    assert_no_leftovers(paths)


def test_receipt_is_private(shell, launcher, paths):
    assert run_job(shell, launcher, paths, ["true"]) == 0
    assert (paths.receipt.stat().st_mode & 0o777) == 0o600
    read_receipt(paths)


def test_full_file_system_leaves_no_receipt_and_keeps_exit_status(shell, launcher, paths):
    if shutil.which("unshare") is None:
        unavailable("unshare", "not on PATH, so no full file system can be built without privileges "
                               "(apt-get install util-linux)")
    mnt = paths.root / "full"
    mnt.mkdir()
    env = launcher_env(paths)
    env["QLACTORS_RECEIPT_DIR"] = str(mnt / "ab")
    driver = r'''
        d=$1; shift
        mount -t tmpfs -o size=64k none "$d" || exit 99
        mkdir -m 700 "$d/ab"
        dd if=/dev/zero of="$d/fill" bs=4k 2>/dev/null
        if printf x >"$d/probe" 2>/dev/null; then echo not-full; fi
        rm -f "$d/probe"
        "$@"
        echo "status=$?"
        echo "entries=$(ls -A "$d/ab")"
    '''
    argv = ["unshare", "-Urm", "/bin/sh", "-c", driver, "driver", str(mnt), *shell, launcher,
            "sh", "-c", "echo ran; exit 9"]
    proc = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=TIMEOUT_S)
    if proc.returncode != 0:
        unavailable("a private mount namespace (unshare -Urm; mount -t tmpfs)",
                    f"exit {proc.returncode}, {err.decode(errors='replace').strip()[:300]}")
    lines = out.decode().splitlines()
    assert "not-full" not in lines
    assert "status=9" in lines
    assert "entries=" in lines  # no final receipt, no temp file
    assert paths.log.read_text() == "ran\n"


# --- cwd --------------------------------------------------------------------------------------

def test_job_runs_in_the_requested_directory(shell, launcher, paths):
    work = paths.root / "work dir"
    work.mkdir()
    assert run_job(shell, launcher, paths, ["pwd"], cwd=str(work)) == 0
    assert paths.log.read_text() == os.path.realpath(work) + "\n"


@pytest.mark.parametrize("cap", [0, 1000])
def test_missing_directory_reports_126_without_running_the_job(shell, launcher, paths, cap):
    status = run_job(shell, launcher, paths, ["sh", "-c", "echo ran"], cwd=str(paths.root / "nope"), cap=cap)
    assert status == 126
    assert read_receipt(paths).exit_code == 126
    assert "ran" not in paths.log.read_text()
    assert_no_leftovers(paths)


# --- memory -----------------------------------------------------------------------------------

def pss_kib(pid: int) -> int:
    text = pathlib.Path(f"/proc/{pid}/smaps_rollup").read_text()  # unreadable: the test fails
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    raise AssertionError(f"no Pss line in /proc/{pid}/smaps_rollup")


def test_launcher_tree_minus_the_job_fits_the_pss_budget(shell, launcher, paths):
    with launched(shell, launcher, ["sleep", "5"], launcher_env(paths, cap=4096)) as proc:
        job = wait_for(lambda: job_pid(proc.pid, "sleep"), "the job to exec sleep")
        # Steady state: the launcher, the log reader (a subshell waiting in `dd` inside a
        # command substitution), and the job.
        wait_for(lambda: any(cmdline(p)[:1] == ["dd"] for p in group_members(proc.pid)),
                 "the log reader's dd")
        figures = {pid: (cmdline(pid), pss_kib(pid)) for pid in group_members(proc.pid) if pid != job}
        total = sum(kib for _, kib in figures.values())
        print(f"\nlauncher tree PSS with {' '.join(shell)}: {total} KiB (job {job} excluded)")
        for pid, (argv, kib) in sorted(figures.items()):
            print(f"  {pid:>7} {kib:>5} KiB  {' '.join(argv)[:80]}")
        os.killpg(job_group(paths), signal.SIGTERM)
        assert finish(proc) == 143
    assert proc.pid in figures
    assert total <= PSS_BUDGET_KIB
