"""Control side: edge's recovery of local attempts (SEMANTICS.md §6): a full startup pass, then only
what the Executor reports.

For each candidate: a receipt wins; an unstarted claim has its lease released without probing (it
is offered again); otherwise the
process identity (database, else the launcher's start marker) decides: still running -> keep and
re-bind; not running -> wait the publish grace, read the receipt again, then end by the cancel
intent or mark lost. Unreadable evidence is left for later and reported, never guessed.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any

from ..domain.receipt import token_hash
from ..domain.transitions import ErrorCode
from ..ids import new_id
from ..runtime.actor import RuntimeActor
from ..runtime.home import read_recovery_status, write_recovery_status
from ..runtime.ports import JournalFacts, LocalEvidence
from ..runtime.signals import AttemptEnded, Resume, StartupPass, StepDone, StepRequest, Tick
from .context import ControlContext

log = logging.getLogger("qlactors.recovery")

STARTUP_PAGE = 64


class Recovery(RuntimeActor):
    ctx: ControlContext
    name = "recovery"
    never_redelivered = (StartupPass,)  # asked by the profile, which then fails to start

    def __init__(self, ctx: ControlContext) -> None:
        super().__init__(ctx)
        if ctx.local is None:
            raise TypeError("edge's Recovery judges from this process's executor side: ctx.local is required")
        self.local: LocalEvidence = ctx.local
        # The attempts the Executor attests ended without completion, each with the stop it
        # attested (term, kill, exit; None when it named none, or for a resume's look again).
        self.ended: dict[str, str | None] = {}
        self.unresolved: dict[str, str] = {}  # attempt id -> why it could not be judged

    def handlers(self):
        return {StartupPass: self.on_startup, StepRequest: self.on_page, AttemptEnded: self.on_ended,
                Resume: self.on_resume}

    def started(self) -> None:
        if self.ctx.admitting.is_set():  # restarted by the Supervisor (admission opens only
            self.actor_ref.tell(Resume())  # after the first startup pass)

    def on_resume(self, _msg: Resume, _peer: bytes) -> None:
        """What the dead instance had been told is gone: look again, on the next pages, at every
        attempt it may have been told about, and take back its published unresolved ones.

        `running` ones: a healthy one probes alive and is left alone. `claimed` ones the Executor
        does not hold (no `accepted` journal row: its give-back may have been lost) have their
        lease released and are offered again — a healthy offer only loses its Activate, nothing
        runs twice. `starting` ones without a journal row: activated, never launched here.
        Run as a message, not in `on_start`: a database outage is retried, not a failure."""
        self.unresolved.update((item["attempt_id"], item["why"]) for item in read_recovery_status(
            self.ctx.config.home) if isinstance(item, dict) and isinstance(item.get("attempt_id"), str)
            and isinstance(item.get("why"), str))
        for candidates in self._every_candidate():
            journals = self.local.journal_entries([c.attempt_id for c in candidates])
            for c in candidates:
                if _may_be_orphaned(c, journals.get(c.attempt_id)):
                    self.ended.setdefault(c.attempt_id, None)
        log.info("event=recovery_resumed ended=%d unresolved=%d", len(self.ended), len(self.unresolved))
        self.ctx.directory.tell("scheduler", Tick("recovery_resumed"))

    def on_ended(self, msg: AttemptEnded, _peer: bytes) -> None:
        self.ended[msg.attempt_id] = msg.stopped_by or self.ended.get(msg.attempt_id)

    def on_startup(self, _msg: StartupPass, _peer: bytes) -> dict[str, int]:
        """Examine every in-flight attempt, page after page (asked once, before admission opens)."""
        totals: dict[str, int] = {}
        for candidates in self._every_candidate():
            for outcome in self._examine(candidates, startup=True):
                totals[outcome] = totals.get(outcome, 0) + 1
        log.info("event=startup_recovery %s", " ".join(f"{k}={v}" for k, v in sorted(totals.items())))
        self._publish()
        return totals

    def _every_candidate(self):
        """Every in-flight attempt of this node, page after page (keyset on the attempt id)."""
        after = None
        while True:
            candidates, more = self.ctx.control.recovery.candidates(STARTUP_PAGE, after)
            yield candidates
            if not more or not candidates:
                return
            after = candidates[-1].attempt_id

    def on_page(self, msg: StepRequest, _peer: bytes) -> None:
        page = self.ctx.config.runtime.recovery_page
        wanted = sorted(self.ended.keys() | self.unresolved.keys())[:page]
        try:
            candidates = self.ctx.control.recovery.candidates_for(wanted)
            known = {c.attempt_id for c in candidates}
            for attempt_id in wanted:
                if attempt_id not in known:  # already resolved (e.g. a receipt landed meanwhile)
                    self._resolved(attempt_id)
            before = dict(self.unresolved)
            self._examine(candidates, startup=False)
            if before != self.unresolved:
                self._publish()
        except Exception as err:
            log.warning("event=recovery_page_failed error=%r", err)
            self.ctx.directory.tell("scheduler", StepDone(msg.cycle, self.name, False, repr(err)))
            return
        self.ctx.directory.tell("scheduler", StepDone(msg.cycle, self.name, True,
                                                      pending=bool(wanted or self.ended or self.unresolved)))

    # -- judging ------------------------------------------------------------------------------

    def _examine(self, candidates: list, *, startup: bool) -> list[str]:
        outcomes: list[str] = []
        later: list[tuple[Any, Any]] = []  # (candidate, identity or None)
        boot_id = self.local.boot_id()  # read once for the batch, as the journal rows are
        journals = self.local.journal_entries([c.attempt_id for c in candidates])
        for c in candidates:
            if self._consume_receipt(c):
                outcomes.append("completed")
                continue
            if c.attempt_status == "claimed" and c.cancel_reason is None:
                outcomes.append(self._release_claim(c))
                continue
            if c.attempt_status == "claimed":  # not expected (a cancel ends a claim at once)
                outcomes.append(self._end(c, ErrorCode.RECOVERY_UNSTARTED_CLAIM))
                continue
            journal = journals.get(c.attempt_id)
            identity = self._identity(c, journal)
            if identity is None:
                later.append((c, None))
                continue
            liveness = self.local.liveness(identity, boot_id)  # the executor side's probe of /proc
            if liveness == "unreadable":
                self.unresolved[c.attempt_id] = "process identity unreadable"
                outcomes.append("unresolved")
            elif liveness == "running":
                if startup:
                    self._rebind(c, identity, journal)
                self.ended.pop(c.attempt_id, None)
                outcomes.append("running")
            else:  # gone on this boot, or another boot: not running
                later.append((c, identity))
        if later:
            time.sleep(self.ctx.config.runtime.publish_grace_ms / 1000)  # one grace for the batch
        for c, identity in later:
            if self._consume_receipt(c):
                outcomes.append("completed")
                continue
            code = (ErrorCode.RECOVERY_IDENTITY_MISSING if identity is None
                    else ErrorCode.RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT)
            outcomes.append(self._end(c, code))
        return outcomes

    def _identity(self, c: Any, journal: JournalFacts | None):
        """Database first, then the executor's journal row, then the launcher's start marker."""
        identity = c.identity or (journal.identity if journal is not None else None)
        if identity is not None:
            return identity
        try:
            return self.local.marker_identity(c.attempt_id)
        except ValueError as err:
            log.warning("event=marker_unreadable attempt=%s error=%s", c.attempt_id, err)
            return None

    def _consume_receipt(self, c: Any) -> bool:
        """Receipt first: a valid one completes the attempt through the one CompletionService."""
        found = self.local.receipt(c.attempt_id)
        if found.kind == "missing":
            return False
        if found.kind == "bad":
            self.local.quarantine(c.attempt_id)
            return False
        # A receipt published after the Executor attested the end: the stop that attestation named
        # (what this process sent the job's group) decides a stop's signal, as a Completed's would.
        outcome = self.ctx.completion.complete(c.run_id, c.attempt_id, found.receipt, found.dropped,
                                               self.ended.get(c.attempt_id) or "exit")
        if outcome.settled:
            self.local.receipt_applied(c.attempt_id)
            self._resolved(c.attempt_id)
            return True
        self.local.quarantine(c.attempt_id)
        return False

    def _end(self, c: Any, code: str) -> str:
        control = self.ctx.control
        if c.cancel_reason is not None:
            control.stops.end_by_intent(c.run_id, c.attempt_id)
            outcome = "ended_by_intent"
        else:
            control.recovery.mark_lost(c.run_id, c.attempt_id, code)
            outcome = "lost"
        log.warning("event=attempt_%s run=%s attempt=%s code=%s", outcome, c.run_id, c.attempt_id, code)
        self.local.ended(c.attempt_id)
        self._resolved(c.attempt_id)
        return outcome

    def _release_claim(self, c: Any) -> str:
        """Offered, never activated: release its lease and let it be offered again (never `lost`)."""
        outcome = self.ctx.dispatch.reports.release_unactivated(c.run_id, c.attempt_id)
        log.info("event=claim_released run=%s attempt=%s result=%s detail=%s", c.run_id, c.attempt_id,
                 outcome.result, outcome.detail)
        if outcome.applied:
            self.local.released(c.attempt_id)  # its journal row, if the executor that took it is gone
        self._resolved(c.attempt_id)
        return "released"

    def _rebind(self, c: Any, identity: Any, journal: JournalFacts | None) -> None:
        self.ctx.control.recovery.rebind(c.run_id, c.attempt_id, self.local.session, identity,
                                offer_id=new_id(), lease_token_hash=token_hash(secrets.token_urlsafe(32)))
        # The Executor re-adopts from its journal: make sure the identity is there (it usually
        # is; only a crash between spawn and the journal write leaves it to the start marker).
        if journal is not None and journal.identity is None:
            self.local.record_started(c.attempt_id, identity)

    def _publish(self) -> None:
        write_recovery_status(self.ctx.config.home, self.unresolved)

    def _resolved(self, attempt_id: str) -> None:
        self.ended.pop(attempt_id, None)
        self.unresolved.pop(attempt_id, None)


def _may_be_orphaned(c: Any, journal: JournalFacts | None) -> bool:
    """Whether a restarted Recovery must look at candidate `c` (with its journal row) again (see `on_resume`)."""
    if c.attempt_status == "running":
        return True
    if c.attempt_status == "claimed":  # a candidate only while its lease is live
        return journal is None or journal.state != "accepted"
    return c.attempt_status == "starting" and journal is None
