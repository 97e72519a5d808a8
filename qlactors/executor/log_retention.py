"""Executor side: the file half of retention on a worker: its local logs, once the control side holds
them.

A worker keeps an attempt's journal row `completed` after the completion was answered, while the
log's tail is shipped (SEMANTICS.md §13). Its local log, and the log-cap reader's dropped-byte
sidecar, are deleted only when the control side acknowledged the log up to its final offset and
the row's `purge_after_ms` (the worker's log retention, on its own clock) has passed; the row is
cleared last, so a crash in between deletes the files again on the next step. Bounded per call.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..process.logs import LogStore
from .journal.journal import Journal

log = logging.getLogger("qlactors.executor.log_retention")

DEFAULT_LIMIT = 32


@dataclass(frozen=True, slots=True)
class Purged:
    """What one step deleted: journal rows cleared, log files removed (some may be gone already)."""

    rows: int
    logs: int


class LocalLogRetention:
    """Deletes the local logs of completed attempts whose final offset was acknowledged."""

    def __init__(self, journal: Journal, logs: LogStore, local_receipts: Any) -> None:
        self.journal = journal
        self.logs = logs
        self.local_receipts = local_receipts  # worker/receipts.LocalReceipts: the sidecar's path

    def step(self, limit: int = DEFAULT_LIMIT) -> Purged:
        """Purge at most `limit` due attempts, oldest retention first; the time is the journal
        store's (`Store.now_ms`)."""
        store = self.journal.store
        with store.read() as conn:
            now = store.now_ms(conn)
        rows = logs = 0
        for entry in self.journal.due_logs(now, limit):
            if self.logs.remove(entry.run_id, entry.attempt_id):
                logs += 1
            self.local_receipts.dropped_path(entry.attempt_id).unlink(missing_ok=True)
            if self.journal.clear(entry.attempt_id):  # last: a crash before it repeats the deletes
                rows += 1
        if rows:
            log.info("event=local_logs_purged rows=%d logs=%d", rows, logs)
        return Purged(rows, logs)
