"""Control side: whether the cadence gets through: the step that failed or stayed silent in the last
cycle, its error, and since when, for `status` (SEMANTICS.md §10: while a cycle fails nothing is
offered).

The Scheduler writes it after every cycle; a replica's heartbeat copies it into its
`control_replicas` row, edge publishes it in its home (`home.write_cycle_failure`) through
`on_change`. The first cycle that gets through clears it."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

MAX_ERROR_CHARS = 500


@dataclass(frozen=True, slots=True)
class CycleFailure:
    step: str  # recovery, retry, cron, stops/admission
    error: str
    since_ms: int  # wall clock of the first failed cycle of this run of failures

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "error": self.error, "since_ms": self.since_ms}


class CycleHealth:
    """The current CycleFailure (None while cycles get through); safe to read from any thread."""

    def __init__(self, on_change: Callable[[CycleFailure | None], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._failure: CycleFailure | None = None
        self._on_change = on_change

    @property
    def current(self) -> CycleFailure | None:
        with self._lock:
            return self._failure

    def failed(self, step: str, error: str, at_ms: int) -> CycleFailure:
        with self._lock:
            before = self._failure
            since = before.since_ms if before is not None else at_ms
            self._failure = CycleFailure(step, error[:MAX_ERROR_CHARS], since)
            failure, changed = self._failure, self._failure != before
        if changed and self._on_change is not None:
            self._on_change(failure)
        return failure

    def passed(self) -> None:
        with self._lock:
            changed, self._failure = self._failure is not None, None
        if changed and self._on_change is not None:
            self._on_change(None)


def published_in(home: Any) -> Callable[[CycleFailure | None], None]:
    """Edge's `on_change`: the failure as a status file of the home (`home.CYCLE_FAILURE_FILE`),
    removed once a cycle gets through; a file left by a runtime that died is removed now."""
    import logging

    from ..runtime.home import clear_cycle_failure, write_cycle_failure

    log = logging.getLogger("qlactors.scheduler")
    clear_cycle_failure(home)

    def publish(failure: CycleFailure | None) -> None:
        try:
            if failure is None:
                clear_cycle_failure(home)
            else:
                write_cycle_failure(home, step=failure.step, error=failure.error, since_ms=failure.since_ms)
        except OSError as err:  # `status` then misses it; the cadence goes on
            log.warning("event=cycle_failure_status_unwritten error=%s", err)

    return publish
