"""Executor side: this process's evidence as edge's Recovery reads it (the `LocalEvidence` port of
runtime/ports.py, which profiles/edge.py hands to the control side). Reads the journal, the
receipt files and start markers, and /proc; settles what Recovery decided, files first and the
journal row last, as LocalReceipts does."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..process.identity import read_marker
from ..process.receipts import ReceiptStore
from ..store.records import Session
from .evidence import Alive, liveness_of
from .journal.journal import Journal
from .journal.records import ACCEPTED, STARTED, JournalEntry
from .local_receipts import Found, LocalReceipts


class EdgeEvidence:
    """Edge's executor-side evidence for Recovery (runtime/ports.LocalEvidence)."""

    def __init__(self, journal: Journal, receipts: ReceiptStore, local_receipts: LocalReceipts,
                 boot_id: Callable[[], str], session: Session) -> None:
        self.journal, self.receipts, self.local_receipts = journal, receipts, local_receipts
        self.boot_id, self.session = boot_id, session

    def journal_entries(self, attempt_ids: Sequence[str]) -> dict[str, JournalEntry]:
        return self.journal.entries(attempt_ids)

    def liveness(self, identity: Any, current_boot_id: str) -> str:
        alive = liveness_of(identity, current_boot_id)
        return {Alive.RUNNING: "running", Alive.UNREADABLE: "unreadable"}.get(alive, "gone")

    def marker_identity(self, attempt_id: str) -> Any:
        return read_marker(self.receipts.marker_path(attempt_id))

    def receipt(self, attempt_id: str) -> Found:
        return self.local_receipts.look(attempt_id)

    def receipt_applied(self, attempt_id: str) -> None:
        self.local_receipts.finish(attempt_id)

    def quarantine(self, attempt_id: str) -> None:
        self.local_receipts.quarantine(attempt_id)

    def ended(self, attempt_id: str) -> None:
        self.receipts.delete(attempt_id)
        if self.journal.get(attempt_id) is not None:
            self.journal.clear(attempt_id)

    def released(self, attempt_id: str) -> None:
        entry = self.journal.get(attempt_id)
        if entry is not None and entry.state == ACCEPTED:  # the executor that took it is gone
            self.journal.clear(attempt_id)  # (an activated one keeps its row: it may launch)

    def record_started(self, attempt_id: str, identity: Any) -> None:
        self.journal.set_state(attempt_id, STARTED, identity=identity)
