"""Executor side: a worker's state directory: its journal, logs and receipts, under an exclusive lock.

Two worker processes on one directory would each trust the same journal and launch the same
attempts: the first takes an exclusive non-blocking `flock` on `<state_dir>/runtime.lock` (the
same lock, and the same pid in it, as an edge home) and holds it for its whole life; the second
fails at once, naming the directory and the holder's pid. The kernel drops the lock when the
holder dies, even by `kill -9`.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import QlactorsError
from ..process.fsutil import ensure_private_root
from ..runtime.home import AlreadyRunning, RuntimeLock, holder_pid
from ..store.engine import Store
from .journal.file import JOURNAL_FILE, open_journal_file

LOGS_DIR = "logs"
RECEIPTS_DIR = "receipts"


class StateDirInUse(AlreadyRunning):
    """Another process holds the state directory's lock; nothing was opened or changed."""


class UnsafeStateDir(QlactorsError):
    """The state directory (or a directory in it) is not a directory we may use."""


class StateDir:
    """The open, locked state directory: `journal` (its Store), `logs` and `receipts` (0700)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise UnsafeStateDir(f"the parent of state directory {self.path} does not exist; create it first")
        ensure_private_root(self.path, "state directory", UnsafeStateDir)
        self._lock = RuntimeLock(self.path)
        try:
            self._lock.acquire()
        except AlreadyRunning:
            holder = holder_pid(self.path)
            raise StateDirInUse(
                f"state directory {self.path} is in use by another qlactors worker "
                f"(pid {holder if holder is not None else '?'}); stop it first, or give this worker "
                "another state_dir") from None
        try:
            self.logs = self.path / LOGS_DIR
            self.receipts = self.path / RECEIPTS_DIR
            ensure_private_root(self.logs, "logs directory", UnsafeStateDir)
            ensure_private_root(self.receipts, "receipts directory", UnsafeStateDir)
            self.journal: Store = open_journal_file(self.path)
        except BaseException:
            self._lock.release()
            raise

    @property
    def journal_path(self) -> Path:
        return self.path / JOURNAL_FILE

    def close(self) -> None:
        """Close the journal, then let the lock go (the process is leaving the directory)."""
        self.journal.close()
        self._lock.release()

    def __enter__(self) -> "StateDir":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
