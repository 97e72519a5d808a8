"""Store: executor reports applied together: one transaction for the reports that arrived together
(Activate, Started, start failure, decline, Completed, log chunks — of any workers).

Each `Report` names what it locks (`report_locks.LockRequest`) and how it applies inside the
batch's transaction (the store's `*_in` methods: the same code a single report runs). The batch
takes all the locks first, in the global order of SEMANTICS.md §9, with a fixed number of
statements (`report_locks.hold`), then applies the reports in their arrival order, writes their
events with one INSERT and commits once: a group commit, whose answers go out after it. Rows
are read once per transaction, so `groups` splits the arrivals so that no attempt or run has
two row-changing reports in one transaction, keeping each attempt's reports in their order.

With a ledger (a cluster replica, `request_answers.py`), a report that names its request
(`Report.answer`) is first looked up under those locks: a repeat gets its first answer and
applies nothing; every other answer is kept, in the same transaction, for its repeats. The
batch's look-up is one statement and so is its keeping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from sqlalchemy.engine import Connection

from ..engine import Store
from ..plans import events_together
from .report_locks import HeldRows, LockRequest, hold
from .request_answers import AnswerKey, first_answers, keep_answers

# Most reports of one transaction (a bound on its locks and on the answers it holds back).
MAX_BATCH = 64


@dataclass(frozen=True, slots=True)
class Report:
    """One report of a batch: what it locks and how it applies in the batch's transaction.

    `changes_rows` is False for a log chunk (it adds chunks and changes no run, attempt or lease
    row); `durable` is False for a report whose commit may skip the fsync on SQLite (a Started,
    docs/semantics.md "Durability of commits"); a batch is durable if any of its reports is.
    `answer` names the request, for the ledger: a repeat of it gets its first answer.
    """

    locks: LockRequest
    apply: Callable[[Connection, HeldRows], Any]
    changes_rows: bool = True
    durable: bool = True
    answer: AnswerKey | None = None


class ReportBatch:
    """Applies reports together, one transaction per group; `ledger` True keeps and replays the
    answers of reports that name their request (a cluster replica; edge has none)."""

    def __init__(self, store: Store, *, ledger: bool = False) -> None:
        self.store = store
        self.ledger = ledger

    def apply(self, reports: Sequence[Report]) -> list[Any]:
        """Every report of one group (see `groups`) in one transaction; their results in order.

        An exception from any of them rolls the whole group back (nothing of it committed).
        """
        with self.store.write(durable=any(r.durable for r in reports)) as conn, events_together(conn):
            rows = hold(self.store, conn, [r.locks for r in reports])
            keys = [r.answer for r in reports if r.answer is not None] if self.ledger else []
            if not keys:
                return [r.apply(conn, rows) for r in reports]
            first = first_answers(conn, keys)  # under the locks: a racing copy committed before us
            results, fresh = [], []
            for r in reports:
                if r.answer is not None and r.answer.id in first:
                    results.append(first[r.answer.id])
                    continue
                results.append(r.apply(conn, rows))
                if r.answer is not None:
                    fresh.append((r.answer, results[-1]))
            keep_answers(conn, fresh, rows.now)
            return results


def alone(store: Store, locks: LockRequest, apply: Callable[[Connection, HeldRows], Any], *,
          durable: bool = True) -> Any:
    """One report in a transaction of its own (the store's single-report methods)."""
    return ReportBatch(store).apply([Report(locks, apply, durable=durable)])[0]


def groups(reports: Sequence[Report], limit: int = MAX_BATCH) -> list[list[int]]:
    """Split reports (indexes, in arrival order) into transactions of at most `limit`.

    A report goes to the first group after the last one holding a row-changing report of its
    attempt or run, and never before a group holding any earlier report of its attempt: within a
    group reports apply in arrival order, so every attempt's reports keep theirs.
    """
    last_any: dict[tuple[str, str], int] = {}
    last_changing: dict[tuple[str, str], int] = {}
    out: list[list[int]] = []
    for index, report in enumerate(reports):
        keys = [("attempt", report.locks.attempt_id)]
        if report.locks.run_id is not None:
            keys.append(("run", report.locks.run_id))
        at = max([last_any.get(k, 0) for k in keys]
                 + [last_changing[k] + 1 for k in keys if report.changes_rows and k in last_changing])
        while at < len(out) and len(out[at]) >= limit:
            at += 1
        if at == len(out):
            out.append([])
        out[at].append(index)
        for k in keys:
            last_any[k] = at
            if report.changes_rows:
                last_changing[k] = at
    return out
