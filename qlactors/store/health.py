"""Store: whether the database is answering: one outage at a time, from its first failed transaction to
the next one that succeeds, and a limit after which an outage counts as persistent.

The store records every `StoreUnavailable` here and every transaction that got through (a read
ends an outage only if no write failed in it: SQLite readers go on while a writer holds the
lock, and a busy database must not look healthy between two failed writes); the
runtime watches the changes (`status` shows an outage) and stops when one outlasts the limit.
Transient failures (SQLite busy beyond its timeout, a transient I/O error, a PostgreSQL
connection reset) are retried by whoever met them; only a persistent one is fatal.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from ..clock import monotonic, wall_ms


@dataclass(frozen=True, slots=True)
class Outage:
    """The database has failed every transaction since `since_ms` (wall clock, for people)."""

    since_ms: int
    seconds: float
    """How long it has lasted so far (monotonic)."""
    failures: int
    error: str
    """The last failure, one line."""


@dataclass(frozen=True, slots=True)
class ErrorTally:
    """Every transient failure since the process started (outages that ended included): what a
    control replica writes into its `control_replicas` row for a cluster `status`."""

    failures: int
    last_error: str | None
    last_error_at_ms: int | None


class StoreHealth:
    """Thread-safe; `failed`/`succeeded` are called by the store, `watch` by the runtime."""

    def __init__(self, clock: Callable[[], float] = monotonic, wall_ms: Callable[[], int] = wall_ms) -> None:
        self._clock, self._wall_ms = clock, wall_ms
        self._lock = threading.Lock()
        self._since: float | None = None
        self._since_ms = 0
        self._failures = 0
        self._error = ""
        self._tally = ErrorTally(0, None, None)
        self._write_failed = False
        self._tripped = False
        self._limit_s: float | None = None
        self._on_change: Callable[[Outage | None], None] | None = None
        self._on_persistent: Callable[[Outage], None] | None = None

    def watch(self, *, limit_s: float, on_change: Callable[[Outage | None], None],
              on_persistent: Callable[[Outage], None]) -> None:
        """Call `on_change` when an outage begins (and on each failure) or ends, and
        `on_persistent` once when one has lasted `limit_s`."""
        with self._lock:
            self._limit_s, self._on_change, self._on_persistent = limit_s, on_change, on_persistent

    def failed(self, error: str, *, write: bool = True) -> None:
        with self._lock:
            now = self._clock()
            if self._since is None:
                self._since, self._since_ms, self._failures, self._tripped = now, self._wall_ms(), 0, False
                self._write_failed = False
            self._failures += 1
            self._write_failed = self._write_failed or write
            self._error = " ".join(error.split())[:500]
            self._tally = ErrorTally(self._tally.failures + 1, self._error, self._wall_ms())
            outage = self._outage(now)
            persistent = (self._limit_s is not None and not self._tripped and outage.seconds >= self._limit_s)
            self._tripped = self._tripped or persistent
            on_change, on_persistent = self._on_change, self._on_persistent
        if on_change is not None:
            on_change(outage)
        if persistent and on_persistent is not None:
            on_persistent(outage)

    def succeeded(self, *, write: bool = True) -> None:
        if self._since is None:  # the common case: no lock, one attribute read
            return
        with self._lock:
            if self._since is None or (self._write_failed and not write):
                return
            self._since = None
            on_change = self._on_change
        if on_change is not None:
            on_change(None)

    def tally(self) -> ErrorTally:
        return self._tally  # replaced whole under the lock: one read sees one consistent tally

    def outage(self) -> Outage | None:
        with self._lock:
            return None if self._since is None else self._outage(self._clock())

    def _outage(self, now: float) -> Outage:
        return Outage(since_ms=self._since_ms, seconds=now - self._since, failures=self._failures,
                      error=self._error)
