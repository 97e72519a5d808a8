"""Executor side: local receipt handling shared by the ReceiptConsumer (fast path) and edge Recovery
(slow path).

The order is the contract's (SEMANTICS.md §5): delete a receipt only after its completion is
committed, then clear the journal row; commit the quarantine state before the file moves.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..clock import wall_ms
from ..process.identity import read_marker
from ..process.receipts import Invalid, Missing, ReceiptStore, Unsafe, Valid

log = logging.getLogger("qlactors.receipts")


@dataclass(frozen=True, slots=True)
class Found:
    """What is on disk for an attempt: a valid receipt (with the dropped-byte count), nothing, or junk."""

    kind: str  # "valid" | "missing" | "bad"
    receipt: Any = None
    dropped: int | None = None
    reason: str = ""


class LocalReceipts:
    def __init__(self, receipts: ReceiptStore, journal: Any, retention_ms: int) -> None:
        self.receipts = receipts
        self.journal = journal
        self.retention_ms = retention_ms

    def dropped_path(self, attempt_id: str) -> Path:
        return self.receipts.shard_dir(attempt_id) / f"{attempt_id}.dropped"

    def fifo_path(self, attempt_id: str) -> Path:
        """The log-cap FIFO the executor makes for the launcher (it would cost the launcher execs)."""
        return self.receipts.shard_dir(attempt_id) / f"{attempt_id}.fifo"

    def make_fifo(self, attempt_id: str) -> Path | None:
        """A fresh log-cap FIFO (0600) for a launch, or None when it cannot be made (logged)."""
        path = self.fifo_path(attempt_id)
        try:
            path.unlink(missing_ok=True)  # a stale one from an earlier launch of this attempt
            os.mkfifo(path, 0o600)
        except OSError as err:
            log.warning("event=fifo_failed attempt=%s error=%s", attempt_id, err)
            return None
        return path

    def remove_fifo(self, attempt_id: str) -> None:
        """After the launcher ended (it never removes the FIFO itself)."""
        self.fifo_path(attempt_id).unlink(missing_ok=True)

    def launcher_identity(self, entry: Any) -> Any:
        """A journaled launcher's identity: the journal's, else its start marker's (a crash
        between spawn and the journal write); None when neither is known or the marker is bad."""
        if entry.identity is not None:
            return entry.identity
        try:
            return read_marker(self.receipts.marker_path(entry.attempt_id))
        except ValueError:
            return None

    def look(self, attempt_id: str) -> Found:
        result = self.receipts.read(attempt_id)
        if isinstance(result, Missing):
            return Found("missing")
        if isinstance(result, Valid):
            # With its output left open the reader could not count before the receipt: unknown.
            dropped = None if result.receipt.output_open else self._dropped(attempt_id)
            return Found("valid", result.receipt, dropped)
        if isinstance(result, (Invalid, Unsafe)):
            return Found("bad", reason=result.reason)
        raise TypeError(f"unexpected read result {result!r}")

    def _dropped(self, attempt_id: str) -> int | None:
        """The log-cap reader's count; None when no cap applied (or it could not be read)."""
        try:
            text = self.dropped_path(attempt_id).read_text().strip()
        except FileNotFoundError:
            return None
        except OSError as err:
            log.warning("event=dropped_unreadable attempt=%s error=%s", attempt_id, err)
            return None
        return int(text) if text.isdigit() else None

    def finish(self, attempt_id: str, *, keep_log_until_ms: int | None = None) -> None:
        """After a committed completion (or already_terminal): files first, the journal row last.

        `keep_log_until_ms` (a cluster worker): the log and its dropped-byte count stay, and the
        row is kept `completed` for local retention (executor/log_retention.py), which deletes them once
        the control side has acknowledged the log to its final offset and this time has passed.
        """
        self.receipts.delete(attempt_id)
        self.receipts.remove_temps(attempt_id)
        self.remove_fifo(attempt_id)
        if keep_log_until_ms is not None:
            self.journal.complete(attempt_id, keep_log_until_ms)
            return
        self.dropped_path(attempt_id).unlink(missing_ok=True)
        self.journal.clear(attempt_id)

    def quarantine(self, attempt_id: str) -> None:
        """Commit the quarantine state, then move the file (never the other way round)."""
        if self.journal.get(attempt_id) is not None:
            self.journal.quarantine(attempt_id, wall_ms() + self.retention_ms)
        try:
            where = self.receipts.quarantine(attempt_id)
            log.warning("event=receipt_quarantined attempt=%s to=%s", attempt_id, where)
        except FileNotFoundError:
            pass
