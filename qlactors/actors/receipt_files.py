"""Local receipt handling shared by the ReceiptConsumer (fast path) and edge Recovery (slow path).

The order is the contract's (SEMANTICS.md §5): delete a receipt only after its completion is
committed, then clear the journal row; commit the quarantine state before the file moves.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..process.receipts import Invalid, Missing, ReceiptStore, Unsafe, Valid

log = logging.getLogger("qlactors.receipts")


@dataclass(frozen=True, slots=True)
class Found:
    """What is on disk for an attempt: a valid receipt (with the dropped-byte count), nothing, or junk."""

    kind: str  # "valid" | "missing" | "bad"
    receipt: Any = None
    dropped: int | None = None
    reason: str = ""


def now_ms() -> int:
    """Wall-clock milliseconds (edge: the same clock the store uses)."""
    return time.time_ns() // 1_000_000


class LocalReceipts:
    def __init__(self, receipts: ReceiptStore, journal: Any, retention_ms: int) -> None:
        self.receipts = receipts
        self.journal = journal
        self.retention_ms = retention_ms

    def dropped_path(self, attempt_id: str) -> Path:
        return self.receipts.shard_dir(attempt_id) / f"{attempt_id}.dropped"

    def look(self, attempt_id: str) -> Found:
        result = self.receipts.read(attempt_id)
        if isinstance(result, Missing):
            return Found("missing")
        if isinstance(result, Valid):
            return Found("valid", result.receipt, self._dropped(attempt_id))
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

    def finish(self, attempt_id: str) -> None:
        """After a committed completion (or already_terminal): files first, the journal row last."""
        self.receipts.delete(attempt_id)
        self.receipts.remove_temps(attempt_id)
        try:
            os.unlink(self.dropped_path(attempt_id))
        except FileNotFoundError:
            pass
        self.journal.clear(attempt_id)

    def quarantine(self, attempt_id: str) -> None:
        """Commit the quarantine state, then move the file (never the other way round)."""
        if self.journal.get(attempt_id) is not None:
            self.journal.quarantine(attempt_id, now_ms() + self.retention_ms)
        try:
            where = self.receipts.quarantine(attempt_id)
            log.warning("event=receipt_quarantined attempt=%s to=%s", attempt_id, where)
        except FileNotFoundError:
            pass
