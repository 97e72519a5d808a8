"""Web: what differs between the two profiles behind the API: where a database is, where an
attempt's log is read from, and whether a runtime is nudged after a change. Everything else
goes through the same Repository and views as the CLI."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from ..domain.retention import RetentionPolicy
from ..domain.states import AttemptStatus
from ..errors import NotFound
from ..store.repository import Repository
from ..store.views import AttemptView

# The most one read of a log returns (a page of the log; the client asks again from its end).
MAX_LOG_READ = 1024 * 1024


@dataclass(frozen=True, slots=True)
class LogWindow:
    """Bytes of an attempt's log from an offset, and where the log ends for good once known."""

    offset: int
    data: bytes
    final_offset: int | None  # None: the attempt may still write (or ship) more

    @property
    def end(self) -> int:
        return self.offset + len(self.data)

    @property
    def complete(self) -> bool:
        return self.final_offset is not None and self.end >= self.final_offset


class Backend(ABC):
    """The profile behind the API: `edge` (the home's SQLite file) or `cluster` (PostgreSQL)."""

    profile: str

    def __init__(self, repo: Repository) -> None:
        self.repo = repo

    def changed(self) -> None:
        """After a change of intent: let the runtime act at once (edge); replicas act on their tick."""

    @abstractmethod
    def retention_default(self) -> RetentionPolicy:
        """The global retention bounds in force (what `task show --json` reports a task falls back to)."""

    @abstractmethod
    def read_log(self, run_id: str, attempt: AttemptView, offset: int, limit: int) -> LogWindow:
        """Up to `limit` bytes of the attempt's log from `offset`, with its final offset once known."""

    def close(self) -> None:
        self.repo.close()


def _ended(repo: Repository, attempt_id: str) -> bool:
    """Whether the attempt has ended, as the database has it now (read before the bytes: an end
    seen first means every byte written before it is already there to read)."""
    status = repo.runs.attempt_status(attempt_id)
    if status is None:  # retention deleted its run meanwhile
        raise NotFound(f"attempt {attempt_id} is gone: its run was retired")
    return AttemptStatus(status).terminal


class EdgeBackend(Backend):
    """The edge home: the logs are files under `<home>/logs`, whole once the attempt has ended."""

    profile = "edge"

    def __init__(self, repo: Repository, cfg) -> None:
        super().__init__(repo)
        self.cfg = cfg

    def changed(self) -> None:
        from ..runtime.home import nudge

        nudge(self.cfg.home)

    def retention_default(self) -> RetentionPolicy:
        rt = self.cfg.runtime
        return RetentionPolicy(max_age_ms=rt.retention_max_age_ms, max_runs=rt.retention_max_runs)

    def read_log(self, run_id: str, attempt: AttemptView, offset: int, limit: int) -> LogWindow:
        from ..process.logs import LogStore, read

        ended = _ended(self.repo, attempt.id)
        path: Path = LogStore(self.cfg.logs_dir).path_for(run_id, attempt.id)
        if not path.exists():
            return LogWindow(offset, b"", 0 if ended else None)
        data = read(path, offset, min(limit, MAX_LOG_READ))
        final = path.stat().st_size if ended else None
        return LogWindow(offset, data, final)


class ClusterBackend(Backend):
    """A cluster database: logs are the chunks workers shipped; the final offset is what the
    worker's completion recorded (SEMANTICS.md §13), or, for an attempt that ended without one,
    the last acknowledged offset (the rest is unknown)."""

    profile = "cluster"

    def __init__(self, repo: Repository, target) -> None:
        super().__init__(repo)
        self.target = target

    def retention_default(self) -> RetentionPolicy:
        return self.target.retention

    def read_log(self, run_id: str, attempt: AttemptView, offset: int, limit: int) -> LogWindow:
        from ..store.dispatch.log_chunks import LogChunks

        chunks = LogChunks(self.repo.store)
        ended = _ended(self.repo, attempt.id)
        final = chunks.final_offset(attempt.id)
        data = chunks.read(attempt.id, offset, min(limit, MAX_LOG_READ))
        if final is None and ended:
            final = chunks.acked_offset(attempt.id)
        return LogWindow(offset, data, final)
