"""Spawning and signalling: only an exact identity is ever signalled; the edge stack loads no psycopg."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
import time

from qlactors.domain.receipt import decode_receipt
from qlactors.process.identity import Liveness, read_boot_id, read_identity, read_job_marker
from qlactors.process.launch import (LAUNCHER_VARIABLES, job_environment, launcher_path,
                                     signal_group, signal_job, spawn)


def _sleeper():
    return subprocess.Popen(["sleep", "30"], start_new_session=True)


def test_a_recycled_pid_is_not_running_and_never_signalled():
    proc = _sleeper()
    try:
        identity = read_identity(proc.pid)
        recycled = dataclasses.replace(identity, start_ticks=identity.start_ticks + 1)
        assert signal_group(recycled, signal.SIGTERM, current_boot_id=read_boot_id()) is Liveness.NOT_RUNNING
        time.sleep(0.2)
        assert proc.poll() is None  # not signalled
        other_boot = dataclasses.replace(identity, boot_id="00000000-0000-0000-0000-000000000000")
        assert signal_group(other_boot, signal.SIGTERM, current_boot_id=read_boot_id()) is Liveness.NOT_RUNNING
        assert proc.poll() is None
        assert signal_group(identity, signal.SIGTERM, current_boot_id=read_boot_id()) is Liveness.RUNNING
        assert proc.wait(5) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def test_job_environment_drops_internal_variables_and_adds_the_tasks():
    env = job_environment({"PATH": "/bin", "QLACTORS_HOME": "/x", "QLACTORS_FAULT": "y"}, {"A": "1"})
    assert env == {"PATH": "/bin", "A": "1"}


def test_every_launcher_variable_is_internal_and_unset_by_the_launcher():
    # The launcher's `unset` line (joined across its continuation) names exactly these variables.
    text = launcher_path().read_text().replace("\\\n", " ")
    [unset] = [line.split()[1:] for line in text.splitlines() if line.startswith("unset QLACTORS_")]
    assert sorted(unset) == sorted(LAUNCHER_VARIABLES)
    assert "QLACTORS_FIFO" in LAUNCHER_VARIABLES
    runtime = {name: "leak" for name in LAUNCHER_VARIABLES} | {"PATH": "/bin"}
    assert job_environment(runtime, {}) == {"PATH": "/bin"}


def test_the_edge_stack_loads_no_postgresql_driver():
    code = "import sys, qlactors.profiles.edge, qlactors.cli.runtime_commands; print(sorted(m for m in sys.modules if m.startswith('psycopg')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def _wait_file(path, timeout: float = 10.0) -> bytes:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_bytes()
        time.sleep(0.01)
    raise AssertionError(f"{path} did not appear")


def test_the_callback_token_is_never_in_the_launchers_environment(tmp_path):
    # /proc/PID/environ shows a process's initial environment for its whole life: the token must
    # come on a descriptor instead, and still reach the receipt.
    token = "T0k3n_" + "z" * 40
    receipts = tmp_path / "ab"
    receipts.mkdir(mode=0o700)
    log = tmp_path / "log"
    log.touch(mode=0o600)
    env = job_environment(os.environ, {})
    env.update(QLACTORS_RUN_ID="run1", QLACTORS_ATTEMPT_ID="att1", QLACTORS_RECEIPT_DIR=str(receipts),
               QLACTORS_MARKER=str(tmp_path / "marker"), QLACTORS_LOG=str(log), QLACTORS_LOG_CAP="0")
    gate = tmp_path / "gate"
    pid = spawn(["sh", "-c", 'while ! [ -e "$1" ]; do sleep 0.01; done', "job", str(gate)], env, token=token)
    try:
        _wait_file(tmp_path / "marker")
        environ = pathlib.Path(f"/proc/{pid}/environ").read_bytes()
        assert b"QLACTORS_RUN_ID=run1" in environ  # it is the launcher's environment we read
        assert token.encode() not in environ
        gate.touch()
        _, status = os.waitpid(pid, 0)
    finally:
        if not gate.exists():
            gate.touch()
            os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert decode_receipt((receipts / "att1.json").read_bytes()).token == token


def _launch_and_wait(tmp_path, argv, *, token, extra_env=None):
    """Run ARGV under the launcher without a cap; its exit status, its log and its receipt."""
    receipts = tmp_path / "ab"
    receipts.mkdir(mode=0o700)
    log = tmp_path / "log"
    log.touch(mode=0o600)
    env = job_environment(os.environ, extra_env or {})
    env.update(QLACTORS_RUN_ID="run1", QLACTORS_ATTEMPT_ID="att1", QLACTORS_RECEIPT_DIR=str(receipts),
               QLACTORS_MARKER=str(tmp_path / "marker"), QLACTORS_LOG=str(log), QLACTORS_LOG_CAP="0")
    pid = spawn(argv, env, token=token)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), log.read_bytes(), (receipts / "att1.json").read_bytes()


def test_the_token_reaches_the_launcher_when_the_runtime_runs_with_stdin_closed(tmp_path):
    # A daemoniser may start the runtime with descriptor 0 closed: the token pipe's read end is
    # then descriptor 0, which the spawn also points at /dev/null; the token must move first.
    token = "T0k3n_" + "c" * 40
    saved = os.dup(0)
    os.close(0)
    try:
        code, _log, receipt = _launch_and_wait(tmp_path, ["sh", "-c", "exit 5"], token=token)
    finally:
        os.dup2(saved, 0)
        os.close(saved)
    assert code == 5
    assert decode_receipt(receipt).token == token


def test_an_inherited_q_token_variable_never_carries_the_token_to_the_job(tmp_path):
    # A variable the launcher's environment brings in stays exported when the launcher assigns
    # it: the launcher unsets its token variable first (a task cannot name one q_* either).
    token = "T0k3n_" + "e" * 40
    code, log, receipt = _launch_and_wait(tmp_path, ["sh", "-c", "env"], token=token,
                                          extra_env={"q_token": "planted"})
    assert code == 0 and decode_receipt(receipt).token == token
    assert token.encode() not in log


def test_a_stop_kills_the_jobs_group_and_the_launcher_lives_on_to_publish(tmp_path):
    # KILL is what tells the two groups apart: sent to the launcher's, no receipt could follow.
    receipts = tmp_path / "ab"
    receipts.mkdir(mode=0o700)
    log = tmp_path / "log"
    log.touch(mode=0o600)
    marker = tmp_path / "marker"
    env = job_environment(os.environ, {})
    env.update(QLACTORS_RUN_ID="run1", QLACTORS_ATTEMPT_ID="att1", QLACTORS_RECEIPT_DIR=str(receipts),
               QLACTORS_MARKER=str(marker), QLACTORS_LOG=str(log), QLACTORS_LOG_CAP="0")
    pid = spawn(["sleep", "30"], env, token="T0k3n_" + "k" * 40)
    try:
        launcher = read_identity(pid)
        deadline = time.monotonic() + 10
        while True:  # until the job's process has made its own group
            job = read_job_marker(marker) if marker.exists() else None
            if job is not None and read_identity(job.pid).pgid == job.pid:
                break
            assert time.monotonic() < deadline, "the job never got its own group"
            time.sleep(0.01)
        # A launcher identity that no longer matches (a recycled pid) signals nothing at all.
        recycled = dataclasses.replace(launcher, start_ticks=launcher.start_ticks + 1)
        assert signal_job(recycled, marker, signal.SIGKILL, current_boot_id=read_boot_id()) is Liveness.NOT_RUNNING
        assert read_identity(job.pid).pgid == job.pid  # the job still runs
        assert signal_job(launcher, marker, signal.SIGKILL, current_boot_id=read_boot_id()) is Liveness.RUNNING
        _, status = os.waitpid(pid, 0)
    except BaseException:
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    assert os.waitstatus_to_exitcode(status) == 137
    assert decode_receipt((receipts / "att1.json").read_bytes()).exit_code == 137
    # Its identity gone, nothing is signalled any more.
    assert signal_job(launcher, marker, signal.SIGKILL, current_boot_id=read_boot_id()) is Liveness.NOT_RUNNING
