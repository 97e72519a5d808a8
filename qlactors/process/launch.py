"""Spawning the launcher and signalling its process group, by exact identity only."""

from __future__ import annotations

import os
import signal
from importlib import resources
from pathlib import Path
from typing import Mapping

from .identity import Liveness, ProcessIdentity, probe

# A non-interactive parent often ignores INT/QUIT, and `sh` cannot reset an ignored signal:
# hand the launcher default dispositions and an empty mask (STYLE.md traps).
DEFAULT_SIGNALS = frozenset({signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTERM,
                             signal.SIGPIPE, signal.SIGXFSZ, signal.SIGUSR1, signal.SIGUSR2,
                             signal.SIGALRM, signal.SIGCHLD})
INTERNAL_PREFIX = "QLACTORS_"
# What the executor hands the launcher; launcher.sh unsets exactly these before the job runs,
# and job_environment drops the whole prefix, so none reaches a job from the runtime's own env.
LAUNCHER_VARIABLES = ("QLACTORS_RUN_ID", "QLACTORS_ATTEMPT_ID", "QLACTORS_TOKEN",
                      "QLACTORS_RECEIPT_DIR", "QLACTORS_MARKER", "QLACTORS_LOG", "QLACTORS_LOG_CAP",
                      "QLACTORS_FIFO", "QLACTORS_DROPPED", "QLACTORS_CWD", "QLACTORS_CLOCK_BASE_MS")


def launcher_path() -> Path:
    """The launcher script shipped as package data (installed as a plain file)."""
    return Path(str(resources.files("qlactors.process") / "launcher.sh"))


def job_environment(runtime_env: Mapping[str, str], task_env: Mapping[str, str]) -> dict[str, str]:
    """The runtime's own environment plus the task's, minus qlactors' internal variables."""
    env = {k: v for k, v in runtime_env.items() if not k.startswith(INTERNAL_PREFIX)}
    env.update(task_env)
    return env


def uptime_ms(path: str = "/proc/uptime") -> int:
    with open(path) as fh:
        return int(float(fh.read().split()[0]) * 1000)


def spawn(argv: list[str], env: Mapping[str, str], *, shell: str = "/bin/sh") -> int:
    """Start `shell launcher.sh ARGV...` in a new session; returns its pid (also its process group).

    stdin/stdout/stderr of the launcher are /dev/null: the job's output goes to its log through
    the launcher, and the launcher must not hold the runtime's own stdout (a service's pipe).
    Every argv item, env name and value is handed over as bytes (`os.fsencode`, the inverse of
    how qlactors holds them, see qlactors.domain.posix): the job gets exactly the bytes it was
    given, UTF-8 or not.
    """
    shell_argv = shell.split()
    return os.posix_spawn(
        os.fsencode(shell_argv[0]), [os.fsencode(a) for a in (*shell_argv, str(launcher_path()), *argv)],
        {os.fsencode(k): os.fsencode(v) for k, v in env.items()},
        setsid=True, setsigdef=DEFAULT_SIGNALS, setsigmask=(),
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
            (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
        ],
    )


def signal_group(identity: ProcessIdentity, sig: int, *, current_boot_id: str) -> Liveness:
    """Re-check the exact identity, then signal the whole group; never a bare or recycled pid."""
    liveness = probe(identity, current_boot_id=current_boot_id)
    if liveness is Liveness.RUNNING:
        try:
            os.killpg(identity.pgid, sig)
        except ProcessLookupError:
            return Liveness.NOT_RUNNING
    return liveness
