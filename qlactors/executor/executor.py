"""Executor side: the Executor actor — pulls offers for free slots, journals, activates, spawns the
launcher, stops by identity, through the parts it holds.

It talks to the control side only through wire messages (inproc on edge, tcp on a worker), and
keeps its own journal so that after a restart it can re-adopt launchers that are still running.
The Executor is the one pykka actor; its handlers delegate to its parts, each given what it uses:
`slots` (the live table), `current` (the session spoken from, and its policy: local on edge,
remote on a worker — executor/session_policy.py), `owed` (reports kept until answered),
`registration`, `pulling`, `launching` (accept, activate, launch, stop), `adoption`, `session`
(heartbeats) and `drain`.
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
from .adoption import Adoption, quoted
from .attempt import AttemptPhase, Decision, Effect, Event, EventKind, decide
from .context import ExecutorContext
from .draining import Draining
from .effects import Effects, Subject
from .journal.records import JournalEntry
from .launching import Launching
from .owed_reports import OwedReports, decoded, session_fence
from .pulling import Pulling
from .registration import Registration
from .session_policy import CurrentSession, LocalSession, RemoteSession
from .session_reports import SessionReports
from .slots import Local, Slots

log = logging.getLogger("qlactors.executor")

CONSUME_RETRY_S = 0.1  # a ReceiptConsumer restart takes milliseconds


class Executor(RuntimeActor):
    ctx: ExecutorContext
    name = "executor"
    uses_outbox = True

    def __init__(self, ctx: ExecutorContext) -> None:
        super().__init__(ctx)
        self._build_parts(ctx)
        self.remote = RemoteSession(
            journal=ctx.journal, boot_id=ctx.boot_id, logs=ctx.logs, tell=ctx.directory.tell,
            schedule_heartbeat=self.session.schedule_heartbeat, decline_unknown=self.session.decline_unknown,
            give_back=self.owed.give_back, decline=self.owed.decline, answered_pair=self.pulling.answered_pair)

    def _build_parts(self, ctx: ExecutorContext) -> None:
        """The parts, each given what it uses (the outbox exists only from `on_start`: `_send`)."""
        me, send, journal, bridge = self.me, self._send, ctx.journal, ctx.bridge
        self.slots = Slots(ctx.config.runtime.slots)
        # Edge: the local session's id. A cluster worker learns its id in Welcome (its key's).
        worker_id = ctx.session.worker_id if ctx.session is not None else ""
        self.current = CurrentSession(worker_id, LocalSession(give_back=lambda *a: self.owed.give_back(*a)))
        self.owed = OwedReports(journal=journal, bridge=bridge, me=me, current=self.current, slots=self.slots,
                                send=send)
        self.registration = Registration(
            journal=journal, bridge=bridge, me=me, current=self.current, owed=self.owed, send=send,
            fatal=ctx.fatal, public_key=ctx.public_key, boot_id=ctx.boot_id, capacity=self.slots.capacity,
            labels=list(getattr(ctx, "labels", ())))
        self.pulling = Pulling(current=self.current, slots=self.slots, send=send, admitting=ctx.admitting,
                               disk_reserve=ctx.disk_reserve)
        self.drain = Draining(journal=journal, current=self.current, slots=self.slots, pulling=self.pulling,
                              owed=self.owed)
        self.launching = Launching(
            config=ctx.config, journal=journal, receipts=ctx.receipts, logs=ctx.logs,
            local_receipts=ctx.local_receipts, boot_id=ctx.boot_id, launcher_shell=ctx.launcher_shell,
            bridge=bridge, me=me, current=self.current, slots=self.slots, owed=self.owed, send=send,
            pull=self.pulling.pull, draining=self.drain.active)
        self.adoption = Adoption(
            journal=journal, local_receipts=ctx.local_receipts, boot_id=ctx.boot_id,
            publish_grace_ms=ctx.config.runtime.publish_grace_ms, bridge=bridge, me=me, current=self.current,
            slots=self.slots, owed=self.owed)
        self.session = SessionReports(
            journal=journal, bridge=bridge, me=me, current=self.current, slots=self.slots, send=send,
            pulling=self.pulling, owed=self.owed, send_activate=self.launching.send_activate,
            draining=self.drain.active, register=self.registration.register)
        self.effects = Effects(journal=journal, slots=self.slots, launching=self.launching, adoption=self.adoption,
                               owed=self.owed, consume=lambda msg: self.on_consume(msg, b""))

    def _send(self, message: Any) -> None:
        self.out.to_control(message)

    def handlers(self):
        return {
            m.Welcome: self.on_welcome, m.Nudge: self.on_nudge, m.Offers: self.on_offers,
            m.Activated: self.launching.on_activated, m.Ack: self.on_ack, m.Attested: self.on_attested,
            m.HeartbeatAck: self.on_heartbeat_ack, m.StopRequested: self.on_stop_requested,
            ProcessExited: self.on_exited, StopCheck: self.on_stop_check,
            NoReceipt: self.on_no_receipt, Consume: self.on_consume, HeartbeatDue: self.on_heartbeat_due,
            DrainSession: self.drain.on_drain_session, OwedDue: self.owed.on_owed_due,
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
        self.current.policy.opened(msg)  # a cluster session: kept for a resume, heartbeats on
        self.ctx.directory.tell("receipts", SessionOpen(msg.worker_id, msg.session_id, msg.session_generation))
        self.current.policy.welcomed(msg)
        if self.current.policy.rebinds:  # held attempts first: adoption attests the rows it adopts
            self._reattest_held(msg)
        for found in self.adoption.adopt():
            self._probed(found)
        self.owed.resend(welcomed_at)  # what was owed before: the old session's come back fenced, re-made
        self.pulling.pull()

    def on_nudge(self, _msg: m.Nudge, _peer: bytes) -> None:
        self.pulling.pull()

    def on_offers(self, msg: m.Offers, _peer: bytes) -> None:
        if not self.pulling.waits_for(msg):
            self._decline_unexpected(msg)
            return
        if self.drain.active():  # SIGTERM since this Pull was sent: nothing is accepted
            self.drain.decline_drained_offers(msg)
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
            self.launching.accept(offer, token, msg)
        # Only once every offer is journalled: a handler that meets an unavailable database is
        # handled again (base.py), and its retry must still find this Pull waiting.
        self.pulling.answered(msg)
        if len(msg.offers) == len(pairs):
            self.pulling.pull()  # every slot asked for was filled: there may be more work
        # Fewer offers than pairs: nothing more to offer now; a Nudge brings the next pull.

    def _decline_unexpected(self, msg: m.Offers) -> None:
        """Offers for a Pull this executor no longer waits for (a copy's answer, a late one): any
        it does not hold is declined at once (SEMANTICS.md §9 Pull once), with the pair its Pull
        journalled; one whose pair is unknown here is left to expire (its token cannot be quoted).
        Edge (leases live with the process, nothing expires): given back, judged by its records."""
        for offer in msg.offers:
            held = self.slots.get(offer.attempt_id)
            if held is not None and held.holds_offer(offer):
                continue  # the same offer again: held
            if held is not None:
                continue  # another offer of an attempt held here: its own lease decides
            self.current.policy.unexpected_offer(offer, msg)

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
            self.launching.activate_answered(msg)
            return
        report = self.owed.answered(msg.answer_to)
        if report is None:
            if msg.result not in SETTLED:
                log.info("event=answer_ignored of=%s attempt=%s result=%s detail=%s (not the answer waited for)",
                         msg.of, msg.attempt_id, msg.result, msg.detail)
            return
        if self.drain.ack(msg, report):
            return
        if msg.result == Result.FENCED and session_fence(msg.detail):
            self.owed.fenced_by_session(report, msg)
            return
        self.owed.settle(report)
        if msg.result in SETTLED:
            return
        log.warning("event=report_%s of=%s attempt=%s detail=%s", msg.result, msg.of, msg.attempt_id, msg.detail)
        local = self.slots.get(msg.attempt_id)
        if msg.of == "started" and local is not None:
            # Not accepted under the lease it ran under: stopped by its exact identity while it is
            # still that lease here (about an older lease, or while a re-bind is owed: nothing).
            self.feed(local, Event(EventKind.STARTED_REFUSED, same_lease=self.launching.holds_lease_of(local, report)),
                      reason=Result.REFUSED)

    # -- end ----------------------------------------------------------------------------------

    def on_exited(self, msg: ProcessExited, _peer: bytes) -> None:
        local = self.slots.release(msg.key)
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
        stopped_by = local.sent or "exit"  # "term" or "kill" when the job's group got our signal
        self.on_consume(Consume(local.run_id, local.attempt_id, stopped_by=stopped_by), b"")
        # No pull here: the attempt holds its slot in the database until its end is committed,
        # and the Supervisor nudges us then (a pull now would only be answered Idle).

    def on_consume(self, msg: Consume, _peer: bytes) -> None:
        """Hand an ended launcher to the ReceiptConsumer; while it is being restarted (no live
        instance) again a moment later: never dropped, this executor has forgotten the attempt."""
        if not self.ctx.directory.tell("receipts", msg):
            log.warning("event=consume_deferred attempt=%s in_s=%.2f", msg.attempt_id, CONSUME_RETRY_S)
            self.ctx.bridge.call_at(f"consume:{msg.attempt_id}", time.monotonic() + CONSUME_RETRY_S,
                                    self.me, msg)

    def on_no_receipt(self, msg: NoReceipt, _peer: bytes) -> None:
        self.owed.attest_not_running(msg.run_id, msg.attempt_id, msg.stopped_by)

    # -- the attempt machine ------------------------------------------------------------------

    def feed(self, local: Local, event: Event, *, rebinding: bool | None = None, **cause: Any) -> Decision:
        """What `event` does to a held attempt: the machine decides (executor/attempt.py), the
        effects are carried out (executor/effects.py). `rebinding`: whether a `running` Attest
        about it is owed, when the caller knows (else the journal's)."""
        if rebinding is None:
            rebinding = local.identity is not None and bool(self.adoption.running_owed(local.attempt_id))
        phase = local.phase(rebinding=rebinding)
        return self._carry_out(phase, event, Subject(local.run_id, local.attempt_id, local=local, **cause))

    def feed_row(self, entry: JournalEntry, phase: AttemptPhase, event: Event, **cause: Any) -> None:
        """The same, for a journal row this instance does not hold."""
        self._carry_out(phase, event, Subject(entry.run_id, entry.attempt_id, entry=entry, lease=entry.lease, **cause))

    def _carry_out(self, phase: AttemptPhase, event: Event, subject: Subject) -> Decision:
        decision = decide(phase, event)
        if decision.effects:
            log.info("event=attempt_%s attempt=%s phase=%s next=%s effects=%s", event.kind.value, subject.attempt_id,
                     phase.value, decision.phase.value, ",".join(x.value for x in decision.effects))
        elif decision.ignored:
            log.debug("event=attempt_%s_ignored attempt=%s phase=%s why=%s", event.kind.value, subject.attempt_id,
                      phase.value, decision.ignored)
        self.effects.carry_out(decision, subject)
        return decision

    def _probed(self, found: ev.Evidence) -> None:
        entry = found.entry
        event = Event(EventKind.PROBED, fact=found.fact, own_records=self.current.policy.judged_by_own_records,
                      running_owed=bool(self.adoption.running_owed(entry.attempt_id)))
        self.feed_row(entry, AttemptPhase.UNPROBED, event, fact=found.fact, identity=found.identity)

    def _reattest_held(self, welcome: m.Welcome) -> None:
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
            self.feed(local, Event(EventKind.NEW_SESSION, running_owed=bool(self.adoption.running_owed(local.attempt_id))),
                      lease=lease)

    def on_stop_requested(self, msg: m.StopRequested, _peer: bytes) -> None:
        local = self.slots.get(msg.attempt_id)
        if local is not None:
            self.feed(local, Event(EventKind.STOP_REQUESTED), reason=msg.reason, grace_ms=msg.grace_ms)

    def on_stop_check(self, msg: StopCheck, _peer: bytes) -> None:
        local = self.slots.get(msg.attempt_id)
        if local is None or local.identity is None:
            return
        if msg.phase == "term":
            self.feed(local, Event(EventKind.TERM_ELAPSED))
        else:
            log.error("event=stop_inconclusive attempt=%s", local.attempt_id)
            self.feed(local, Event(EventKind.KILL_ELAPSED))

    def on_heartbeat_due(self, _msg: HeartbeatDue, _peer: bytes) -> None:
        past_deadline = self.session.beat()
        if past_deadline is None:
            return
        for found in self.adoption.reprobe():
            self._probed(found)
        for entry in self.adoption.undecided_due():
            self.feed_row(entry, AttemptPhase.UNDECIDED, Event(
                EventKind.ASK_AGAIN, report_owed=bool(self.ctx.journal.owed(about=entry.attempt_id))))
        for local in past_deadline:
            self.feed(local, Event(EventKind.DEADLINE_PASSED), reason="timeout", cut_off_s=self.session.cut_off_s())

    def on_heartbeat_ack(self, msg: m.HeartbeatAck, _peer: bytes) -> None:
        fenced = self.session.answered(msg)
        if fenced is None:
            return
        for local in fenced:
            self.feed(local, Event(EventKind.LEASE_FENCED), reason=Result.FENCED)
        # A replica nudges the workers it talks to when work waits; a run another replica (or a
        # command) created reaches this worker by this pull at the latest.
        self.pulling.pull()

    def on_attested(self, msg: m.Attested, _peer: bytes) -> None:
        report = self.owed.answered(msg.answer_to)
        if report is None:  # a second answer to an attestation settled already, or a stray one
            log.info("event=answer_ignored of=attest attempt=%s fact=%s result=%s (not the answer waited for)",
                     msg.attempt_id, msg.fact, msg.result)
            return
        if msg.fact != ev.RUNNING:
            if self.adoption.fact_answered(report, msg):
                self._carry_out(AttemptPhase.EXITED, Event(EventKind.END_KNOWN),
                                Subject(msg.run_id, msg.attempt_id, end_known=True))
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
        decision = self.feed(local, event, rebinding=True, sent=sent, answer=msg, lease=quoted(sent),
                             reason=msg.result if msg.result == Result.SUPERSEDED else "rebind_" + msg.result)
        if msg.result != Result.APPLIED:
            _log_refused_rebind(msg, event, decision)


def _log_refused_rebind(msg: m.Attested, event: Event, decision: Decision) -> None:
    """What a refused `running` attestation came to, in the words of the worker's log."""
    if event.running_owed:
        what, level = "attest_superseded_by_later", logging.INFO  # the answer to an earlier one: a later one decides
    elif decision.stop_cause == "superseded":
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
