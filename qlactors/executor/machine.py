"""Executor side: the attempt machine at work — an event about one attempt (held: a `Local`; or a
journal row not held, after a restart or while its /proc was unreadable) goes to the pure
`decide` (executor/attempt.py), the attempt takes the phase it returns, and its effects are
carried out here, in order, each by the part that owns what it changes: the journal, the live
table, the processes (launching.py), the owed reports, adoption (a survivor watched again, a
`running` Attest with its fresh slot, a re-bind), the Pull, or the ReceiptConsumer (`consume`).

An effect can bring an event of its own (the spawn: it ran, or nothing was spawned), fed at once.
An effect that finds the world changed since the decision (the journal has the attempt launched
already, a survivor gone before its pidfd opened, a row cleared before its re-bind) ends the list
there: what follows it was about the world it expected.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from ..clock import wall_ms
from ..runtime.context import Directory, Named
from ..runtime.signals import Consume
from ..wire.bridge import Bridge
from . import evidence as ev
from .adoption import Adoption
from .attempt import AttemptPhase, Decision, Effect, Event, EventKind, decide
from .journal.journal import Journal
from .journal.records import JournalEntry, LeaseFacts
from .launching import Launching
from .owed_reports import OwedReports
from .pulling import Pulling
from .slots import Local, Slots

log = logging.getLogger("qlactors.executor")

X = Effect
CONSUME_RETRY_S = 0.1  # a ReceiptConsumer restart takes milliseconds
IRREVERSIBLE = frozenset({X.SPAWN, X.SIGNAL_TERM, X.SIGNAL_KILL})


@dataclass
class Subject:
    """The attempt an event is about, and what the event brought that its effects use."""

    run_id: str
    attempt_id: str
    local: Local | None = None  # held here
    entry: JournalEntry | None = None  # a journal row not held
    lease: LeaseFacts | None = None  # the lease to quote (a row's, or the one an answer is about)
    reason: str = ""  # why a stop was asked for, or why an offer is declined (logged, sent)
    grace_ms: int | None = None  # a StopRequested's grace
    identity: Any = None  # a probed survivor's identity
    recheck: bool = False  # consume: read the receipt again (a probe waited the publish grace)
    stopped_by: str = "exit"  # consume: how the launcher ended as this executor saw it
    end_known: bool = False  # consume: the control side has the attempt's end
    sent: Any = None  # the Attest an answer is about
    answer: Any = None  # that answer
    lease_version: int | None = None  # an Activated's, quoted in Started and StartFailed
    decline: tuple[Any, str, str, int] | None = None  # (offer, lease token, session id, generation)
    cut_off_s: float = 0.0  # a local deadline's: how long no replica was heard
    failure: str = ""  # why nothing was spawned


class Machine:
    """Decide and carry out, for one Executor (see the module docstring)."""

    def __init__(self, *, journal: Journal, slots: Slots, launching: Launching, adoption: Adoption,
                 owed: OwedReports, pulling: Pulling, directory: Directory, bridge: Bridge, me: Named) -> None:
        self.journal, self.slots, self.launching, self.adoption = journal, slots, launching, adoption
        self.owed, self.pulling = owed, pulling
        self.directory, self.bridge, self.me = directory, bridge, me

    def consume(self, msg: Consume) -> None:
        """Hand an ended launcher to the ReceiptConsumer; while it is being restarted (no live
        instance) again a moment later (the Executor's `Consume` handler): never dropped, this
        executor has forgotten the attempt."""
        if not self.directory.tell("receipts", msg):
            log.warning("event=consume_deferred attempt=%s in_s=%.2f", msg.attempt_id, CONSUME_RETRY_S)
            self.bridge.call_at(f"consume:{msg.attempt_id}", time.monotonic() + CONSUME_RETRY_S, self.me, msg)

    def feed(self, local: Local, event: Event, **cause: Any) -> Decision:
        """What `event` does to a held attempt."""
        return self.run(local.phase, event, Subject(local.run_id, local.attempt_id, local=local, **cause))

    def feed_row(self, entry: JournalEntry, phase: AttemptPhase, event: Event, **cause: Any) -> Decision:
        """What `event` does to a journal row this instance does not hold (its phase: UNPROBED,
        UNDECIDED or EXITED)."""
        return self.run(phase, event, Subject(entry.run_id, entry.attempt_id, entry=entry, lease=entry.lease,
                                              **cause))

    def run(self, phase: AttemptPhase, event: Event, subject: Subject) -> Decision:
        decision = decide(phase, event)
        if log.isEnabledFor(logging.DEBUG):  # every decision, at DEBUG: a run costs no log line more
            log.debug("event=attempt_%s attempt=%s phase=%s next=%s effects=%s ignored=%s", event.kind.value,
                      subject.attempt_id, phase.value, decision.phase.value,
                      ",".join(x.value for x in decision.effects) or "-", decision.ignored or "-")
        for effect in decision.effects:
            if effect in IRREVERSIBLE:
                self._enter(subject, decision)
            follow = self._carry_out(effect, decision, subject)
            if follow is False:
                break
            if isinstance(follow, Event):
                self.run(decision.phase, follow, subject)
                return decision
        self._enter(subject, decision)
        return decision

    @staticmethod
    def _enter(subject: Subject, decision: Decision) -> None:
        """The attempt takes its new phase once its effects are carried out, or before the first
        one that cannot be undone (a spawn, a signal): a handler that fails on the way (the
        database unavailable) is handled again from the phase before, and its journal writes are
        repeatable; once the launcher runs or was signalled, never again."""
        if subject.local is not None:
            subject.local.phase = decision.phase

    def _carry_out(self, x: Effect, decision: Decision, s: Subject) -> bool | Event:
        """One effect; False ends the list, an Event is fed next (also ending it)."""
        local = s.local
        if x is X.JOURNAL_ACCEPT:
            if not self.launching.journal_accept(local):
                return False
            self.slots.hold(local)
        elif x is X.CREATE_LOG:
            self.launching.create_log(local)
        elif x is X.SEND_ACTIVATE:
            self.launching.send_activate(local)
        elif x is X.JOURNAL_LAUNCHING:
            self.launching.journal_launching(local)
        elif x is X.SPAWN:
            s.failure = self.launching.spawn(local)
            return Event(EventKind.SPAWN_FAILED if s.failure else EventKind.SPAWNED)
        elif x is X.JOURNAL_STARTED:
            self.launching.journal_started(local)
        elif x is X.WATCH:
            self.launching.watch(local)
        elif x is X.OWE_STARTED:
            self.launching.owe_started(local, s.lease_version)
        elif x is X.OWE_START_FAILED:
            self.launching.owe_start_failed(local, s.lease_version, s.failure)
        elif x is X.SIGNAL_TERM:
            if s.grace_ms is not None:
                local.grace_ms = s.grace_ms
            self.launching.begin_stop(local, s.reason or decision.stop_cause)
        elif x is X.SIGNAL_KILL:
            self.launching.kill(local)
        elif x is X.JOURNAL_TIMEOUT_INTENT:
            self.journal.timeout_intent(s.attempt_id, wall_ms())
            log.warning("event=local_timeout run=%s attempt=%s deadline_ms=%d cut_off_s=%.1f", s.run_id,
                        s.attempt_id, local.deadline_ms, s.cut_off_s)
        else:
            return self._report_or_row(x, s)
        return True

    def _report_or_row(self, x: Effect, s: Subject) -> bool:
        local = s.local
        if x is X.OWE_ATTEST_RUNNING:
            self.adoption.attest_running(local, local.lease or s.lease)  # a re-bound lease first
        elif x is X.JOURNAL_REBIND:
            return self.adoption.rebind(local, s.sent, s.answer)
        elif x is X.OWE_GIVE_BACK:
            self.owed.give_back(s.run_id, s.attempt_id, s.lease if local is None else local.lease or s.lease)
        elif x is X.OWE_DECLINE:
            offer, token, session_id, generation = s.decline
            self.owed.decline(offer, token, session_id, generation, s.reason)
        elif x is X.OWE_ATTEST_LAUNCH_UNKNOWN:
            log.warning("event=launch_unknown run=%s attempt=%s", s.run_id, s.attempt_id)
            self.owed.attest(s.run_id, s.attempt_id, ev.LAUNCH_UNKNOWN, lease=s.lease)
        elif x is X.JOURNAL_CLEAR:
            self.journal.clear(s.attempt_id)
        elif x is X.RELEASE_SLOT:
            self.slots.release(s.attempt_id)
        elif x is X.PULL:
            self.pulling.pull()
        elif x is X.ADOPT:
            s.local = self.adoption.adopt_running(s.entry, s.identity)
            if s.local is None:  # ended since the probe: its receipt decides
                self.consume(Consume(s.run_id, s.attempt_id))
                return False
        elif x is X.CONSUME:
            self.consume(Consume(s.run_id, s.attempt_id, recheck=s.recheck, stopped_by=s.stopped_by,
                                 end_known=s.end_known))
        elif x is X.PROBE_LATER:  # unreadable /proc is not evidence (§10): no fact now, a later probe
            log.warning("event=evidence_unreadable run=%s attempt=%s action=probe_later", s.run_id, s.attempt_id)
            self.adoption.unprobed.add(s.attempt_id)
        else:
            raise ValueError(f"no such effect: {x}")
        return True
