"""Executor side: the Executor actor — pulls offers for free slots and takes every event about an
attempt to the attempt machine (executor/attempt.py: a pure `decide`; executor/machine.py carries
out its effects): accept, activate, launch, stop by identity, re-attest, adopt after a restart.

It talks to the control side only through wire messages (inproc on edge, tcp on a worker), and
keeps its own journal so that after a restart it can re-adopt launchers that are still running.
The Executor is the one pykka actor; a handler reads what the machine needs to know from its parts
(the event's facts), feeds it, and handles what is not about one attempt (the session, the Pull,
the Register, the drain's Leave) through them: `slots` (the live table), `current` (the session
spoken from, and its policy: local on edge, remote on a worker — executor/session_policy.py),
`owed` (reports kept until answered), `registration`, `pulling`, `launching` (the process side),
`adoption` (probes, re-attestation), `session` (heartbeats) and `drain`.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from ..domain.results import SETTLED, Result
from ..runtime.actor import RuntimeActor
from ..runtime.signals import (Consume, DrainSession, HeartbeatDue, NoReceipt, OwedDue, RegisterDue,
                               SessionOpen, StopCheck)
from ..wire import messages as m
from ..wire.bridge import Inbound, ProcessExited
from ..wire.curve import REFUSED_KEY
from . import evidence as ev
from .adoption import Adoption, log_refused_rebind, quoted
from .attempt import LIVE, AttemptPhase, Effect, Event, EventKind
from .context import ExecutorContext
from .draining import DECLINE_REASON, Draining
from .launching import Launching
from .machine import Machine, Subject
from .owed_reports import OwedReports, decoded, session_fence
from .pulling import Pulling
from .registration import Registration
from .session_policy import CurrentSession, RemoteSession
from .session_reports import SessionReports
from .slots import Slots

log = logging.getLogger("qlactors.executor")

E = EventKind


class Executor(RuntimeActor):
    ctx: ExecutorContext
    name = "executor"
    uses_outbox = True

    def __init__(self, ctx: ExecutorContext) -> None:
        super().__init__(ctx)
        self._build_parts(ctx)
        self.remote = RemoteSession(journal=ctx.journal, boot_id=ctx.boot_id, logs=ctx.logs, tell=ctx.directory.tell)

    def _build_parts(self, ctx: ExecutorContext) -> None:
        """The parts, each given what it uses (the outbox exists only from `on_start`: `_send`)."""
        me, send, journal, bridge = self.me, self._send, ctx.journal, ctx.bridge
        self.slots = Slots(ctx.config.runtime.slots)
        # Edge: the local session's id. A cluster worker learns its id in Welcome (its key's).
        worker_id = ctx.session.worker_id if ctx.session is not None else ""
        self.current = CurrentSession(worker_id)
        self.owed = OwedReports(journal=journal, bridge=bridge, me=me, current=self.current, slots=self.slots,
                                send=send)
        self.registration = Registration(
            journal=journal, bridge=bridge, me=me, current=self.current, owed=self.owed, send=send,
            fatal=ctx.fatal, public_key=ctx.public_key, boot_id=ctx.boot_id, capacity=self.slots.capacity,
            labels=list(getattr(ctx, "labels", ())))
        self.pulling = Pulling(current=self.current, slots=self.slots, send=send, admitting=ctx.admitting,
                               disk_reserve=ctx.disk_reserve)
        self.drain = Draining(journal=journal, current=self.current, owed=self.owed)
        self.launching = Launching(
            config=ctx.config, journal=journal, receipts=ctx.receipts, logs=ctx.logs,
            local_receipts=ctx.local_receipts, boot_id=ctx.boot_id, launcher_shell=ctx.launcher_shell,
            bridge=bridge, me=me, current=self.current, owed=self.owed, send=send)
        self.adoption = Adoption(
            journal=journal, local_receipts=ctx.local_receipts, boot_id=ctx.boot_id,
            publish_grace_ms=ctx.config.runtime.publish_grace_ms, bridge=bridge, me=me, current=self.current,
            slots=self.slots, owed=self.owed)
        self.session = SessionReports(journal=journal, bridge=bridge, me=me, current=self.current, slots=self.slots,
                                      send=send, owed=self.owed)
        self.machine = Machine(journal=journal, slots=self.slots, launching=self.launching, adoption=self.adoption,
                               owed=self.owed, pulling=self.pulling, directory=ctx.directory, bridge=bridge, me=me)

    def _send(self, message: Any) -> None:
        self.out.to_control(message)

    def handlers(self):
        return {
            m.Welcome: self.on_welcome, m.Nudge: self.on_nudge, m.Offers: self.on_offers,
            m.Activated: self.on_activated, m.Ack: self.on_ack, m.Attested: self.on_attested,
            m.HeartbeatAck: self.on_heartbeat_ack, m.StopRequested: self.on_stop_requested,
            ProcessExited: self.on_exited, StopCheck: self.on_stop_check,
            NoReceipt: self.on_no_receipt, Consume: self.on_consume, HeartbeatDue: self.on_heartbeat_due,
            DrainSession: self.on_drain_session, OwedDue: self.owed.on_owed_due,
            RegisterDue: self.registration.on_register_due,
        }

    def on_receive(self, message: Any) -> Any:
        # An answer (it names a request) shows a replica is reachable; a Nudge, a StopRequested or
        # the refusal of a frame it could not read does not (SEMANTICS.md §9 Exchange, §7 cut-off).
        if isinstance(message, Inbound) and getattr(message.message, "answer_to", ""):
            self.session.answered_at = time.monotonic()
        return super().on_receive(message)

    def started(self) -> None:
        self.registration.start()

    def _close(self) -> None:
        for local in self.slots:
            if local.pidfd >= 0:
                self.ctx.bridge.unwatch(local.pidfd)
                os.close(local.pidfd)
                local.pidfd = -1
        super()._close()

    # -- session and offers -------------------------------------------------------------------

    def on_welcome(self, msg: m.Welcome, _peer: bytes) -> None:
        if not self.registration.welcomed(msg):
            return  # the answer to an earlier Register (a session since replaced), or a copy's
        welcomed_at = time.monotonic()
        self.current.open(msg, self.remote)
        self.session.numbered_from(msg.heartbeat_seq)
        policy = self.current.policy
        policy.opened(msg)  # a cluster session: kept for a resume
        if policy.heartbeats:
            self.session.schedule_heartbeat()
        self.ctx.directory.tell("receipts", SessionOpen(msg.worker_id, msg.session_id, msg.session_generation))
        if policy.rebinds:  # unknown leases declined; held attempts first: adoption attests the rows it adopts
            self.pulling.learn(self.session.decline_unknown(msg, pull_pending=self.pulling.pending is not None))
            self._new_session(msg)
        for found in self.adoption.adopt():  # every row not held: its probe decides
            self._probed(found)
        self.owed.resend(welcomed_at)  # what was owed before: the old session's come back fenced, re-made
        self.pulling.pull()

    def _new_session(self, welcome: m.Welcome) -> None:
        """A session other than their lease's: each held attempt's NEW_SESSION (a survivor is
        attested `running` quoting its lease, an accepted one never launched is given back)."""
        current = (welcome.session_id, welcome.session_generation)
        for local in self.slots:
            lease = self.adoption.lease_of(local)
            if lease is not None and (lease.session_id, lease.session_generation) == current:
                continue  # a resumed session: its lease goes on
            if local.identity is not None:
                log.info("event=reattest_running run=%s attempt=%s session=%s", local.run_id, local.attempt_id,
                         welcome.session_id)
            running_owed = bool(self.adoption.running_owed(local.attempt_id))
            self.machine.feed(local, Event(E.NEW_SESSION, running_owed=running_owed), lease=lease)

    def _probed(self, found: ev.Evidence) -> None:
        entry = found.entry
        event = Event(E.PROBED, fact=found.fact, own_records=self.current.policy.judged_by_own_records,
                      running_owed=bool(self.adoption.running_owed(entry.attempt_id)))
        self.machine.feed_row(entry, AttemptPhase.UNPROBED, event, identity=found.identity,
                              recheck=found.fact != ev.UNREADABLE)

    def on_nudge(self, _msg: m.Nudge, _peer: bytes) -> None:
        self.pulling.pull()

    def on_offers(self, msg: m.Offers, _peer: bytes) -> None:
        if not self.pulling.waits_for(msg):
            self._offers_not_waited(msg)
            return
        if self.drain.active():  # SIGTERM since this Pull was sent: nothing is accepted
            self.drain.decline_drained_offers(msg, self.pulling.pairs())
            self.pulling.drop()
            return
        pairs = self.pulling.pairs()
        for offer in msg.offers:
            token = pairs.get(offer.offer_id)
            if token is None:
                log.error("event=offer_of_no_pair offer=%s attempt=%s", offer.offer_id, offer.attempt_id)
                continue
            held = self.slots.get(offer.attempt_id)
            if held is not None and held.holds_offer(offer):
                continue  # accepted before the database failed on a later offer: this is its retry
            if held is not None and held.identity is not None:  # launched here: never twice
                log.error("event=offer_of_a_launched_attempt attempt=%s", offer.attempt_id)
                continue
            self.machine.feed(self.launching.offered(offer, token, msg), Event(E.ACCEPT))
        # Only once every offer is journalled: a handler that meets an unavailable database is
        # handled again (base.py), and its retry must still find this Pull waiting.
        self.pulling.answered(msg)
        if len(msg.offers) == len(pairs):
            self.pulling.pull()  # every slot asked for was filled: there may be more work
        # Fewer offers than pairs: nothing more to offer now; a Nudge brings the next pull.

    def _offers_not_waited(self, msg: m.Offers) -> None:
        """Offers for a Pull this executor no longer waits for (a copy's answer, a late one): any
        it does not hold is declined at once (SEMANTICS.md §9 Pull once) with the pair its Pull
        journalled; one whose pair is unknown here is left to expire (its token cannot be quoted).
        Edge (leases live with the process, nothing expires): given back, judged by its records."""
        own_records = self.current.policy.judged_by_own_records
        for offer in msg.offers:
            if offer.attempt_id in self.slots:
                continue  # the same offer again, or another offer of an attempt held here: its own lease decides
            token = self.pulling.answered_pair(offer.offer_id)
            log.warning("event=offer_unexpected offer=%s attempt=%s action=%s", offer.offer_id, offer.attempt_id,
                        "give_back" if own_records else "decline" if token else "expire")
            # Edge's give-back quotes no lease (it never held one); a worker's Decline quotes the pair.
            self.machine.feed(self.launching.offered(offer, None if own_records else token, msg),
                              Event(E.OFFER_NOT_WAITED, pair_known=token is not None, own_records=own_records),
                              reason="not_waited_for", decline=(offer, token, msg.session_id, msg.session_generation))

    def on_activated(self, msg: m.Activated, _peer: bytes) -> None:
        local = self.slots.get(msg.attempt_id)
        if not self.launching.answers_activate(local, msg):
            return  # not ours (an instance that died asked for it), or the answer to an earlier offer
        local.activate_sent_at = None  # answered
        self.machine.feed(local, Event(E.ACTIVATED, draining=self.drain.active()), lease_version=msg.lease_version)

    def _activate_answered(self, msg: m.Ack) -> None:
        if msg.result in SETTLED:
            return
        local = self.slots.get(msg.attempt_id)
        if not self.launching.answers_activate(local, msg):
            log.info("event=answer_ignored of=activate attempt=%s result=%s (about another offer)",
                     msg.attempt_id, msg.result)
            return
        # Fenced or refused: never launched here; an earlier copy of this Activate may have been
        # committed, so the evidence that nothing ran is owed (`never_launched`, which recovery
        # trusts), re-made from the next session if this one has ended. A late refusal never
        # undoes a launch (SEMANTICS.md §9 Exchange): the machine ignores it once launched.
        before = local.phase
        decision = self.machine.feed(local, Event(E.ACTIVATE_REFUSED, session_open=self.current.welcome is not None,
                                                  own_records=self.current.policy.judged_by_own_records))
        if decision.phase is before and not decision.effects and before is not AttemptPhase.ACTIVATING:
            log.warning("event=answer_ignored of=activate attempt=%s result=%s detail=%s (already %s)",
                        msg.attempt_id, msg.result, msg.detail, "launched" if before in LIVE else before.value)
            return
        log.warning("event=report_%s of=activate attempt=%s detail=%s", msg.result, msg.attempt_id, msg.detail)
        local.activate_sent_at = None

    # -- answers --------------------------------------------------------------------------------

    def on_ack(self, msg: m.Ack, _peer: bytes) -> None:
        """An Ack acts only as the first answer to the request it names (SEMANTICS.md §9 Exchange):
        an owed report still owed, or the Activate of the offer held now, not yet launched. Any
        other Ack (a copy's second answer, a late one about an older lease) is logged, ignored."""
        if msg.of == "unknown":  # the refusal of a frame the control side could not read
            if msg.detail == REFUSED_KEY:
                self.registration.key_refused(msg.detail)
            else:
                log.warning("event=frame_refused_by_control detail=%s", msg.detail)
            return
        if msg.of == "register":
            if msg.answer_to == self.registration.request:
                self.registration.refused(msg)
            return
        if msg.of == "activate":
            self._activate_answered(msg)
            return
        report = self.owed.answered(msg.answer_to)
        if report is None:
            if msg.result not in SETTLED:
                log.info("event=answer_ignored of=%s attempt=%s result=%s detail=%s (not the answer waited for)",
                         msg.of, msg.attempt_id, msg.result, msg.detail)
            return
        if self.drain.answer(msg, report):
            if msg.of == "decline":
                local = self.slots.get(msg.attempt_id)
                if local is not None:
                    self.machine.feed(local, Event(E.DECLINE_REFUSED if msg.result == Result.REFUSED
                                                   else E.DECLINE_APPLIED))
                self.drain.declined(msg)
            return
        if msg.result == Result.FENCED and session_fence(msg.detail):
            self.owed.fenced_by_session(report, msg)
            return
        self.owed.settle(report)
        local = self.slots.get(msg.attempt_id)
        if msg.of != "started" or local is None:
            if msg.result not in SETTLED:
                log.warning("event=report_%s of=%s attempt=%s detail=%s", msg.result, msg.of, msg.attempt_id,
                            msg.detail)
            return
        if msg.result in SETTLED:
            self.machine.feed(local, Event(E.STARTED_APPLIED))
            return
        log.warning("event=report_%s of=started attempt=%s detail=%s", msg.result, msg.attempt_id, msg.detail)
        # Not accepted under the lease it ran under: stopped by its exact identity while it is
        # still that lease here (about an older lease, or while a re-bind is owed: nothing).
        self.machine.feed(local, Event(E.STARTED_REFUSED, same_lease=self.launching.holds_lease_of(local, report)),
                          reason=Result.REFUSED)

    def on_attested(self, msg: m.Attested, _peer: bytes) -> None:
        report = self.owed.answered(msg.answer_to)
        if report is None:  # a second answer to an attestation settled already, or a stray one
            log.info("event=answer_ignored of=attest attempt=%s fact=%s result=%s (not the answer waited for)",
                     msg.attempt_id, msg.fact, msg.result)
            return
        if msg.fact != ev.RUNNING:
            if self.adoption.fact_answered(report, msg):
                self.machine.run(AttemptPhase.EXITED, Event(E.END_KNOWN),
                                 Subject(msg.run_id, msg.attempt_id, recheck=True, end_known=True))
            return
        sent: m.Attest = decoded(report)
        local = self.slots.get(msg.attempt_id)
        if msg.result == Result.APPLIED and not self.adoption.slot_of(sent, msg):
            self.owed.settle(report)
            return
        if msg.result != Result.APPLIED:
            self.owed.settle(report)
        if local is None:  # not held: a re-bind is journalled all the same (its adoption quotes it)
            if msg.result == Result.APPLIED:
                self.adoption.rebind(None, sent, msg)
            return  # ended meanwhile (its receipt decides), or not adopted yet (its probe will)
        event = self.adoption.answer_event(local, sent, msg)
        decision = self.machine.feed(local, event, sent=sent, answer=msg, lease=quoted(sent),
                                     reason=msg.result if msg.result == Result.SUPERSEDED else "rebind_" + msg.result)
        if msg.result != Result.APPLIED:
            log_refused_rebind(msg, event, decision)

    # -- heartbeats, stops, the drain -------------------------------------------------------------

    def on_heartbeat_due(self, _msg: HeartbeatDue, _peer: bytes) -> None:
        beat = self.session.beat()
        if beat is None:
            return
        self.pulling.repeat(self.current.welcome.heartbeat_ms)
        draining = self.drain.active()
        for local in beat.activates_due:
            self.machine.feed(local, Event(E.ACTIVATE_DUE, draining=draining))
        for found in self.adoption.reprobe():
            self._probed(found)
        for entry in self.adoption.undecided_due():
            self.machine.feed_row(entry, AttemptPhase.UNDECIDED,
                                  Event(E.ASK_AGAIN, report_owed=bool(self.ctx.journal.owed(about=entry.attempt_id))))
        for local in beat.past_deadline:
            self.machine.feed(local, Event(E.DEADLINE_PASSED), reason="timeout", cut_off_s=self.session.cut_off_s())

    def on_heartbeat_ack(self, msg: m.HeartbeatAck, _peer: bytes) -> None:
        answer = self.session.answered(msg, draining=self.drain.active())
        if answer is None:
            return
        if answer.session_ended:
            self.pulling.forget()  # its pairs were the old session's; a late answer is declined with them
            # Naming the lost session (refused, it falls back to a new one) tells the control side
            # that this process lived on while another took its session: a duplicate key (§9).
            self.registration.register(resume=True)
            return
        for local in answer.fenced:
            self.machine.feed(local, Event(E.LEASE_FENCED), reason=Result.FENCED)
        # A replica nudges the workers it talks to when work waits; a run another replica (or a
        # command) created reaches this worker by this pull at the latest.
        self.pulling.pull()

    def on_stop_requested(self, msg: m.StopRequested, _peer: bytes) -> None:
        local = self.slots.get(msg.attempt_id)
        if local is not None:
            self.machine.feed(local, Event(E.STOP_REQUESTED), reason=msg.reason, grace_ms=msg.grace_ms)

    def on_stop_check(self, msg: StopCheck, _peer: bytes) -> None:
        local = self.slots.get(msg.attempt_id)
        if local is None:
            return
        if msg.phase != "term":
            log.error("event=stop_inconclusive attempt=%s", local.attempt_id)
        self.machine.feed(local, Event(E.TERM_ELAPSED if msg.phase == "term" else E.KILL_ELAPSED))

    def on_drain_session(self, msg: DrainSession, _peer: bytes) -> None:
        if not self.drain.begin(msg):
            return
        for local in self.slots:  # accepted, never launched: declined; running jobs keep running
            decision = self.machine.feed(local, Event(E.DRAIN), reason=DECLINE_REASON, decline=(
                local.offer, local.lease_token, local.session_id, local.session_generation))
            if Effect.OWE_DECLINE in decision.effects:
                self.drain.expect(local.attempt_id)
        self.drain.begun(running=sum(local.identity is not None for local in self.slots))

    # -- end ----------------------------------------------------------------------------------

    def on_exited(self, msg: ProcessExited, _peer: bytes) -> None:
        local = self.slots.get(msg.key)
        if local is None:
            return
        self.ctx.bridge.cancel_timer(f"stop:{local.attempt_id}")
        try:  # reap only our own launcher (a re-adopted one may still be our child), never waitpid(-1)
            os.waitpid(local.identity.pid, os.WNOHANG)
        except ChildProcessError:
            pass
        if local.pidfd >= 0:
            os.close(local.pidfd)
            local.pidfd = -1
        self.ctx.local_receipts.remove_fifo(local.attempt_id)
        # "term" or "kill" when the job's group got our signal. No pull here: the attempt holds its
        # slot in the database until its end is committed, and the Supervisor nudges us then.
        self.machine.feed(local, Event(E.EXITED), stopped_by=local.sent or "exit")

    def on_consume(self, msg: Consume, _peer: bytes) -> None:
        self.machine.consume(msg)  # a deferred one, again

    def on_no_receipt(self, msg: NoReceipt, _peer: bytes) -> None:
        self.owed.attest_not_running(msg.run_id, msg.attempt_id, msg.stopped_by)
