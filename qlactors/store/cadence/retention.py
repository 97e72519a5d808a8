"""Store: retiring finished runs past the maximum age or count, one bounded page per call.

For each run retired, its log files go first (a run whose rows outlive its log is only a
`logs` that says the file is missing; a log that outlives its rows is litter nobody can find),
then one transaction deletes its rows — events, leases, log chunks (a cluster run's log,
SEMANTICS.md §13), attempts, retry policy, the references
trigger events and other runs hold to it — and writes its tombstone. The rules of what is due
and what holds a run back are pure (`qlactors.domain.retention`); this module reads the facts
and does the I/O. Tombstones are pruned by the same two bounds, so nothing here grows for ever.
Each task is held to its own bounds where it has them (`tasks.retention_max_*`), to the global
ones (the caller's, from the config) otherwise.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

from sqlalchemy import and_, func, or_, select
from sqlalchemy.engine import Connection

from ...domain.retention import (
    KEEP_AGE_MS_RANGE,
    KEEP_RUNS_RANGE,
    MAX_PAGE,
    REVOKED_TOKENS_MS,
    SWEEP_EVERY_MS,
    TASK_EVENTS_KEPT,
    Candidate,
    RetentionPolicies,
    RetentionPolicy,
    TaskRetention,
    hold_reason,
    plan_page,
    retire_reason,
)
from ...domain.states import RunStatus
from ...errors import BadInput, Conflict, QlactorsError
from ..engine import Store
from ..plans import load_run
from .retention_sweep import SweepReport, sweep
from ..schema import (
    log_chunks,
    notification_deliveries,
    notification_outbox,
    run_attempts,
    run_dispatch_leases,
    run_events,
    run_retry_policies,
    run_tombstones,
    runs,
    tasks,
    trigger_events,
)

log = logging.getLogger("qlactors.retention")

# One call examines at most this many pages of due runs: runs held back (a journal row, a
# receipt file) are skipped without stalling the ones behind them, within a bound.
SCAN_PAGES = 4


class LocalFiles(Protocol):
    """Edge: this process's executor side, which retention must respect and whose files go first
    (filled by executor/edge_files.py; the store never reads the journal or the files itself)."""

    def journalled(self, attempt_ids: Sequence[str]) -> set[str]:
        """Those of the attempts the executor's journal still holds a row for."""

    def receipt_present(self, attempt_id: str) -> bool:
        """Whether a receipt file (or anything) lies at the attempt's receipt path."""

    def remove_log(self, run_id: str, attempt_id: str) -> bool:
        """Delete the attempt's log file; True when there was one. Raises OSError or QlactorsError."""


@dataclass(frozen=True, slots=True)
class RetireReport:
    """What one `retire_page` call did."""

    retired: int = 0
    reasons: Mapping[str, int] = field(default_factory=dict)
    """Retired runs by reason: `max_age`, `max_runs`."""
    skipped: Mapping[str, int] = field(default_factory=dict)
    """Due runs kept for now, by reason: `journal`, `receipt`, `active` (changed meanwhile),
    `log_error` (a log could not be deleted), `conflict` (changed meanwhile)."""
    logs_deleted: int = 0
    tombstones_purged: int = 0
    swept: SweepReport = SweepReport()
    """The other rows deleted: settled notifications whose run is gone, revoked tokens, old task
    history (retention_sweep.py; at most once a minute, sooner while a batch was full)."""
    more: bool = False
    """True when the page budget ran out with due work left: call again soon, not at leisure."""


class Retention:
    """Retire finished runs (log files first, then rows and a tombstone) and prune tombstones."""

    def __init__(self, store: Store, local: LocalFiles | None) -> None:
        """`local` None: a control replica, which holds no files and no journal (a worker's own
        retention deletes its local copies once their final offset was acknowledged)."""
        self.store = store
        self.local = local
        self.swept_at_ms: int | None = None  # the last sweep of the other rows
        self.sweep_more = False  # it filled a batch: the next call sweeps again

    def retire_page(self, now_ms: int, *, max_age_ms: int, max_runs: int, page: int,
                    revoked_tokens_ms: int = REVOKED_TOKENS_MS, task_events: int = TASK_EVENTS_KEPT) -> RetireReport:
        """Retire at most `page` due runs, oldest finished first, then prune at most `page` tombstones,
        and (at most once a minute) at most `page` of each of the other rows retention bounds.

        `max_age_ms` and `max_runs` are the global bounds; a task's own bounds replace them for it.
        A revoked token's row goes `revoked_tokens_ms` after its revocation; each task keeps its
        newest `task_events` history entries.
        """
        if type(now_ms) is not int or now_ms < 0:
            raise BadInput("now_ms must be a non-negative integer")
        if type(page) is not int or not 1 <= page <= MAX_PAGE:
            raise BadInput(f"a retention page holds 1 to {MAX_PAGE} runs")
        for name, value, (lo, hi) in (("revoked_tokens_ms", revoked_tokens_ms, KEEP_AGE_MS_RANGE),
                                      ("task_events", task_events, KEEP_RUNS_RANGE)):
            if type(value) is not int or not lo <= value <= hi:
                raise BadInput(f"{name} must be a whole number in {lo}..{hi}, got {value!r}")
        try:
            default = RetentionPolicy(max_age_ms=max_age_ms, max_runs=max_runs)
        except ValueError as err:
            raise BadInput(str(err)) from None
        policy = self._policies(default)
        candidates, attempts, scanned_all = self._candidates(policy, now_ms, page)
        verdicts = plan_page(policy, now_ms, candidates, page)
        reasons: Counter[str] = Counter()
        skipped: Counter[str] = Counter()
        logs_deleted = 0
        for verdict in verdicts:
            if verdict.retire is None:
                continue
            if verdict.hold is not None:
                skipped[verdict.hold.value] += 1
                continue
            outcome, deleted = self._retire(verdict.run_id, attempts.get(verdict.run_id, ()),
                                            verdict.retire.value, now_ms)
            logs_deleted += deleted
            if outcome == "retired":
                reasons[verdict.retire.value] += 1
            else:
                skipped[outcome] += 1
        retired = sum(reasons.values())
        # More is due when the page filled up, or when the scan was cut short and this call made
        # room (the next scan reaches further). Held runs alone filling the scan are no reason to
        # hurry: they wait for their journal row or receipt to clear.
        more = len(verdicts) < len(candidates) or (not scanned_all and retired > 0)
        purged, more_stones = self._purge_tombstones(policy, now_ms, page)
        swept = self._sweep(now_ms, revoked_tokens_ms, task_events, page)
        return RetireReport(retired=retired, reasons=dict(reasons), skipped=dict(skipped),
                            logs_deleted=logs_deleted, tombstones_purged=purged, swept=swept,
                            more=more or more_stones or swept.more)

    def _sweep(self, now_ms: int, revoked_tokens_ms: int, task_events: int, page: int) -> SweepReport:
        """The other rows, once SWEEP_EVERY_MS (a clock set back counts as due), again at once
        while a batch was full."""
        last = self.swept_at_ms
        if last is not None and not self.sweep_more and last <= now_ms < last + SWEEP_EVERY_MS:
            return SweepReport()
        swept = sweep(self.store, now_ms, revoked_tokens_ms=revoked_tokens_ms, task_events_kept=task_events,
                      page=page)
        self.swept_at_ms, self.sweep_more = now_ms, swept.more
        if swept.notifications or swept.tokens or swept.task_events:
            log.info("event=retention_swept notifications=%d tokens=%d task_events=%d", swept.notifications,
                     swept.tokens, swept.task_events)
        return swept

    # -- choosing -----------------------------------------------------------------------------

    def _policies(self, default: RetentionPolicy) -> RetentionPolicies:
        """The global bounds and every task's own (removed tasks too: their runs are still kept)."""
        with self.store.read() as conn:
            rows = conn.execute(select(tasks.c.id, tasks.c.retention_max_age_ms, tasks.c.retention_max_runs).where(
                or_(tasks.c.retention_max_age_ms.is_not(None), tasks.c.retention_max_runs.is_not(None)))).all()
        return RetentionPolicies(default, {r.id: TaskRetention(max_age_ms=r.retention_max_age_ms,
                                                               max_runs=r.retention_max_runs) for r in rows})

    def _candidates(self, policy: RetentionPolicies, now_ms: int,
                    page: int) -> tuple[list[Candidate], dict[str, tuple[str, ...]], bool]:
        """Due runs oldest first (at most SCAN_PAGES pages), their attempts, and whether that was all."""
        limit = page * SCAN_PAGES
        with self.store.read() as conn:
            rows = _due(conn, runs, runs.c.finished_at_ms, runs.c.id, policy, now_ms, page, limit + 1,
                        runs.c.status)
            ids = [r.key for r in rows[:limit]]
            attempts: dict[str, list[str]] = {}
            if ids:
                for a in conn.execute(select(run_attempts.c.run_id, run_attempts.c.id)
                                      .where(run_attempts.c.run_id.in_(ids)).order_by(run_attempts.c.number)):
                    attempts.setdefault(a.run_id, []).append(a.id)
        journalled = self._journalled([a for v in attempts.values() for a in v])
        candidates = [Candidate(
            run_id=r.key, terminal=RunStatus(r.row.status).terminal, finished_at_ms=r.at,
            newer_in_task=r.newer, journal_row=any(a in journalled for a in attempts.get(r.key, ())),
            receipt_file=any(self._receipt_exists(a) for a in attempts.get(r.key, ())), task_id=r.task)
            for r in rows[:limit]]
        return candidates, {k: tuple(v) for k, v in attempts.items()}, len(rows) <= limit

    def _receipt_exists(self, attempt_id: str) -> bool:
        return self.local is not None and self.local.receipt_present(attempt_id)

    def _journalled(self, attempt_ids: list[str]) -> set[str]:
        return self.local.journalled(attempt_ids) if self.local is not None and attempt_ids else set()

    # -- retiring one run ---------------------------------------------------------------------

    def _retire(self, run_id: str, attempt_ids: tuple[str, ...], reason: str, now_ms: int) -> tuple[str, int]:
        """Log files first, then one transaction for the rows and the tombstone; (outcome, logs deleted)."""
        if any(self._receipt_exists(a) for a in attempt_ids):  # re-checked right before anything goes
            return "receipt", 0
        if self._journalled(list(attempt_ids)):  # so is the journal (a terminal run gains no rows)
            return "journal", 0
        deleted = 0
        for attempt_id in attempt_ids if self.local is not None else ():
            try:
                if self.local.remove_log(run_id, attempt_id):
                    deleted += 1
            except (OSError, QlactorsError) as err:  # QlactorsError: UnsafeLogPath, a symlinked shard
                # The rows stay (and the run with them) until its log can go: next page tries again.
                log.warning("event=retention_log_error run=%s attempt=%s error=%s", run_id, attempt_id, err)
                return "log_error", deleted
        with self.store.write() as conn:
            outcome = self._delete_rows(conn, run_id, reason, now_ms)
        if outcome == "retired":
            log.info("event=run_retired run=%s reason=%s logs_deleted=%d", run_id, reason, deleted)
        return outcome, deleted

    def _delete_rows(self, conn: Connection, run_id: str, reason: str, now_ms: int) -> str:
        row = load_run(conn, run_id)
        if row is None:
            return "conflict"  # retired (or never there) meanwhile
        hold = hold_reason(terminal=RunStatus(row.status).terminal, journal_row=False,
                           receipt_file=False)  # the journal and the receipt files were checked just before
        if hold is not None:
            return hold.value
        conn.execute(run_events.delete().where(run_events.c.run_id == run_id))
        conn.execute(run_dispatch_leases.delete().where(run_dispatch_leases.c.run_id == run_id))
        conn.execute(log_chunks.delete().where(log_chunks.c.run_id == run_id))  # a cluster run's log
        conn.execute(run_retry_policies.delete().where(run_retry_policies.c.run_id == run_id))
        _delete_settled_notifications(conn, run_id)
        conn.execute(trigger_events.update().where(trigger_events.c.run_id == run_id).values(run_id=None))
        conn.execute(runs.update().where(runs.c.retry_of_run_id == run_id).values(retry_of_run_id=None))
        conn.execute(run_attempts.delete().where(run_attempts.c.run_id == run_id))
        gone = conn.execute(runs.delete().where(and_(runs.c.id == run_id, runs.c.version == row.version)))
        if gone.rowcount != 1:
            raise Conflict(f"run {run_id} changed under its lock; nothing was retired")  # rolls back
        conn.execute(run_tombstones.insert().values(
            run_id=run_id, task_id=row.task_id, finished_at_ms=row.finished_at_ms,
            retired_at_ms=now_ms, reason=reason))
        return "retired"

    # -- tombstones ---------------------------------------------------------------------------

    def _purge_tombstones(self, policy: RetentionPolicies, now_ms: int, page: int) -> tuple[int, bool]:
        """Delete at most `page` tombstones past the same bounds (age since retirement, count per task)."""
        t = run_tombstones
        with self.store.read() as conn:
            rows = _due(conn, t, t.c.retired_at_ms, t.c.run_id, policy, now_ms, page, page + 1)
        due = [r.key for r in rows[:page]
               if retire_reason(policy.for_task(r.task), now_ms, r.at, r.newer) is not None]
        if not due:
            return 0, False
        with self.store.write() as conn:
            purged = conn.execute(t.delete().where(t.c.run_id.in_(due))).rowcount
        return purged, len(rows) > page


@dataclass(frozen=True, slots=True)
class _Due:
    key: str
    task: str
    at: int
    newer: int
    row: Any  # the selected row, with any extra columns asked for


def _due(conn: Connection, table, at, key, policy: RetentionPolicies, now_ms: int, task_budget: int,
         limit: int, *extra) -> list[_Due]:
    """Rows of `table` past their task's age bound or beyond its newest `max_runs`, oldest first.

    `newer` is how many rows of the same task are newer. The rows of one task returned here are
    always its oldest ones (age and count bounds each select a prefix in time order), so the
    i-th returned row of a task with n rows has n - 1 - i newer ones. The global age bound is one
    range over every task without a longer bound of its own; a task's own age bound, and the
    per-task count bound, are applied to at most `task_budget` tasks each per call (those with
    the oldest due row, and those furthest over their count, first).
    """
    task = table.c.task_id
    stats = {r[0]: (r[1], r[2]) for r in conn.execute(
        select(task, func.count(), func.min(at)).where(at.is_not(None)).group_by(task))}
    counts = {t: n for t, (n, _) in stats.items()}
    default = policy.default
    own = {t: policy.for_task(t) for t in stats if t in policy.tasks}
    # A task whose own age bound is longer than the global one must not be swept by the global
    # range; one with a shorter bound is (what that range selects is due for it too), and gets
    # its own range below for the rest.
    longer = sorted(t for t, p in own.items() if p.max_age_ms > default.max_age_ms)
    cutoff = at <= default.age_cutoff_ms(now_ms)
    due = [and_(cutoff, task.not_in(longer)) if longer else cutoff]
    aged = sorted((t for t, p in own.items()
                   if p.max_age_ms != default.max_age_ms and stats[t][1] <= p.age_cutoff_ms(now_ms)),
                  key=lambda t: (stats[t][1], t))[:task_budget]
    for t in aged:
        due.append(and_(task == t, at <= own[t].age_cutoff_ms(now_ms)))
    over = sorted((t for t, n in counts.items() if n > policy.for_task(t).max_runs),
                  key=lambda t: (policy.for_task(t).max_runs - counts[t], t))[:task_budget]
    for t in over:
        keep = policy.for_task(t).max_runs
        cut = conn.execute(select(at, key).where(and_(task == t, at.is_not(None)))
                           .order_by(at.desc(), key.desc()).limit(1).offset(keep)).one()
        due.append(and_(task == t, or_(at < cut[0], and_(at == cut[0], key <= cut[1]))))
    query = (select(key, task, at, *extra).where(and_(at.is_not(None), or_(*due)))
             .order_by(at, key).limit(limit))
    seen: Counter[str] = Counter()
    found = []
    for row in conn.execute(query):
        t = row[1]
        found.append(_Due(key=row[0], task=t, at=row[2], newer=counts[t] - 1 - seen[t], row=row))
        seen[t] += 1
    return found


def _delete_settled_notifications(conn: Connection, run_id: str) -> None:
    """A retired run's notifications that are settled (delivered, or given up) and their tries; a
    pending one stays until it is delivered: it carries what it tells."""
    settled = (select(notification_outbox.c.id)
               .where(and_(notification_outbox.c.run_id == run_id, notification_outbox.c.status != "pending")))
    conn.execute(notification_deliveries.delete().where(and_(
        notification_deliveries.c.run_id == run_id, notification_deliveries.c.outbox_id.in_(settled))))
    conn.execute(notification_outbox.delete().where(and_(
        notification_outbox.c.run_id == run_id, notification_outbox.c.status != "pending")))
