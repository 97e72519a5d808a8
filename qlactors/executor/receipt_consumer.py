"""Executor side: the ReceiptConsumer: reads a finished attempt's receipt, reports it, and only after
the answer removes or quarantines the file; on its cadence, journal-driven cleanup and quarantine
retention.

A cluster worker's `Completed` is sent again until it is answered (SEMANTICS.md §9 Completion:
the receipt is deleted only after the answer): every RESEND_COMPLETED_S while unanswered (a link
drops its oldest unanswered requests past `wire/links.MAX_UNANSWERED`, and an answer can be lost
with a replica), and at once when a new session opens, naming it. A repeat is harmless: the
control side answers `already_terminal`. Edge's goes to the Gateway in-process and is not."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass

from ..clock import wall_ms
from ..domain.results import SETTLED, Result
from ..faults import crash_point
from ..ids import completion_request_id
from ..runtime.actor import RuntimeActor
from ..runtime.signals import Cleanup, Consume, LogFinal, NoReceipt, ResendCompleted, Resume, SessionOpen
from ..wire import messages as m
from .context import ExecutorContext
from .evidence import ENDED, ENDED_WITH_RECEIPT, REBOOTED, probe_journal

log = logging.getLogger("qlactors.receipts")

RESUME_PAGE = 64
ENDED_FACTS = (ENDED_WITH_RECEIPT, ENDED, REBOOTED)  # probed facts whose receipt (or none) decides
# A cluster worker keeps a finished attempt's local log this long once it is acknowledged to
# its final offset (the control side's copy is the one `qlactors logs` reads).
LOCAL_LOG_KEEP_MS = 3_600_000
# A Completed still unanswered after this long is sent again (idempotent on the control side).
# The link re-sends only what a replica has not answered, and any later frame from it counts as
# the answer: a replica killed after it answered an earlier request, before it committed this
# completion, leaves it lost, and nothing else would report that run.
RESEND_COMPLETED_S = 10.0
# The refusals of a `Completed` that are the receipt's own fault (SEMANTICS.md §5), by the
# detail's first word: it fails the codec (the Gateway's `invalid_receipt: ...`; one naming
# another run or attempt) or the token, or its sequence is not the next one: sending it again
# can never land it, so it is quarantined. Any other refusal (an attempt the database does not
# know or that is not running, another worker's, a value the store refused) is not the
# receipt's: it stays where it is with its journal row, for the next try, as a `fenced` one does.
QUARANTINE_REFUSALS = frozenset({"invalid_receipt", "receipt_mismatch", "no_token", "bad_token",
                                 "wrong_sequence"})


def quarantines(detail: str) -> bool:
    """Whether a refused Completed's `detail` says the receipt itself is bad (QUARANTINE_REFUSALS)."""
    return (detail or "").split(":", 1)[0].strip() in QUARANTINE_REFUSALS


@dataclass
class Unanswered:
    """A `Completed` sent and not answered yet."""

    completed: m.Completed
    sent_at: float = dataclasses.field(default_factory=time.monotonic)  # last sent, monotonic

    @property
    def crosses_a_link(self) -> bool:
        """A cluster worker's (it names the log's final offset): sent again until answered.
        Edge's goes to the Gateway in this process and is not."""
        return self.completed.final_log_offset is not None


class ReceiptConsumer(RuntimeActor):
    ctx: ExecutorContext
    name = "receipts"
    uses_outbox = True

    def __init__(self, ctx: ExecutorContext) -> None:
        super().__init__(ctx)
        self.waiting: dict[str, Unanswered] = {}  # attempt id -> its Completed, answer pending
        self.final_offsets: dict[str, int] = {}  # attempt id -> the log's final offset it named
        # The session Completed names (who forwarded it): edge's local one; a worker's from Welcome.
        s = ctx.session
        self.session = SessionOpen(s.worker_id, s.session_id, s.generation) if s is not None else None
        self.deferred: dict[str, Consume] = {}  # consumed before the first Welcome (worker start)

    def handlers(self):
        return {Consume: self.on_consume, m.Ack: self.on_ack, Cleanup: self.on_cleanup,
                Resume: self.on_resume, SessionOpen: self.on_session_open, ResendCompleted: self.on_resend}

    def on_session_open(self, msg: SessionOpen, _peer: bytes) -> None:
        self.session = msg
        for attempt_id in list(self.waiting):  # what the old session sent may never be answered
            self._resend(attempt_id)
        deferred, self.deferred = self.deferred, {}
        for consume in deferred.values():
            self.on_consume(consume, b"")

    def started(self) -> None:
        # One pass at once: a crash between a commit and the receipt's deletion leaves rows that
        # should not wait a whole cleanup interval. Later passes ride on the cadence.
        self.actor_ref.tell(Cleanup())
        if self.ctx.admitting.is_set():  # a restart (or the first start, right after startup
            self.actor_ref.tell(Resume())  # recovery: then there is seldom anything to find)

    def on_resume(self, _msg: Resume, _peer: bytes) -> None:
        """pykka dropped the Consumes queued for the dead instance, and the Executor has already
        forgotten those attempts: consume again every journaled launcher the evidence says has
        ended (`executor/evidence.py`: gone or another boot after the publish grace, or a receipt
        is there; a missing receipt goes the usual way, NoReceipt, then recovery judges). A
        running one is left to the Executor, which watches it; one being launched, or whose /proc
        is unreadable (not evidence), is the Executor's to probe. A Consume that also comes from
        there is harmless (the second completion is `already_terminal`)."""
        grace_s = self.ctx.config.runtime.publish_grace_ms / 1000
        for found in probe_journal(self.ctx.journal, receipts=self.ctx.local_receipts,
                                   current_boot_id=self.ctx.boot_id(), grace_s=grace_s, page=RESUME_PAGE):
            if found.fact in ENDED_FACTS:
                entry = found.entry
                log.info("event=receipt_looked_again run=%s attempt=%s fact=%s", entry.run_id,
                         entry.attempt_id, found.fact)
                self.actor_ref.tell(Consume(entry.run_id, entry.attempt_id, recheck=True))

    def _schedule_cleanup(self) -> None:
        interval = self.ctx.config.runtime.receipt_cleanup_interval_ms / 1000
        self.ctx.bridge.call_at("receipt-cleanup", time.monotonic() + interval, self.me, Cleanup())

    def on_consume(self, msg: Consume, _peer: bytes) -> None:
        files = self.ctx.local_receipts
        found = files.look(msg.attempt_id)
        if found.kind == "missing" and msg.end_known:
            self._end_known(msg)
            return
        if found.kind == "missing":
            if not msg.recheck:  # the launcher may still be publishing: one grace, one more look
                grace = self.ctx.config.runtime.publish_grace_ms / 1000
                self.ctx.bridge.call_at(f"recheck:{msg.attempt_id}", time.monotonic() + grace, self.me,
                                        Consume(msg.run_id, msg.attempt_id, recheck=True,
                                                stopped_by=msg.stopped_by))
                return
            self.ctx.directory.tell("executor", NoReceipt(msg.run_id, msg.attempt_id, stopped_by=msg.stopped_by))
            return
        if found.kind == "bad":
            files.quarantine(msg.attempt_id)
            self.ctx.directory.tell("executor", NoReceipt(msg.run_id, msg.attempt_id, quarantined=True,
                                                          stopped_by=msg.stopped_by))
            return
        r = found.receipt
        session = self.session
        if session is None:  # a worker still registering: sent once its session is open
            self.deferred[msg.attempt_id] = msg
            return
        final_offset, in_time = self.ctx.completion_facts(msg.attempt_id, r)
        if final_offset is not None:
            self.final_offsets[msg.attempt_id] = final_offset
        completed = m.Completed(
            request_id=completion_request_id(r.attempt_id), worker_id=session.worker_id, session_id=session.session_id,
            session_generation=session.generation, run_id=r.run_id, attempt_id=r.attempt_id,
            schema_version=r.schema_version, callback_sequence=r.callback_sequence, token=r.token,
            started_at_ms=r.started_at_ms, finished_at_ms=r.finished_at_ms, exit_code=r.exit_code,
            log_dropped_bytes=found.dropped, output_open=r.output_open, stopped_by=msg.stopped_by,
            final_log_offset=final_offset, finished_in_time=in_time)
        self.waiting[msg.attempt_id] = Unanswered(completed)
        self.out.to_control(completed)
        if final_offset is not None:  # a cluster worker's: it crosses a link that can lose it
            self._schedule_resend()

    def _resend(self, attempt_id: str) -> None:
        """Send a waiting `Completed` again, naming the current session (its token authenticates
        it, whatever the session)."""
        pending, s = self.waiting[attempt_id], self.session
        pending.completed = dataclasses.replace(pending.completed, worker_id=s.worker_id,
                                                session_id=s.session_id, session_generation=s.generation)
        pending.sent_at = time.monotonic()
        log.warning("event=completed_resent run=%s attempt=%s", pending.completed.run_id, attempt_id)
        self.out.to_control(pending.completed)

    def on_resend(self, _msg: ResendCompleted, _peer: bytes) -> None:
        """Send again each cluster Completed unanswered for RESEND_COMPLETED_S."""
        now = time.monotonic()
        if self.session is not None:
            for attempt_id, pending in list(self.waiting.items()):
                if pending.crosses_a_link and now - pending.sent_at >= RESEND_COMPLETED_S:
                    self._resend(attempt_id)
        self._schedule_resend()

    def _schedule_resend(self) -> None:
        """The timer at the oldest unanswered cluster Completed's turn (none when all are answered)."""
        due = [p.sent_at for p in self.waiting.values() if p.crosses_a_link]
        if due and self.ctx.bridge.timer_due("receipts-resend") is None:
            self.ctx.bridge.call_at("receipts-resend", min(due) + RESEND_COMPLETED_S, self.me, ResendCompleted())

    def on_ack(self, msg: m.Ack, _peer: bytes) -> None:
        pending = self.waiting.get(msg.attempt_id)  # forgotten only once handled (a database
        if pending is None:  # outage in between makes it handled again)
            # The answer to a receipt an instance that died sent: a committed completion is as
            # good now, so its files and journal row go as on the fast path (nothing else would
            # remove them: the cleanup pass lists only `completed` rows). A row already handed
            # to retention was answered before (this is the answer to a second copy of the
            # Completed): its log may still be shipping, so it stays.
            entry = self.ctx.journal.get(msg.attempt_id)
            if msg.result in SETTLED and entry is not None \
                    and entry.purge_after_ms is None:
                self.ctx.local_receipts.finish(msg.attempt_id)
            return
        run_id = pending.completed.run_id
        files = self.ctx.local_receipts
        if msg.result in SETTLED:
            crash_point("after_completion_commit")
            self._finish(msg.attempt_id, self.final_offsets.pop(msg.attempt_id, None))
        elif msg.result == Result.REFUSED and quarantines(msg.detail):
            log.warning("event=receipt_refused attempt=%s detail=%s", msg.attempt_id, msg.detail)
            files.quarantine(msg.attempt_id)
            self.ctx.directory.tell("executor", NoReceipt(run_id, msg.attempt_id, quarantined=True))
        else:  # fenced, or refused but not for the receipt's fault: leave it; the cleanup pass tries again
            event = "receipt_fenced" if msg.result == Result.FENCED else "receipt_refused_kept"
            log.warning("event=%s attempt=%s detail=%s", event, msg.attempt_id, msg.detail)
            # Only now is the row marked `completed` (the cleanup pass lists those): on the fast
            # path an unmarked row costs nothing, and after a crash re-adoption finds it anyway.
            if self.ctx.journal.get(msg.attempt_id) is not None:
                self.ctx.journal.set_state(msg.attempt_id, "completed")
        self.waiting.pop(msg.attempt_id, None)

    def _finish(self, attempt_id: str, final_offset: int | None) -> None:
        """The control side has the attempt's end: its files go, the journal row last; a cluster
        worker's log stays, and its tail ships on up to `final_offset`, for local retention."""
        files = self.ctx.local_receipts
        if final_offset is None:
            files.finish(attempt_id)  # delete only after the commit, journal row last
            return
        self.ctx.journal.final_offset(attempt_id, final_offset)
        files.finish(attempt_id, keep_log_until_ms=wall_ms() + LOCAL_LOG_KEEP_MS)
        self.ctx.directory.tell("logs", LogFinal(attempt_id, final_offset))

    def _end_known(self, msg: Consume) -> None:
        """No receipt, and the control side has the attempt's end (the Executor's not-running
        attestation was answered: the evidence recorded, or the attempt over): the row is finished
        instead of staying in flight for good; a cluster worker's log ships to its length now."""
        entry = self.ctx.journal.get(msg.attempt_id)
        if entry is None or entry.purge_after_ms is not None or msg.attempt_id in self.waiting:
            return  # gone, handed to retention already, or a Completed in flight finishes it
        final_offset = None
        if self.ctx.log_retention is not None:
            final_offset = entry.final_offset
            if final_offset is None:
                try:
                    final_offset = os.stat(entry.log_path).st_size
                except OSError:
                    final_offset = 0  # no log file: nothing was written, nothing is to be shipped
        log.info("event=row_finished_end_known run=%s attempt=%s", msg.run_id, msg.attempt_id)
        self._finish(msg.attempt_id, final_offset)

    def on_cleanup(self, _msg: Cleanup, _peer: bytes) -> None:
        """Bounded: retry completed-but-not-cleared rows, purge old quarantine entries."""
        page = self.ctx.config.runtime.receipt_cleanup_page
        try:
            journal = self.ctx.journal
            for entry in journal.list(("completed",), page, None, unretained=True):
                self.on_consume(Consume(entry.run_id, entry.attempt_id, recheck=True), b"")
            if self.ctx.log_retention is not None:  # a cluster worker's acknowledged local logs
                self.ctx.log_retention.step(page)
            for entry in journal.due_purge(wall_ms(), page):
                journal.clear(entry.attempt_id)
            self.ctx.receipts.purge_quarantine(self.ctx.config.runtime.quarantine_retention_ms, wall_ms(), page)
        finally:
            self._schedule_cleanup()
