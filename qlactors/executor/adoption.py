"""Executor side: adoption and re-attestation (SEMANTICS.md §9 Re-attest, §10): after every start
and every new session, each attempt in the journal is probed and re-attested with the fact the
evidence gives, and each survivor's lease is re-bound to the current session.

- Journal rows this instance does not hold are probed (`executor/evidence.py: probe_rows`, one
  publish grace per page) and acted on by their fact: `running` → adopted and attested
  `running`; a receipt, `ended` or `rebooted` → consumed (the receipt, or its absence, is
  reported as for a launcher whose end this executor saw); `never_launched` → given back;
  `launch_unknown` → attested so, never relaunched; unreadable /proc → no fact, probed again
  on a later heartbeat. (Edge: its recovery judges by its own records, §6, so everything but a
  survivor or a never-launched row is consumed as before.)
- Attempts this instance holds when a session other than their lease's opens (a re-register
  after the old session ended): each launched one is attested `running` quoting its lease,
  with a fresh slot, and its renewals are held until the answer; an accepted, never launched
  one is given back.
- A `running` attestation is journalled, with the fresh slot it asks the lease to be re-bound
  to, before it is sent, and a survivor is never attested `running` again while one about it is
  owed: that one is sent again, unchanged (after a restart too), and its answer decides. What
  the Executor knows of a re-bind is the owed Attest, never memory alone (issue 26).
- The answer to a `running` attestation: `applied` → the lease its own slot names is re-bound
  (journalled in the transaction that settles the Attest); `superseded` → the process is stopped
  by its exact identity; `fenced` because the session attested from has ended → attested again
  from the current session (or, while that session is still current here, from the next one);
  `fenced` otherwise (the lease is not the worker's any more) → attested again if a newer lease
  was learnt meanwhile; nothing while another report about the attempt is owed; else the process
  is stopped by its exact identity (§9 Renewal).

What each fact and each answer does to the attempt is the attempt machine's (executor/attempt.py):
this part probes, reads the facts the machine asks for (`answer_event`), and carries out the
effects that are its own (ADOPT, OWE_ATTEST_RUNNING, JOURNAL_REBIND); the Executor feeds the
events and carries out the rest (a stop, a consume).

A part the Executor holds (executor/executor.py), given the journal and the files it probes, the
live table, the current session and the owed reports.
"""

from __future__ import annotations

import logging
import os
import secrets
from typing import Any, Callable, Iterator

from ..domain.results import Result
from ..errors import Conflict
from ..ids import new_id
from ..process.identity import Liveness, probe
from ..runtime.context import Named
from ..wire import messages as m
from ..wire.bridge import Bridge
from . import evidence as ev
from .attempt import Decision, Effect, Event, EventKind
from .journal.journal import Journal
from .journal.records import IN_FLIGHT, JournalEntry, LeaseFacts
from .local_receipts import LocalReceipts
from .owed_reports import OwedReports, decoded, session_fence
from .session_policy import CurrentSession
from .slots import Local, Slots

log = logging.getLogger("qlactors.executor")

PROBE_PAGE = 64
# A row attested `launch_unknown` waits for an operator (`confirm-stopped`, `worker retire`): it
# is attested again every this many heartbeats, so the worker learns when its attempt is over.
ASK_UNDECIDED_EVERY = 6
ENDS = (ev.ENDED, "stopped")  # not-running facts after which nothing more is to be said of the attempt


class Adoption:
    """Probing, adoption and re-attestation of an Executor (see the module docstring)."""

    def __init__(self, *, journal: Journal, local_receipts: LocalReceipts, boot_id: Callable[[], str],
                 publish_grace_ms: int, bridge: Bridge, me: Named, current: CurrentSession, slots: Slots,
                 owed: OwedReports) -> None:
        self.journal, self.local_receipts, self.boot_id = journal, local_receipts, boot_id
        self.publish_grace_ms, self.bridge, self.me = publish_grace_ms, bridge, me
        self.current, self.slots, self.owed = current, slots, owed
        self.unprobed: set[str] = set()  # journal rows whose /proc was unreadable: probed again
        self.undecided: set[str] = set()  # rows attested `launch_unknown`, the answer `applied`
        self.beats = 0  # heartbeats seen (`reprobe`), for ASK_UNDECIDED_EVERY

    # -- journal rows not held ------------------------------------------------------------------

    def adopt(self) -> Iterator[ev.Evidence]:
        """The evidence of every in-flight journal row this instance does not hold, page by page."""
        return self._judge([e for e in self.journal.walk(IN_FLIGHT) if e.attempt_id not in self.slots])

    def reprobe(self) -> Iterator[ev.Evidence]:
        """Each heartbeat: the evidence of rows whose /proc was unreadable at the last probe."""
        self.beats += 1
        if not self.unprobed:
            return iter(())
        ids, self.unprobed = sorted(self.unprobed), set()
        entries = (self.journal.get(a) for a in ids if a not in self.slots)
        return self._judge([e for e in entries if e is not None and e.state in IN_FLIGHT])

    def _judge(self, rows: list[JournalEntry]) -> Iterator[ev.Evidence]:
        grace_s = self.publish_grace_ms / 1000
        for start in range(0, len(rows), PROBE_PAGE):
            yield from ev.probe_rows(rows[start:start + PROBE_PAGE], receipts=self.local_receipts,
                                     current_boot_id=self.boot_id(), grace_s=grace_s)

    def undecided_due(self) -> list[JournalEntry]:
        """Every ASK_UNDECIDED_EVERY heartbeats, the `launch_unknown` rows still waiting (not held,
        in flight), to be attested again."""
        if not self.undecided or self.beats % ASK_UNDECIDED_EVERY != 0:
            return []
        due = []
        for attempt_id in sorted(self.undecided):
            entry = self.journal.get(attempt_id)
            if entry is None or entry.state not in IN_FLIGHT or attempt_id in self.slots:
                self.undecided.discard(attempt_id)
            else:
                due.append(entry)
        return due

    def adopt_running(self, entry: JournalEntry, identity: Any) -> Local | None:
        """A launcher that survived a restart: held and watched again (for timeout and cancel).
        None when it ended since the probe (its receipt decides)."""
        boot_id = self.boot_id()
        try:
            pidfd = os.pidfd_open(identity.pid)
        except ProcessLookupError:
            return None
        if probe(identity, current_boot_id=boot_id) is not Liveness.RUNNING:
            os.close(pidfd)  # ended, or the pid was recycled, between the probe and the open
            return None
        local = Local(run_id=entry.run_id, attempt_id=entry.attempt_id, identity=identity, pidfd=pidfd,
                      deadline_ms=entry.local_deadline_ms, lease=None)
        self.slots.hold(local)
        self.bridge.watch(pidfd, entry.attempt_id, self.me)
        log.info("event=adopted run=%s attempt=%s pid=%d", entry.run_id, entry.attempt_id, identity.pid)
        return local

    # -- re-attestation ---------------------------------------------------------------------------

    def lease_of(self, local: Any) -> LeaseFacts | None:
        if local.lease is not None:
            return local.lease
        entry = self.journal.get(local.attempt_id)
        return None if entry is None else entry.lease

    def attest_running(self, local: Any, lease: LeaseFacts | None) -> None:
        """`running` from the current session quoting `lease`, with a fresh slot for the re-bound one
        (journalled with the owed Attest before it is sent). The machine never asks for one while a
        `running` attestation about it is owed: that one is sent again (after a restart too) and its
        answer decides."""
        if self.current.welcome is None:
            return
        slot = (new_id(), secrets.token_urlsafe(32))
        self.owed.attest(local.run_id, local.attempt_id, ev.RUNNING, lease=lease, slot=slot, identity=local.identity)

    def running_owed(self, attempt_id: str, but: str = "") -> list[m.Attest]:
        """The `running` attestations about the attempt still owed (but request `but`), oldest first:
        the journal's, so a restarted instance knows each re-bind's slot as the one that sent it did."""
        owed = (decoded(r) for r in self.journal.owed(about=attempt_id) if r.kind == m.Attest.KIND)
        return [a for a in owed if a.fact == ev.RUNNING and a.request_id != but]

    # -- the answers ------------------------------------------------------------------------------

    def answer_event(self, local: Local, sent: m.Attest, msg: m.Attested) -> Event:
        """The event an answer to a `running` attestation is for the attempt machine, with the facts
        it reads (this answer's report is settled already, unless `applied`)."""
        later = bool(self.running_owed(msg.attempt_id, but=sent.request_id))
        if msg.result == Result.APPLIED:
            s = self.current.welcome
            current = s is None or (s.session_id, s.session_generation) == (sent.session_id, sent.session_generation)
            return Event(EventKind.REBIND_APPLIED, running_owed=later, lease_current=current)
        if msg.result == Result.SUPERSEDED:
            return Event(EventKind.REBIND_SUPERSEDED, running_owed=later)
        s = self.current.welcome
        return Event(EventKind.REBIND_FENCED, running_owed=later,
                     session_fence=msg.result == Result.FENCED and session_fence(msg.detail),
                     sent_from_current=s is None or (s.session_id, s.session_generation) == (
                         sent.session_id, sent.session_generation),
                     newer_lease=local.lease is not None and local.lease != quoted(sent),
                     report_owed=bool(self.journal.owed(about=msg.attempt_id)))

    def slot_of(self, sent: m.Attest, msg: m.Attested) -> bool:
        """Whether an `applied` answer names the slot its attestation asked for."""
        slot = sent.new_slot
        if slot is None or msg.offer_id != slot.offer_id or msg.lease_generation is None:
            log.error("event=rebind_of_unknown_slot attempt=%s offer=%s", msg.attempt_id, msg.offer_id)
            return False
        return True

    def rebind(self, local: Local | None, sent: m.Attest, msg: m.Attested) -> bool:
        """`applied`: the lease the attestation's own slot names, journalled as the attempt's in the
        transaction that settles it — also while the survivor is not held here (its /proc was
        unreadable at the last probe: the adoption that follows quotes this lease). False when
        the row is gone (the attempt ended and was cleared meanwhile)."""
        slot = sent.new_slot
        try:
            self.journal.rebind(msg.attempt_id, msg.lease_generation, slot.offer_id, slot.lease_token,
                                sent.session_id, sent.session_generation, settle=sent.request_id)
        except Conflict:
            self.owed.settle(self.journal.owes(sent.request_id))
            return False
        self.owed.forget(sent.request_id)
        log.info("event=rebound attempt=%s lease_generation=%s session=%s", msg.attempt_id,
                 msg.lease_generation, sent.session_id)
        if local is not None:
            local.lease = LeaseFacts(slot.offer_id, msg.lease_generation, slot.lease_token, sent.session_id,
                                     sent.session_generation)
        return True

    def fact_answered(self, report: Any, msg: m.Attested) -> bool:
        """The answer to an attestation of a not-running fact: settled, or re-made from the current
        session when its own session had ended. True once the control side has the end of an
        attempt this worker holds no process for (`ended` or `stopped` recorded; any fact
        `superseded`: the attempt is over or replaced): its journal row is to be finished, not left
        in flight for good (a cluster worker's: edge judges by its own rows)."""
        if msg.result == Result.FENCED and session_fence(msg.detail):
            self.owed.fenced_by_session(report, msg)
            return False
        self.owed.settle(report)
        if msg.result != Result.APPLIED:
            log.warning("event=attest_%s attempt=%s fact=%s detail=%s", msg.result, msg.attempt_id, msg.fact,
                        msg.detail)
        if msg.fact == ev.LAUNCH_UNKNOWN and msg.result == Result.APPLIED:
            self.undecided.add(msg.attempt_id)  # waits for an operator: asked again now and then
        else:
            self.undecided.discard(msg.attempt_id)
        end_known = msg.result == Result.SUPERSEDED or (msg.result == Result.APPLIED and msg.fact in ENDS)
        return end_known and msg.attempt_id not in self.slots and not self.current.policy.judged_by_own_records


def quoted(sent: m.Attest) -> LeaseFacts | None:
    """The lease an Attest quoted, as the journal keeps one."""
    lease = sent.lease
    if lease is None or sent.lease_session_id is None or sent.lease_session_generation is None:
        return None
    return LeaseFacts(lease.offer_id, lease.lease_generation, lease.lease_token, sent.lease_session_id,
                      sent.lease_session_generation)


def log_refused_rebind(msg: m.Attested, event: Event, decision: Decision) -> None:
    """What a refused `running` attestation came to, in the words of the worker's log."""
    if event.running_owed:
        what, level = "attest_superseded_by_later", logging.INFO  # the answer to an earlier one: a later one decides
    elif decision.stop_cause == Result.SUPERSEDED:
        what, level = "superseded_process_stopped", logging.WARNING
    elif event.session_fence:
        again = Effect.OWE_ATTEST_RUNNING in decision.effects
        what, level = "rebind_fenced_by_session action=" + ("reattest" if again else "reattest_next_session"), \
            logging.WARNING
    elif event.newer_lease:
        what, level = "rebind_retried", logging.WARNING  # a newer lease was learnt since: quoted now
    elif event.report_owed:
        what, level = "rebind_refused_report_owed", logging.WARNING  # its answer may still keep the process
    elif decision.stop_cause:
        what, level = "rebind_refused_process_stopped", logging.ERROR  # nothing can renew the quoted lease
    else:
        what, level = "rebind_refused_stopping", logging.INFO  # a stop is under way already
    log.log(level, "event=%s attempt=%s result=%s detail=%s", what, msg.attempt_id, msg.result, msg.detail or "-")
