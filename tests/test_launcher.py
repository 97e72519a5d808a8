"""The launcher script under dash and busybox sh, with real processes, signals and file systems."""

from __future__ import annotations

import contextlib
import importlib.resources
import os
import pathlib
import select
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

import pytest

from qlactors.domain.receipt import Receipt, decode_receipt, encode_receipt
from qlactors.process.identity import parse_marker, read_boot_id, read_identity, read_marker

IN_CI = os.environ.get("CI") == "true"
TIMEOUT_S = 10.0
TOKEN = "tOk3n_-" + "A" * 36  # 43 characters of base64url, like a real one
RUN_ID = "run-0190a1b2-c3d4"
ATTEMPT_ID = "att-0190a1b2_c3d4"
PSS_BUDGET_KIB = 2048

SHELLS = [pytest.param(("/bin/sh",), id="dash"), pytest.param(("busybox", "sh"), id="busybox")]


@pytest.fixture(params=SHELLS)
def shell(request) -> tuple[str, ...]:
    """The launcher's interpreter; a missing busybox skips on a laptop and fails in CI."""
    argv = request.param
    if shutil.which(argv[0]) is None:
        if IN_CI:
            pytest.fail(f"{argv[0]} is required in CI and is not installed")
        pytest.skip(f"{argv[0]} is not installed (set CI=true to make this a failure)")
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


def launcher_env(paths: Paths, *, cap: int = 0, cwd: str | None = None) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "QLT_NORMAL": "visible",
        "QLACTORS_RUN_ID": RUN_ID,
        "QLACTORS_ATTEMPT_ID": ATTEMPT_ID,
        "QLACTORS_TOKEN": TOKEN,
        "QLACTORS_RECEIPT_DIR": str(paths.receipts),
        "QLACTORS_MARKER": str(paths.marker),
        "QLACTORS_LOG": str(paths.log),
        "QLACTORS_LOG_CAP": str(cap),
        "QLACTORS_DROPPED": str(paths.dropped),
        "QLACTORS_CLOCK_BASE_MS": str(clock_base_ms()),
    }
    if cwd is not None:
        env["QLACTORS_CWD"] = cwd
    return env


@contextlib.contextmanager
def launched(shell, launcher, argv, env):
    """Start the launcher in its own session; whatever is left of its group is killed at the end."""
    proc = subprocess.Popen([*shell, launcher, *argv], env=env, start_new_session=True,
                            stdin=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        if proc.returncode is None:
            # Not reaped yet, so the pgid is still ours: kill the group, then reap.
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
    """Only final names remain: no receipt, marker or dropped temp, no FIFO directory."""
    assert sorted(p.name for p in paths.receipts.iterdir()) in ([], [paths.receipt.name])
    assert {p.name for p in paths.run.iterdir()} <= {"marker", "log", "dropped"}


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


def job_pid(launcher_pid: int, program: str) -> int | None:
    """The launcher's child that has exec'd `program` (the job), if any yet."""
    for pid, fields in group_members(launcher_pid).items():
        if int(fields[1]) == launcher_pid:
            argv = cmdline(pid)
            if argv and os.path.basename(argv[0]) == program:
                return pid
    return None


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


# --- signals to the process group (stop, SEMANTICS.md §7) -------------------------------------

@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_group_signal_kills_the_job_and_launcher_publishes_receipt(shell, launcher, paths, sig, code):
    with launched(shell, launcher, ["sleep", "5"], launcher_env(paths)) as proc:
        wait_for(lambda: job_pid(proc.pid, "sleep"), "the job to exec sleep")
        os.killpg(proc.pid, sig)
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
        os.killpg(proc.pid, signal.SIGTERM)
        status = finish(proc)
    assert status == 0
    assert read_receipt(paths).exit_code == 0


def test_launcher_waits_for_the_real_status_after_a_trapped_signal(shell, launcher, paths):
    # The job ignores TERM and lives on; the launcher's no-op trap must not cut its wait short.
    script = 'trap "" TERM; echo ready; sleep 0.5; exit 4'
    with launched(shell, launcher, ["sh", "-c", script], launcher_env(paths, cap=1000)) as proc:
        wait_for(lambda: b"ready" in paths.log.read_bytes(), "the job to ignore TERM")
        os.killpg(proc.pid, signal.SIGTERM)
        status = finish(proc)
    assert status == 4
    r = read_receipt(paths)
    assert r.exit_code == 4
    assert r.finished_at_ms - r.started_at_ms >= 400


# --- the job's environment --------------------------------------------------------------------

def test_job_sees_no_qlactors_variables_but_its_own(shell, launcher, paths):
    assert run_job(shell, launcher, paths, ["env"]) == 0
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
    script = ('trap "t=1" TERM; echo ready; t=; while [ -z "$t" ]; do echo before; done; '
              'n=0; while [ $n -lt 3000 ]; do echo "after $n"; n=$((n+1)); done; '
              'trap - TERM; kill -TERM $$')
    with launched(shell, launcher, ["sh", "-c", script], launcher_env(paths, cap=100)) as proc:
        wait_for(lambda: b"ready" in paths.log.read_bytes(), "the job to start writing")
        os.killpg(proc.pid, signal.SIGTERM)
        status = finish(proc)
    assert status == 143
    assert read_receipt(paths).exit_code == 143
    assert len(paths.log.read_bytes()) == 100
    assert int(paths.dropped.read_text()) > 3000 * len("after 0\n")
    assert_no_leftovers(paths)


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
        pytest.skip("unshare is not installed: cannot build a full file system without privileges")
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
        pytest.skip(f"cannot mount a private tmpfs (unshare -Urm; mount): exit {proc.returncode}, "
                    f"{err.decode(errors='replace').strip()[:300]}")
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
        os.killpg(proc.pid, signal.SIGTERM)
        assert finish(proc) == 143
    assert proc.pid in figures
    assert total <= PSS_BUDGET_KIB
