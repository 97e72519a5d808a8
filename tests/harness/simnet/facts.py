"""What the rig records while a seed runs, beside the store's rows: every launcher the Executor
spawned (through a wrapper around `spawn`), how many launchers of its worker were alive at each
spawn, and the
jobs' own ledger (a job appends `start ATTEMPT` first and `end ATTEMPT` as its last act)."""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# The job: its attempt id comes from the wrapper (the launcher strips every QLACTORS_* variable).
JOB = 'echo "start $SIMNET_ATTEMPT" >> {ledger}; sleep {sleep}; echo "end $SIMNET_ATTEMPT" >> {ledger}; exit {code}'


def start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), or None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


@dataclass
class Spawned:
    attempt_id: str
    pid: int
    ticks: int | None
    worker: str = ""

    def alive(self) -> bool:
        return self.ticks is not None and start_ticks(self.pid) == self.ticks


@dataclass
class SpawnRecorder:
    """Wraps the Executor's `spawn`: counts launches per attempt and the most launchers of one
    worker alive at once (`worker_of` names the worker spawning: the calling thread's)."""

    real: Callable[..., int]
    spawned: list[Spawned] = field(default_factory=list)
    most_alive: int = 0
    worker_of: Callable[[], str] = lambda: ""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, argv, env, *, token: str, shell: str = "/bin/sh") -> int:
        attempt_id = env.get("QLACTORS_ATTEMPT_ID", "")
        env = {**env, "SIMNET_ATTEMPT": attempt_id}
        worker = self.worker_of()
        with self._lock:
            alive = sum(1 for s in self.spawned if s.worker == worker and s.alive())
            pid = self.real(argv, env, token=token, shell=shell)
            self.spawned.append(Spawned(attempt_id, pid, start_ticks(pid), worker))
            self.most_alive = max(self.most_alive, alive + 1)
        return pid

    def alive(self, attempt_id: str) -> bool:
        """Whether a launcher of this attempt is alive now."""
        with self._lock:
            return any(s.alive() for s in self.spawned if s.attempt_id == attempt_id)

    def launches(self) -> Counter:
        return Counter(s.attempt_id for s in self.spawned)

    def kill_leftovers(self) -> int:
        """SIGKILL every launcher's group still alive (by its pid and start time), then reap it."""
        killed = 0
        for s in self.spawned:
            was_alive = s.alive()
            if was_alive:
                try:
                    os.killpg(s.pid, signal.SIGKILL)
                    killed += 1
                except (ProcessLookupError, PermissionError):
                    was_alive = False
            try:
                os.waitpid(s.pid, 0 if was_alive else os.WNOHANG)
            except ChildProcessError:
                pass  # the Executor reaped it
        return killed


def read_ledger(path: Path) -> tuple[Counter, Counter]:
    """(starts, ends) per attempt id from the jobs' ledger."""
    starts: Counter = Counter()
    ends: Counter = Counter()
    if not path.exists():
        return starts, ends
    for line in path.read_text().splitlines():
        what, _, attempt = line.partition(" ")
        (starts if what == "start" else ends)[attempt] += 1
    return starts, ends
