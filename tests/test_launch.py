"""Spawning and signalling: only an exact identity is ever signalled; the edge stack loads no psycopg."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time

from qlactors.process.identity import Liveness, read_boot_id, read_identity
from qlactors.process.launch import (LAUNCHER_VARIABLES, job_environment, launcher_path,
                                     signal_group)


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
    code = "import sys, qlactors.edge, qlactors.cli.runtime_commands; print(sorted(m for m in sys.modules if m.startswith('psycopg')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
