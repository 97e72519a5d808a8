"""Executor side: carrying out the effects the attempt machine (executor/attempt.py) decides, in
order, for one attempt — held (`Local`) or a journal row not held (after a restart, or while its
/proc was unreadable).

Each effect is one call on the part that owns what it changes: the journal, the live table, the
processes (launching.py: signals), the owed reports, adoption (a survivor watched again, a
`running` Attest with its fresh slot, a re-bind), or the ReceiptConsumer (`consume`). An effect
that finds the world changed since the decision (a survivor gone before its pidfd opened, a row
cleared before its re-bind) ends the list there: what follows it was about the world it expected.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..clock import wall_ms
from ..runtime.signals import Consume
from . import evidence as ev
from .adoption import Adoption
from .attempt import Decision, Effect
from .journal.journal import Journal
from .journal.records import JournalEntry, LeaseFacts
from .launching import Launching
from .owed_reports import OwedReports
from .slots import Local, Slots

log = logging.getLogger("qlactors.executor")

X = Effect


@dataclass
class Subject:
    """The attempt an effect is for, and what the event that decided it brought."""

    run_id: str
    attempt_id: str
    local: Local | None = None  # held here
    lease: LeaseFacts | None = None  # the lease to quote (a row's, or the one a re-attestation names)
    reason: str = ""  # why a stop was asked for (logged with it)
    grace_ms: int | None = None  # a StopRequested's grace
    entry: JournalEntry | None = None  # a journal row not held
    identity: Any = None  # a probed survivor's identity
    fact: str = ""  # the probe's fact
    sent: Any = None  # the Attest an answer is about
    answer: Any = None  # the answer
    end_known: bool = False  # the control side has the attempt's end
    cut_off_s: float = 0.0  # a local deadline's: how long no replica was heard


class Effects:
    """The effects of one Executor (see the module docstring)."""

    def __init__(self, *, journal: Journal, slots: Slots, launching: Launching, adoption: Adoption,
                 owed: OwedReports, consume: Callable[[Consume], None]) -> None:
        self.journal, self.slots, self.launching, self.adoption = journal, slots, launching, adoption
        self.owed, self.consume = owed, consume

    def carry_out(self, decision: Decision, subject: Subject) -> None:
        for effect in decision.effects:
            if not self._one(effect, decision, subject):
                return

    def _one(self, x: Effect, decision: Decision, s: Subject) -> bool:
        local = s.local
        if x is X.SIGNAL_TERM:
            if s.grace_ms is not None:
                local.grace_ms = s.grace_ms
            self.launching.begin_stop(local, s.reason or decision.stop_cause)
        elif x is X.SIGNAL_KILL:
            self.launching.kill(local)
        elif x is X.JOURNAL_TIMEOUT_INTENT:
            self.journal.timeout_intent(s.attempt_id, wall_ms())
            log.warning("event=local_timeout run=%s attempt=%s deadline_ms=%d cut_off_s=%.1f", s.run_id,
                        s.attempt_id, local.deadline_ms, s.cut_off_s)
        elif x is X.OWE_ATTEST_RUNNING:
            self.adoption.attest_running(local, local.lease or s.lease)  # a re-bound lease first
        elif x is X.JOURNAL_REBIND:
            return self.adoption.rebind(local, s.sent, s.answer)
        elif x is X.JOURNAL_CLEAR:
            self.journal.clear(s.attempt_id)
        elif x is X.RELEASE_SLOT:
            self.slots.release(s.attempt_id)
        elif x is X.OWE_GIVE_BACK:
            self.owed.give_back(s.run_id, s.attempt_id, s.lease)
        elif x is X.ADOPT:
            s.local = self.adoption.adopt_running(s.entry, s.identity)
            if s.local is None:  # ended since the probe: its receipt decides
                self.consume(Consume(s.run_id, s.attempt_id))
                return False
        elif x is X.CONSUME:
            self.consume(Consume(s.run_id, s.attempt_id, recheck=s.fact != ev.UNREADABLE, end_known=s.end_known))
        elif x is X.OWE_ATTEST_LAUNCH_UNKNOWN:
            log.warning("event=launch_unknown run=%s attempt=%s", s.run_id, s.attempt_id)
            self.owed.attest(s.run_id, s.attempt_id, ev.LAUNCH_UNKNOWN, lease=s.lease)
        elif x is X.PROBE_LATER:  # unreadable /proc is not evidence (§10): no fact now, a later probe
            log.warning("event=evidence_unreadable run=%s attempt=%s action=probe_later", s.run_id, s.attempt_id)
            self.adoption.unprobed.add(s.attempt_id)
        else:
            raise NotImplementedError(f"effect {x.value} is carried out by its handler, not here yet")
        return True
