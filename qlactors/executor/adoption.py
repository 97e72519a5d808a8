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

A part the Executor holds (executor/executor.py), given the journal and the files it probes, the
live table, the current session and the owed reports; a consume and a stop are the Executor's.
"""

from __future__ import annotations

import logging
import os
import secrets
from typing import Any, Callable

from ..domain.results import Result
from ..errors import Conflict
from ..ids import new_id
from ..process.identity import Liveness, probe
from ..runtime.context import Named
from ..runtime.signals import Consume
from ..wire import messages as m
from ..wire.bridge import Bridge
from . import evidence as ev
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
                 owed: OwedReports, consume: Callable[[Consume], None],
                 begin_stop: Callable[[Local, str], None]) -> None:
        self.journal, self.local_receipts, self.boot_id = journal, local_receipts, boot_id
        self.publish_grace_ms, self.bridge, self.me = publish_grace_ms, bridge, me
        self.current, self.slots, self.owed = current, slots, owed
        self.consume, self.begin_stop = consume, begin_stop
        self.unprobed: set[str] = set()  # journal rows whose /proc was unreadable: probed again
        self.undecided: set[str] = set()  # rows attested `launch_unknown`, the answer `applied`
        self.beats = 0  # heartbeats seen (`reprobe`), for ASK_UNDECIDED_EVERY

    # -- journal rows not held ------------------------------------------------------------------

    def adopt(self) -> None:
        """Probe every in-flight journal row this instance does not hold, and act on its fact."""
        self._judge([e for e in self.journal.walk(IN_FLIGHT) if e.attempt_id not in self.slots])

    def reprobe(self) -> None:
        """Each heartbeat: rows whose /proc was unreadable at the last probe, probed again; every
        ASK_UNDECIDED_EVERY, the `launch_unknown` rows attested again."""
        self.beats += 1
        if self.undecided and self.beats % ASK_UNDECIDED_EVERY == 0:
            self._ask_undecided()
        if not self.unprobed:
            return
        ids, self.unprobed = sorted(self.unprobed), set()
        entries = (self.journal.get(a) for a in ids if a not in self.slots)
        self._judge([e for e in entries if e is not None and e.state in IN_FLIGHT])

    def _judge(self, rows: list[JournalEntry]) -> None:
        grace_s = self.publish_grace_ms / 1000
        for start in range(0, len(rows), PROBE_PAGE):
            for found in ev.probe_rows(rows[start:start + PROBE_PAGE], receipts=self.local_receipts,
                                       current_boot_id=self.boot_id(), grace_s=grace_s):
                self._act_on(found)

    def _act_on(self, found: ev.Evidence) -> None:
        entry, fact = found.entry, found.fact
        if fact == ev.NEVER_LAUNCHED:  # an instance that died before launching it: nothing runs
            self.journal.clear(entry.attempt_id)
            self.owed.give_back(entry.run_id, entry.attempt_id, entry.lease)
        elif fact == ev.RUNNING:
            self._adopt_running(entry, found.identity)
        elif fact in (ev.ENDED_WITH_RECEIPT, ev.ENDED, ev.REBOOTED) or self.current.policy.judged_by_own_records:
            # Its receipt, or the lack of one, decides, exactly as for a launcher whose exit we
            # saw ourselves (the probe has waited the publish grace for a process found gone).
            self.consume(Consume(entry.run_id, entry.attempt_id, recheck=fact != ev.UNREADABLE))
        elif fact == ev.LAUNCH_UNKNOWN:  # maybe spawned, maybe not: never relaunched, never "ended"
            log.warning("event=launch_unknown run=%s attempt=%s", entry.run_id, entry.attempt_id)
            self.owed.attest(entry.run_id, entry.attempt_id, ev.LAUNCH_UNKNOWN, lease=entry.lease)
        else:  # unreadable /proc is not evidence (§10): no fact now, a later probe
            log.warning("event=evidence_unreadable run=%s attempt=%s action=probe_later", entry.run_id,
                        entry.attempt_id)
            self.unprobed.add(entry.attempt_id)

    def _ask_undecided(self) -> None:
        for attempt_id in sorted(self.undecided):
            entry = self.journal.get(attempt_id)
            if entry is None or entry.state not in IN_FLIGHT or attempt_id in self.slots:
                self.undecided.discard(attempt_id)
            elif not self.journal.owed(about=attempt_id):
                self.owed.attest(entry.run_id, attempt_id, ev.LAUNCH_UNKNOWN, lease=entry.lease)

    def _adopt_running(self, entry: JournalEntry, identity: Any) -> None:
        """A launcher that survived a restart: watched again (for timeout and cancel), re-attested."""
        boot_id = self.boot_id()
        try:
            pidfd = os.pidfd_open(identity.pid)
        except ProcessLookupError:  # ended since the probe: its receipt decides
            self.consume(Consume(entry.run_id, entry.attempt_id))
            return
        if probe(identity, current_boot_id=boot_id) is not Liveness.RUNNING:
            os.close(pidfd)  # ended, or the pid was recycled, between the probe and the open
            self.consume(Consume(entry.run_id, entry.attempt_id))
            return
        local = Local(run_id=entry.run_id, attempt_id=entry.attempt_id, identity=identity, pidfd=pidfd,
                      deadline_ms=entry.local_deadline_ms)
        self.slots.hold(local)
        self.bridge.watch(pidfd, entry.attempt_id, self.me)
        log.info("event=adopted run=%s attempt=%s pid=%d", entry.run_id, entry.attempt_id, identity.pid)
        self.current.policy.adopted(local, entry.lease)  # a worker's: re-bound to this session

    # -- attempts held when a new session opens ---------------------------------------------------

    def reattest_held(self, welcome: m.Welcome) -> None:
        """A session other than their lease's: re-attest each held survivor, give back the rest."""
        current = (welcome.session_id, welcome.session_generation)
        for local in self.slots:
            lease = self._lease_of(local)
            if lease is not None and (lease.session_id, lease.session_generation) == current:
                continue  # a resumed session: its lease goes on
            if local.identity is None:  # accepted, not launched: its Activate is the old session's
                self.journal.clear(local.attempt_id)
                self.slots.release(local.attempt_id)
                self.owed.give_back(local.run_id, local.attempt_id, lease)
                continue
            log.info("event=reattest_running run=%s attempt=%s session=%s", local.run_id, local.attempt_id,
                     welcome.session_id)
            self.attest_running(local, lease)

    def _lease_of(self, local: Any) -> LeaseFacts | None:
        if local.lease is not None:
            return local.lease
        entry = self.journal.get(local.attempt_id)
        return None if entry is None else entry.lease

    def attest_running(self, local: Any, lease: LeaseFacts | None) -> None:
        """`running` from the current session quoting `lease`, with a fresh slot for the re-bound one
        (journalled with the owed Attest before it is sent). Never while a `running` attestation
        about it is owed already: that one is sent again (after a restart too) and its answer decides."""
        s = self.current.welcome
        if s is None or self._running_owed(local.attempt_id):
            return
        slot = (new_id(), secrets.token_urlsafe(32))
        self.owed.attest(local.run_id, local.attempt_id, ev.RUNNING, lease=lease, slot=slot, identity=local.identity)

    def _running_owed(self, attempt_id: str) -> list[m.Attest]:
        """The `running` attestations about the attempt still owed, oldest first: the journal's, so a
        restarted instance knows each re-bind's slot as the one that sent it did."""
        owed = (decoded(r) for r in self.journal.owed(about=attempt_id) if r.kind == m.Attest.KIND)
        return [a for a in owed if a.fact == ev.RUNNING]

    # -- the answers ------------------------------------------------------------------------------

    def on_attested(self, msg: m.Attested, _peer: bytes) -> None:
        report = self.owed.answered(msg.answer_to)
        if report is None:  # a second answer to an attestation settled already, or a stray one
            log.info("event=answer_ignored of=attest attempt=%s fact=%s result=%s (not the answer waited for)",
                     msg.attempt_id, msg.fact, msg.result)
            return
        if msg.fact != ev.RUNNING:
            self._fact_answered(report, msg)
            return
        sent: m.Attest = decoded(report)
        local = self.slots.get(msg.attempt_id)
        if msg.result == Result.APPLIED:
            self._rebound(local, sent, msg, report.request_id)
            return
        self.owed.settle(report)
        if local is None:  # ended meanwhile (its receipt decides), or not adopted yet (its probe will)
            return
        if self._running_owed(msg.attempt_id):  # the answer to an earlier attestation: a later one decides
            log.info("event=attest_superseded_by_later attempt=%s result=%s detail=%s", msg.attempt_id,
                     msg.result, msg.detail)
            return
        quoted = _quoted(sent)
        if msg.result == Result.SUPERSEDED:
            if local.identity is not None and local.stop_phase is None:
                log.warning("event=superseded_process_stopped attempt=%s detail=%s", msg.attempt_id, msg.detail)
                self.begin_stop(local, Result.SUPERSEDED)
        elif msg.result == Result.FENCED and session_fence(msg.detail):
            s = self.current.welcome
            if s is not None and (s.session_id, s.session_generation) != (sent.session_id, sent.session_generation):
                # Sent from a session that has ended since: attested again from the current one.
                log.warning("event=rebind_fenced_by_session attempt=%s detail=%s action=reattest",
                            msg.attempt_id, msg.detail)
                self.attest_running(local, local.lease or quoted)
            else:
                # Its session is still current here: its next heartbeat finds it ended, and the
                # Welcome after the re-register attests again. Its renewals stay held.
                log.warning("event=rebind_fenced_by_session attempt=%s detail=%s action=reattest_next_session",
                            msg.attempt_id, msg.detail)
        elif local.lease is not None and local.lease != quoted:
            # A newer lease was learnt since (an earlier attestation re-bound it): quote that one.
            log.warning("event=rebind_retried attempt=%s detail=%s", msg.attempt_id, msg.detail)
            self.attest_running(local, local.lease)
        elif self.journal.owed(about=msg.attempt_id):
            # Another report about it is owed (a Started, a give-back): its answer may still keep
            # the process; nothing is stopped on this one.
            log.warning("event=rebind_refused_report_owed attempt=%s result=%s detail=%s", msg.attempt_id,
                        msg.result, msg.detail)
        elif local.identity is not None and local.stop_phase is None:
            # The quoted lease is not this worker's any more and nothing can renew it: a survivor
            # running with no lease would be unknown to everyone. Stopped by its exact identity;
            # its receipt (or its absence, attested) reports it.
            log.error("event=rebind_refused_process_stopped attempt=%s result=%s detail=%s", msg.attempt_id,
                      msg.result, msg.detail)
            self.begin_stop(local, "rebind_" + msg.result)

    def _fact_answered(self, report: Any, msg: m.Attested) -> None:
        """The answer to an attestation of a not-running fact: settled, or re-made from the current
        session when its own session had ended. Once the control side has the end of an attempt
        this worker holds no process for (`ended` or `stopped` recorded; any fact `superseded`: the
        attempt is over or replaced), its journal row is finished (the ReceiptConsumer's), not
        left in flight for good (a cluster worker's: edge judges by its own rows)."""
        if msg.result == Result.FENCED and session_fence(msg.detail):
            self.owed.fenced_by_session(report, msg)
            return
        self.owed.settle(report)
        if msg.result != Result.APPLIED:
            log.warning("event=attest_%s attempt=%s fact=%s detail=%s", msg.result, msg.attempt_id, msg.fact,
                        msg.detail)
        if msg.fact == ev.LAUNCH_UNKNOWN and msg.result == Result.APPLIED:
            self.undecided.add(msg.attempt_id)  # waits for an operator: asked again now and then
        else:
            self.undecided.discard(msg.attempt_id)
        end_known = msg.result == Result.SUPERSEDED or (msg.result == Result.APPLIED and msg.fact in ENDS)
        if end_known and msg.attempt_id not in self.slots and not self.current.policy.judged_by_own_records:
            self.consume(Consume(msg.run_id, msg.attempt_id, recheck=True, end_known=True))

    def _rebound(self, local: Local | None, sent: m.Attest, msg: m.Attested, request_id: str) -> None:
        """`applied`: the lease the attestation's own slot names, journalled as the attempt's in the
        transaction that settles it — also while the survivor is not held here (its /proc was
        unreadable at the last probe: the adoption that follows quotes this lease)."""
        slot = sent.new_slot
        if slot is None or msg.offer_id != slot.offer_id or msg.lease_generation is None:
            log.error("event=rebind_of_unknown_slot attempt=%s offer=%s", msg.attempt_id, msg.offer_id)
            self.owed.settle(self.journal.owes(request_id))
            return
        try:
            self.journal.rebind(msg.attempt_id, msg.lease_generation, slot.offer_id, slot.lease_token,
                                sent.session_id, sent.session_generation, settle=request_id)
        except Conflict:  # no row any more: the attempt ended and was cleared meanwhile
            self.owed.settle(self.journal.owes(request_id))
            return
        self.owed.forget(request_id)
        log.info("event=rebound attempt=%s lease_generation=%s session=%s", msg.attempt_id,
                 msg.lease_generation, sent.session_id)
        if local is None:
            return
        local.lease = LeaseFacts(slot.offer_id, msg.lease_generation, slot.lease_token, sent.session_id,
                                 sent.session_generation)
        if self._running_owed(msg.attempt_id):
            return  # a later attestation decides (quoting an older lease, it is attested again)
        if self.current.welcome is not None and not self.current.holds(local.lease):
            # Re-bound to a session that has ended since: attest again from the current one.
            self.attest_running(local, local.lease)


def _quoted(sent: m.Attest) -> LeaseFacts | None:
    """The lease an Attest quoted, as the journal keeps one."""
    lease = sent.lease
    if lease is None or sent.lease_session_id is None or sent.lease_session_generation is None:
        return None
    return LeaseFacts(lease.offer_id, lease.lease_generation, lease.lease_token, sent.lease_session_id,
                      sent.lease_session_generation)
