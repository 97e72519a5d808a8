"""The ReceiptConsumer: reads a finished attempt's receipt, reports it, and only after the answer
removes or quarantines the file; on its cadence, journal-driven cleanup and quarantine retention."""

from __future__ import annotations

import logging
import time
from typing import Any

from ..faults import crash_point
from ..process.identity import Liveness, probe
from ..wire import messages as m
from .base import RuntimeActor, now_ms
from .signals import Cleanup, Consume, LogFinal, NoReceipt, ResendCompleted, Resume, SessionOpen

log = logging.getLogger("qlactors.receipts")

RESUME_PAGE = 64
# A cluster worker keeps a finished attempt's local log this long once it is acknowledged to
# its final offset (the control side's copy is the one `qlactors logs` reads).
LOCAL_LOG_KEEP_MS = 3_600_000
# A Completed still unanswered after this long is sent again (idempotent on the control side).
# The link re-sends only what a replica has not answered, and any later frame from it counts as
# the answer: a replica killed after it answered an earlier request, before it committed this
# completion, leaves it lost, and nothing else would report that run.
RESEND_COMPLETED_S = 10.0


class ReceiptConsumer(RuntimeActor):
    name = "receipts"
    uses_outbox = True

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.waiting: dict[str, str] = {}  # attempt id -> run id, Completed sent, answer pending
        self.final_offsets: dict[str, int] = {}  # attempt id -> the log's final offset it named
        # attempt id -> (when sent, monotonic; a cluster Completed awaiting its answer)
        self.sent: dict[str, tuple[float, m.Completed]] = {}
        # The session Completed names (who forwarded it): edge's local one; a worker's from Welcome.
        s = ctx.session
        self.session = SessionOpen(s.worker_id, s.session_id, s.generation) if s is not None else None
        self.deferred: dict[str, Consume] = {}  # consumed before the first Welcome (worker start)

    def handlers(self):
        return {Consume: self.on_consume, m.Ack: self.on_ack, Cleanup: self.on_cleanup,
                Resume: self.on_resume, SessionOpen: self.on_session_open, ResendCompleted: self.on_resend}

    def on_session_open(self, msg: SessionOpen, _peer: bytes) -> None:
        self.session = msg
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
        forgotten those attempts: consume again every journaled launcher that is not running
        (a missing receipt goes the usual way, NoReceipt, then recovery judges). A running one
        is left to the Executor, which watches it; a Consume that also comes from there is
        harmless (the second completion is `already_terminal`)."""
        boot_id = self.ctx.boot_id()
        files = self.ctx.local_receipts
        for entry in self.ctx.journal.each(("launching", "started"), RESUME_PAGE):
            identity = files.launcher_identity(entry)
            if identity is None:  # still being launched (the Executor holds it)
                continue
            if probe(identity, current_boot_id=boot_id) is not Liveness.RUNNING:
                log.info("event=receipt_looked_again run=%s attempt=%s", entry.run_id, entry.attempt_id)
                self.actor_ref.tell(Consume(entry.run_id, entry.attempt_id))

    def _schedule_cleanup(self) -> None:
        interval = self.ctx.config.runtime.receipt_cleanup_interval_ms / 1000
        self.ctx.bridge.call_at("receipt-cleanup", time.monotonic() + interval, self.me, Cleanup())

    def on_consume(self, msg: Consume, _peer: bytes) -> None:
        files = self.ctx.local_receipts
        found = files.look(msg.attempt_id)
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
        self.waiting[msg.attempt_id] = msg.run_id
        final_offset, in_time = self.ctx.completion_facts(msg.attempt_id, r)
        if final_offset is not None:
            self.final_offsets[msg.attempt_id] = final_offset
        completed = m.Completed(
            worker_id=session.worker_id, session_id=session.session_id,
            session_generation=session.generation, run_id=r.run_id, attempt_id=r.attempt_id,
            schema_version=r.schema_version, callback_sequence=r.callback_sequence, token=r.token,
            started_at_ms=r.started_at_ms, finished_at_ms=r.finished_at_ms, exit_code=r.exit_code,
            log_dropped_bytes=found.dropped, output_open=r.output_open, stopped_by=msg.stopped_by,
            final_log_offset=final_offset, finished_in_time=in_time)
        self.out.to_control(completed)
        if final_offset is not None:  # a cluster worker's: it crosses a link that can lose it
            self.sent[msg.attempt_id] = (time.monotonic(), completed)
            self._schedule_resend()

    def on_resend(self, _msg: ResendCompleted, _peer: bytes) -> None:
        """Send again each Completed unanswered for RESEND_COMPLETED_S (its token authenticates
        it, whatever the session)."""
        now = time.monotonic()
        for attempt_id, (at, completed) in list(self.sent.items()):
            if now - at >= RESEND_COMPLETED_S:
                log.warning("event=completed_resent run=%s attempt=%s", completed.run_id, attempt_id)
                self.out.to_control(completed)
                self.sent[attempt_id] = (now, completed)
        self._schedule_resend()

    def _schedule_resend(self) -> None:
        """The timer at the oldest unanswered Completed's turn (none when all are answered)."""
        if self.sent and self.ctx.bridge.timer_due("receipts-resend") is None:
            oldest = min(at for at, _c in self.sent.values())
            self.ctx.bridge.call_at("receipts-resend", oldest + RESEND_COMPLETED_S, self.me, ResendCompleted())

    def on_ack(self, msg: m.Ack, _peer: bytes) -> None:
        run_id = self.waiting.get(msg.attempt_id)  # forgotten only once handled (a database
        if run_id is None:  # outage in between makes it handled again)
            # The answer to a receipt an instance that died sent: a committed completion is as
            # good now, so its files and journal row go as on the fast path (nothing else would
            # remove them: the cleanup pass lists only `completed` rows). A row already handed
            # to retention was answered before (this is a duplicate, after the link re-sent the
            # Completed on a failover): its log may still be shipping, so it stays.
            entry = self.ctx.journal.get(msg.attempt_id)
            if msg.result in ("applied", "already_terminal") and entry is not None \
                    and entry.purge_after_ms is None:
                self.ctx.local_receipts.finish(msg.attempt_id)
            return
        files = self.ctx.local_receipts
        if msg.result in ("applied", "already_terminal"):
            crash_point("after_completion_commit")
            final_offset = self.final_offsets.pop(msg.attempt_id, None)
            if final_offset is None:
                files.finish(msg.attempt_id)  # delete only after the commit, journal row last
            else:  # a cluster worker: the log's tail ships on, up to its final offset
                self.ctx.journal.final_offset(msg.attempt_id, final_offset)
                files.finish(msg.attempt_id, keep_log_until_ms=now_ms() + LOCAL_LOG_KEEP_MS)
                self.ctx.directory.tell("logs", LogFinal(msg.attempt_id, final_offset))
        elif msg.result == "refused":
            log.warning("event=receipt_refused attempt=%s detail=%s", msg.attempt_id, msg.detail)
            files.quarantine(msg.attempt_id)
            self.ctx.directory.tell("executor", NoReceipt(run_id, msg.attempt_id, quarantined=True))
        else:  # fenced: leave the receipt where it is; the cleanup pass tries again
            log.warning("event=receipt_fenced attempt=%s detail=%s", msg.attempt_id, msg.detail)
            # Only now is the row marked `completed` (the cleanup pass lists those): on the fast
            # path an unmarked row costs nothing, and after a crash re-adoption finds it anyway.
            if self.ctx.journal.get(msg.attempt_id) is not None:
                self.ctx.journal.set_state(msg.attempt_id, "completed")
        self.waiting.pop(msg.attempt_id, None)
        self.sent.pop(msg.attempt_id, None)

    def on_cleanup(self, _msg: Cleanup, _peer: bytes) -> None:
        """Bounded: retry completed-but-not-cleared rows, purge old quarantine entries."""
        page = self.ctx.config.runtime.receipt_cleanup_page
        try:
            journal = self.ctx.journal
            for entry in journal.list(("completed",), page, None, unretained=True):
                self.on_consume(Consume(entry.run_id, entry.attempt_id, recheck=True), b"")
            if self.ctx.log_retention is not None:  # a cluster worker's acknowledged local logs
                self.ctx.log_retention.step(page)
            for entry in journal.due_purge(now_ms(), page):
                journal.clear(entry.attempt_id)
            self.ctx.receipts.purge_quarantine(self.ctx.config.runtime.quarantine_retention_ms, now_ms(), page)
        finally:
            self._schedule_cleanup()
