"""Shared: the ports (Protocols) through which one side reads the other in one process, filled by
the profile that holds both (edge), so that neither side imports the other.

`LocalEvidence` is what edge's Recovery (control side) learns from the executor side in the same
process: its journal, its receipt files and start markers, and /proc. A control replica has none:
it decides from the database and from what workers attest (SEMANTICS.md §10).
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence

from ..store.records import Identity, Session


class JournalFacts(Protocol):
    """What the executor's journal row says of an attempt (executor/journal/records.JournalEntry)."""

    state: str
    identity: Identity | None


class ReceiptFinding(Protocol):
    """A look at an attempt's receipt file (executor/local_receipts.Found)."""

    kind: str  # "valid" | "missing" | "bad"
    receipt: Any
    dropped: int


class LocalEvidence(Protocol):
    """The executor side's evidence, as edge's Recovery reads and settles it."""

    session: Session
    """The built-in local session: what a re-bound survivor names."""

    def journal_entries(self, attempt_ids: Sequence[str]) -> Mapping[str, JournalFacts]:
        """The journal's rows of those attempts that have one, by attempt id (one read a page)."""

    def boot_id(self) -> str:
        """The current boot id (read from /proc, or the test override)."""

    def liveness(self, identity: Any, current_boot_id: str) -> str:
        """"running", "gone" (on this boot, or another boot) or "unreadable", from /proc."""

    def marker_identity(self, attempt_id: str) -> Any:
        """The launcher's start marker's identity, None without one; ValueError when unreadable."""

    def receipt(self, attempt_id: str) -> ReceiptFinding:
        """The attempt's receipt file, read strictly."""

    def receipt_applied(self, attempt_id: str) -> None:
        """The receipt's completion was applied: its file is finished with."""

    def quarantine(self, attempt_id: str) -> None:
        """The receipt is bad or was refused: keep it aside, never trusted."""

    def ended(self, attempt_id: str) -> None:
        """Recovery ended the attempt: delete its receipt and clear its journal row."""

    def released(self, attempt_id: str) -> None:
        """Its lease was released unactivated: an `accepted` journal row (its executor is gone) is cleared."""

    def record_started(self, attempt_id: str, identity: Any) -> None:
        """A re-bound survivor: its journal row gets the identity, so the Executor re-adopts it."""
