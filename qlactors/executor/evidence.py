"""Executor side: the evidence probes: what a journal row, /proc, the start marker and the receipt say
about an attempt this worker journalled, as the fact an `Attest` reports (SEMANTICS.md §6,
§9 Re-attest).

`fact_of` is the decision alone (values in, a fact out); `probe_rows` does the reads: the
receipt, the identity (journal, else the launcher's start marker), its liveness from /proc and,
for a process found gone, one publish grace for the whole batch and the receipt read again. The
probes only read: quarantining a bad receipt, completing, stopping or attesting is the caller's.
A receipt that fails the codec counts as no receipt here (it is quarantined, never trusted).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from ..process.identity import Liveness, ProcessIdentity, probe
from .journal.journal import Journal
from .journal.records import ACCEPTED, IN_FLIGHT, JournalEntry

RUNNING = "running"
"""The launcher still runs (identity matches): re-bind its lease, keep it."""
ENDED_WITH_RECEIPT = "ended_with_receipt"
"""A valid receipt exists: send it as `Completed`."""
ENDED = "ended"
"""Same boot, the process is gone (no /proc entry, start ticks or group differ, a zombie) and no
receipt appeared within the publish grace: ended without receipt."""
NEVER_LAUNCHED = "never_launched"
"""The journal says `accepted`: the spawn is journalled `launching` first, so nothing ran."""
LAUNCH_UNKNOWN = "launch_unknown"
"""`launching` (or later) with no identity in the journal and no start marker: the spawn may or
may not have happened. Never relaunched."""
REBOOTED = "rebooted"
"""The identity's boot id is not this boot's: the process cannot be running."""
UNREADABLE = "unreadable"
"""/proc could not be read for the identity: no fact; leave it for a later probe (§6 step 5)."""
FACTS = (RUNNING, ENDED_WITH_RECEIPT, ENDED, NEVER_LAUNCHED, LAUNCH_UNKNOWN, REBOOTED, UNREADABLE)


class Alive(enum.Enum):
    """What /proc says about a known identity, with another boot told apart from a gone process."""

    RUNNING = "running"
    GONE = "gone"
    REBOOTED = "rebooted"
    UNREADABLE = "unreadable"


def fact_of(row_state: str, identity_known: bool, liveness: Alive | None, receipt_present: bool,
            marker_identity: bool) -> str:
    """The fact for one in-flight journal row (pure).

    `identity_known`: the journal holds the launcher's identity; `marker_identity`: its start
    marker does; `liveness`: the probe of that identity (None when there is none);
    `receipt_present`: a valid receipt, read after the publish grace for a process found gone.
    """
    if row_state not in IN_FLIGHT:
        raise ValueError(f"only in-flight journal rows are probed ({', '.join(IN_FLIGHT)}), not {row_state!r}")
    if receipt_present:
        return ENDED_WITH_RECEIPT
    if not (identity_known or marker_identity):
        if liveness is not None:
            raise ValueError("a liveness without an identity to probe")
        return NEVER_LAUNCHED if row_state == ACCEPTED else LAUNCH_UNKNOWN
    if liveness is None:
        raise ValueError("an identity was known but not probed")
    return {Alive.RUNNING: RUNNING, Alive.GONE: ENDED, Alive.REBOOTED: REBOOTED,
            Alive.UNREADABLE: UNREADABLE}[liveness]


def liveness_of(identity: ProcessIdentity | Any, current_boot_id: str, proc: str = "/proc") -> Alive:
    """The liveness of an identity: another boot, else what /proc says (process.identity.probe)."""
    if identity.boot_id != current_boot_id:
        return Alive.REBOOTED
    return {Liveness.RUNNING: Alive.RUNNING, Liveness.NOT_RUNNING: Alive.GONE,
            Liveness.UNKNOWN: Alive.UNREADABLE}[probe(identity, current_boot_id=current_boot_id, proc=proc)]


@dataclass(frozen=True, slots=True)
class Evidence:
    """A probed row: its fact, the identity it was judged by (None: none known), and the receipt
    (`receipts.Found`) read last."""

    entry: JournalEntry
    fact: str
    identity: Any
    found: Any


def probe_rows(rows: Iterable[JournalEntry], *, receipts: Any, current_boot_id: str, grace_s: float,
               proc: str = "/proc", sleep: Callable[[float], None] = time.sleep) -> list[Evidence]:
    """Probe `rows` (in-flight journal entries) with one publish grace for the whole batch.

    `receipts` is the worker's LocalReceipts (receipt reads and the start marker). A row whose
    process is gone, or that is `launching` with no identity yet, is read again after the grace:
    its receipt (or its start marker) may be being published right now.
    """
    entries = list(rows)
    reads = [_read(e, receipts, current_boot_id, proc) for e in entries]
    if any(r.needs_grace for r in reads):
        sleep(grace_s)
        reads = [_read(e, receipts, current_boot_id, proc) if r.needs_grace else r
                 for e, r in zip(entries, reads)]
    return [Evidence(e, fact_of(e.state, e.identity is not None, r.alive, r.found.kind == "valid",
                                e.identity is None and r.identity is not None), r.identity, r.found)
            for e, r in zip(entries, reads)]


@dataclass(frozen=True, slots=True)
class _Read:
    found: Any
    identity: Any
    alive: Alive | None
    needs_grace: bool


def _read(entry: JournalEntry, receipts: Any, current_boot_id: str, proc: str) -> _Read:
    found = receipts.look(entry.attempt_id)
    if found.kind == "valid" or entry.state == ACCEPTED:  # accepted: never spawned, nothing to probe
        return _Read(found, None, None, False)
    identity = receipts.launcher_identity(entry)
    alive = None if identity is None else liveness_of(identity, current_boot_id, proc)
    return _Read(found, identity, alive, alive in (Alive.GONE, None))


def probe_journal(journal: Journal, *, receipts: Any, current_boot_id: str, grace_s: float,
                  page: int = 64, proc: str = "/proc",
                  sleep: Callable[[float], None] = time.sleep) -> Iterator[Evidence]:
    """Every in-flight journal row, probed page by page: what a worker re-attests after a start."""
    batch: list[JournalEntry] = []
    for entry in journal.walk(IN_FLIGHT, page):
        batch.append(entry)
        if len(batch) == page:
            yield from probe_rows(batch, receipts=receipts, current_boot_id=current_boot_id,
                                  grace_s=grace_s, proc=proc, sleep=sleep)
            batch = []
    if batch:
        yield from probe_rows(batch, receipts=receipts, current_boot_id=current_boot_id, grace_s=grace_s,
                              proc=proc, sleep=sleep)
