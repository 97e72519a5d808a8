"""Spawning the launcher and signalling its process group, by exact identity only."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from .identity import Liveness, ProcessIdentity, probe, read_markers

# A non-interactive parent often ignores INT/QUIT, and `sh` cannot reset an ignored signal:
# hand the launcher default dispositions and an empty mask (STYLE.md traps).
DEFAULT_SIGNALS = frozenset({signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTERM,
                             signal.SIGPIPE, signal.SIGXFSZ, signal.SIGUSR1, signal.SIGUSR2,
                             signal.SIGALRM, signal.SIGCHLD})
INTERNAL_PREFIX = "QLACTORS_"
# What the executor hands the launcher; launcher.sh unsets exactly these before the job runs,
# and job_environment drops the whole prefix, so none reaches a job from the runtime's own env.
# The callback token is not among them: it comes on TOKEN_FD (see spawn).
LAUNCHER_VARIABLES = ("QLACTORS_RUN_ID", "QLACTORS_ATTEMPT_ID",
                      "QLACTORS_RECEIPT_DIR", "QLACTORS_MARKER", "QLACTORS_LOG", "QLACTORS_LOG_CAP",
                      "QLACTORS_FIFO", "QLACTORS_DROPPED", "QLACTORS_CWD", "QLACTORS_CLOCK_BASE_MS",
                      "QLACTORS_STOP_GRACE_MS", "QLACTORS_KEEP_LEFTOVERS", "QLACTORS_DRAIN_MS")
# The launcher reads the callback token from this descriptor (one digit: dash redirects 0-9 only).
TOKEN_FD = 3


def launcher_path() -> Path:
    """The launcher script shipped as package data (installed as a plain file)."""
    return Path(str(resources.files("qlactors.process") / "launcher.sh"))


def job_environment(runtime_env: Mapping[str, str], task_env: Mapping[str, str]) -> dict[str, str]:
    """The runtime's own environment plus the task's, minus qlactors' internal variables."""
    env = {k: v for k, v in runtime_env.items() if not k.startswith(INTERNAL_PREFIX)}
    env.update(task_env)
    return env


@dataclass(frozen=True, slots=True)
class LaunchFiles:
    """Where one attempt's launcher writes: its receipt shard, start marker, log, the log-cap
    reader's dropped-byte count and (with a cap) the FIFO the executor made for it."""

    receipt_dir: str
    marker: str
    log: str
    dropped: str
    fifo: str | None = None


def launcher_environment(runtime_env: Mapping[str, str], task_env: Mapping[str, str], *, run_id: str,
                         attempt_id: str, files: LaunchFiles, log_cap: int, clock_base_ms: int,
                         stop_grace_ms: int, drain_ms: int, cwd: str | None = None,
                         keep_leftovers: bool = False) -> dict[str, str]:
    """The launcher's environment: the job's own (`job_environment`) and LAUNCHER_VARIABLES, which
    launcher.sh unsets before the job runs."""
    env = job_environment(runtime_env, task_env)
    env.update({
        "QLACTORS_RUN_ID": run_id, "QLACTORS_ATTEMPT_ID": attempt_id,
        "QLACTORS_RECEIPT_DIR": files.receipt_dir, "QLACTORS_MARKER": files.marker, "QLACTORS_LOG": files.log,
        "QLACTORS_LOG_CAP": str(log_cap), "QLACTORS_DROPPED": files.dropped,
        "QLACTORS_CLOCK_BASE_MS": str(clock_base_ms), "QLACTORS_STOP_GRACE_MS": str(stop_grace_ms),
        "QLACTORS_DRAIN_MS": str(drain_ms),
    })
    if cwd:
        env["QLACTORS_CWD"] = cwd
    if files.fifo is not None:
        env["QLACTORS_FIFO"] = files.fifo
    if keep_leftovers:
        env["QLACTORS_KEEP_LEFTOVERS"] = "1"
    return env


def uptime_ms(path: str = "/proc/uptime") -> int:
    with open(path) as fh:
        return int(float(fh.read().split()[0]) * 1000)


def _token_pipe(token: str) -> int:
    """The read end of a pipe holding `token` and a newline, never descriptor TOKEN_FD itself.

    A pipe, not the environment: /proc/PID/environ keeps a process's initial environment for its
    whole life, readable by the same user; the launcher reads the pipe once and closes it. The
    write end is closed before the spawn, so the launcher's `read` ends at the newline or EOF.
    """
    data = token.encode("ascii") + b"\n"
    read_end, write_end = os.pipe()  # non-inheritable: only the spawn's dup2 passes it on
    try:
        os.write(write_end, data)  # far below the pipe's buffer: never blocks
    finally:
        os.close(write_end)
    if read_end == TOKEN_FD:
        # dup2 onto itself would leave close-on-exec set: the launcher would find no token.
        moved = os.dup(read_end)
        os.close(read_end)
        read_end = moved
    return read_end


def spawn(argv: list[str], env: Mapping[str, str], *, token: str, shell: str = "/bin/sh") -> int:
    """Start `shell launcher.sh ARGV...` in a new session; returns its pid (also its process group).

    stdin/stdout/stderr of the launcher are /dev/null: the job's output goes to its log through
    the launcher, and the launcher must not hold the runtime's own stdout (a service's pipe).
    Every argv item, env name and value is handed over as bytes (`os.fsencode`, the inverse of
    how qlactors holds them, see qlactors.domain.posix): the job gets exactly the bytes it was
    given, UTF-8 or not. The callback token is on descriptor TOKEN_FD, not in `env`.
    """
    shell_argv = shell.split()
    read_end = _token_pipe(token)
    try:
        return os.posix_spawn(
            os.fsencode(shell_argv[0]), [os.fsencode(a) for a in (*shell_argv, str(launcher_path()), *argv)],
            {os.fsencode(k): os.fsencode(v) for k, v in env.items()},
            setsid=True, setsigdef=DEFAULT_SIGNALS, setsigmask=(),
            # The token first: a runtime started with stdin, stdout or stderr closed gets its
            # pipe on descriptor 0, 1 or 2, which the /dev/null opens below then replace.
            file_actions=[
                (os.POSIX_SPAWN_DUP2, read_end, TOKEN_FD),
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
            ],
        )
    finally:
        os.close(read_end)


def signal_group(identity: ProcessIdentity, sig: int, *, current_boot_id: str) -> Liveness:
    """Re-check the exact identity, then signal the whole group; never a bare or recycled pid."""
    liveness = probe(identity, current_boot_id=current_boot_id)
    if liveness is Liveness.RUNNING:
        try:
            os.killpg(identity.pgid, sig)
        except ProcessLookupError:
            return Liveness.NOT_RUNNING
    return liveness


def signal_job(launcher: Any, marker: str | os.PathLike[str], sig: int, *,
               current_boot_id: str) -> Liveness:
    """Signal the job's process group (never the launcher's), each identity re-checked first.

    The launcher must still be the exact one we started; the job's group is named by the start
    marker the job's process wrote (its pid, which is its group once `setsid` ran, and its start
    ticks). Then:
    - the job's main process runs as its own group leader: signal that group;
    - it runs but has not left the launcher's group yet (between the marker and setsid), or no
      marker names it yet: signal the launcher's group, which the launcher itself survives
      (it traps TERM; only a KILL in that window, after a whole stop grace, would end it);
    - it has ended: nothing (the launcher is stopping what it left, then publishes the receipt).
    RUNNING means a group was signalled.
    """
    liveness = probe(launcher, current_boot_id=current_boot_id)
    if liveness is not Liveness.RUNNING:
        return liveness
    try:
        # A marker left by an earlier launch of the same attempt names another launcher.
        named, job = read_markers(marker)
        same = named is not None and (named.boot_id, named.pid, named.pgid, named.start_ticks) == (
            launcher.boot_id, launcher.pid, launcher.pgid, launcher.start_ticks)
        job = job if same else None
    except ValueError:
        job = None
    if job is None:
        return signal_group(launcher, sig, current_boot_id=current_boot_id)
    if job.boot_id != launcher.boot_id:
        return Liveness.NOT_RUNNING
    before_setsid = ProcessIdentity(job.boot_id, job.pid, launcher.pgid, job.start_ticks)
    # Twice: a job that ran setsid between the two probes matched neither; it does so only once.
    for _ in range(2):
        if probe(job, current_boot_id=current_boot_id) is Liveness.RUNNING:
            return signal_group(job, sig, current_boot_id=current_boot_id)
        if probe(before_setsid, current_boot_id=current_boot_id) is Liveness.RUNNING:
            return signal_group(launcher, sig, current_boot_id=current_boot_id)
    return Liveness.NOT_RUNNING
