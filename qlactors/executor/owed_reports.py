"""Executor side: what it owes the control side (SEMANTICS.md §9 Owed reports): every report is
journalled before it is first sent and kept until its own answer; the owed reports themselves
(Attest, the give-back, Decline) are made here.

- Owed: Register (while the worker has no session: executor/registration.py), Started,
  StartFailed, Decline, every Attest and Leave. (`Completed` has its own journal: the receipt
  file, kept and re-sent by the ReceiptConsumer until answered, under one request id per
  attempt.) Activate and Pull are not owed: they are repeated on their own cadence until
  answered, and a late answer to them is judged against what the Executor holds.
- Each is re-sent unchanged (same `request_id`) at every heartbeat interval while it waits, and
  at once after every new Welcome, to whichever replica is current.
- An answer settles the report it names (`answer_to`) once: a second answer to it (a copy's, a
  replica's late one) finds nothing owed and is logged and ignored. A report answered `fenced`
  for its session when that session is no longer the current one is not lost: the same report
  (StartFailed, Decline, Attest) is re-made from the current session, quoting the same lease
  (Started: the Welcome's re-attestation already did it).

A part the Executor holds (executor/executor.py), given the journal, the outbox sender, the timers,
the current session and the live table.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any, Callable

from ..ids import new_id
from ..runtime.context import Named
from ..runtime.signals import OwedDue
from ..wire import codec
from ..wire import messages as m
from ..wire.bridge import Bridge
from .journal.journal import Journal
from .journal.records import LeaseFacts, OwedReport
from .session_policy import CurrentSession
from .slots import Slots

log = logging.getLogger("qlactors.executor")

OWED_RESEND_S = 1.0  # while no session says its heartbeat: how often owed reports go out again
SESSION_FENCES = ("unknown_session", "session_")  # details of a fence by the session reported from


def session_fence(detail: str | None) -> bool:
    """Whether a `fenced` answer is about the session the report was sent from."""
    return (detail or "").startswith(SESSION_FENCES)


class OwedReports:
    """Journal, re-send and settle what an Executor owes (see the module docstring)."""

    def __init__(self, *, journal: Journal, bridge: Bridge, me: Named, current: CurrentSession, slots: Slots,
                 send: Callable[[Any], None]) -> None:
        self.journal, self.bridge, self.me = journal, bridge, me
        self.current, self.slots, self.send = current, slots, send
        self.sent_at: dict[str, float] = {}  # request id -> when this instance last sent it (monotonic)
        self.round_at = 0.0  # when the owed timer was last set (monotonic)

    # -- owing ----------------------------------------------------------------------------------

    def owe(self, message: Any, attempt_id: str | None = None) -> None:
        """Journal `message` as owed, then send it."""
        body = codec.encode(message)[1]
        self.journal.owe(message.request_id, message.KIND, attempt_id, body)
        self.sent_at[message.request_id] = time.monotonic()
        self.send(message)
        self.schedule()

    def resend(self, due_before: float) -> None:
        """Every owed report again, unchanged, oldest first: those this instance has not sent since
        `due_before` (monotonic: the Welcome, the last round). A Register is re-sent by its own
        backoff, and a report waits while there is no session."""
        if self.current.welcome is None:
            return
        still_owed = False
        for report in self.journal.owed():
            if report.kind == m.Register.KIND:
                self.journal.settle(report.request_id)  # a session is open: this one is moot
                continue
            still_owed = True
            if self.sent_at.get(report.request_id, float("-inf")) > due_before:
                continue  # sent just now (this Welcome's re-attestations, a fresh report)
            self.sent_at[report.request_id] = time.monotonic()
            self.send(decoded(report))
        if still_owed:
            self.schedule()  # and again an interval later, until each is answered

    def schedule(self) -> None:
        if self.bridge.timer_due("owed") is None:
            s = self.current.welcome
            every = s.heartbeat_ms / 1000 if s is not None else OWED_RESEND_S
            self.round_at = time.monotonic()
            self.bridge.call_at("owed", self.round_at + every, self.me, OwedDue())

    def on_owed_due(self, _msg: OwedDue, _peer: bytes) -> None:
        """A heartbeat interval went by: what was sent before it and is still owed goes out again."""
        due_before = self.round_at
        if self.current.welcome is None:  # the Register's own backoff repeats it; the rest waits for a Welcome
            if self.journal.owed(1):
                self.schedule()
            return
        self.resend(due_before)

    def answered(self, answer_to: str) -> OwedReport | None:
        """The owed report an answer names (still owed: `settle` it once acted on); None when it
        names none (an answer to a request that is not owed, or a second answer to a settled one)."""
        return self.journal.owes(answer_to) if answer_to else None

    def settle(self, report: OwedReport | None) -> None:
        if report is not None:
            self.journal.settle(report.request_id)
            self.sent_at.pop(report.request_id, None)

    def forget(self, request_id: str) -> None:
        """A report settled in the journal by the transaction that recorded its answer's effect."""
        self.sent_at.pop(request_id, None)

    def fenced_by_session(self, report: OwedReport, answer: Any) -> None:
        """A report answered `fenced` for the session it was sent from. While that session is still
        the current one here, or no session is open, it stays owed (this worker is about to learn
        its session ended, and sends it again after the next Welcome); otherwise the same report is
        re-made from the current session (a new request quoting the same lease: the store takes a
        StartFailed, a Decline or an Attest from a later session of the same worker), owed before
        the fenced one is settled, so nothing it reported is lost and its outcome does not depend
        on which session's answer came first."""
        original = decoded(report)
        s = self.current.welcome
        if s is None or (original.session_id, original.session_generation) == (s.session_id,
                                                                              s.session_generation):
            return
        log.warning("event=report_fenced_by_session kind=%s attempt=%s detail=%s action=remade_from_current",
                    report.kind, report.attempt_id, getattr(answer, "detail", ""))
        if isinstance(original, (m.StartFailed, m.Decline, m.Attest)):
            self.owe(replace(original, request_id=new_id(), session_id=s.session_id,
                             session_generation=s.session_generation), original.attempt_id)
        # Started: the Welcome's re-attestation of the held attempt (`running`) did it already.
        # Leave: the session it drained is gone anyway.
        self.settle(report)

    # -- the owed reports made here ---------------------------------------------------------------

    def attest(self, run_id: str, attempt_id: str, fact: str, stopped_by: str | None = None, *,
               lease: LeaseFacts | None = None, slot: tuple[str, str] | None = None,
               identity: Any = None) -> None:
        """An Attest from the current session quoting the lease it is about (SEMANTICS.md §9): the
        one given, else the one held or journalled (edge rows written before schema 6 have none)."""
        s = self.current.welcome
        if s is None:
            return
        if lease is None:
            held = self.slots.get(attempt_id)
            entry = None if held is not None and held.lease is not None else self.journal.get(attempt_id)
            lease = held.lease if entry is None and held is not None else getattr(entry, "lease", None)
        i = identity
        self.owe(m.Attest(
            request_id=new_id(), worker_id=self.current.worker_id, session_id=s.session_id,
            session_generation=s.session_generation, run_id=run_id, attempt_id=attempt_id,
            lease=None if lease is None else m.LeaseRef(
                run_id=run_id, attempt_id=attempt_id, offer_id=lease.offer_id,
                lease_generation=lease.lease_generation, lease_token=lease.lease_token),
            lease_session_id=None if lease is None else lease.session_id,
            lease_session_generation=None if lease is None else lease.session_generation,
            fact=fact, stopped_by=stopped_by,
            new_slot=None if slot is None else m.OfferSlot(offer_id=slot[0], lease_token=slot[1]),
            boot_id=getattr(i, "boot_id", None), pid=getattr(i, "pid", None), pgid=getattr(i, "pgid", None),
            start_ticks=getattr(i, "start_ticks", None)), attempt_id)

    def give_back(self, run_id: str, attempt_id: str, lease: LeaseFacts | None = None) -> None:
        """Tell the control side this executor holds no process for an attempt it never launched.

        The evidence recovery needs (SEMANTICS.md §6): a `claimed` attempt has its lease released
        and is offered again; one activated but never launched ends as judged there.
        """
        log.warning("event=attempt_given_back run=%s attempt=%s", run_id, attempt_id)
        self.attest(run_id, attempt_id, "never_launched", lease=lease)

    def attest_not_running(self, run_id: str, attempt_id: str, stopped_by: str | None) -> None:
        """Conclusive evidence for recovery: this executor runs no process for the attempt
        (`stopped_by` how it ended, None when it was never launched here)."""
        fact = "never_launched" if stopped_by is None else ("ended" if stopped_by == "exit" else "stopped")
        if any(r.kind == m.Attest.KIND and decoded(r).fact == fact for r in self.journal.owed(about=attempt_id)):
            return  # said already, still owed (a restart's two looks at one ended launcher)
        self.attest(run_id, attempt_id, fact, stopped_by)

    def decline(self, lease: Any, lease_token: str, session_id: str, generation: int, reason: str) -> None:
        """An owed Decline of the lease `lease` names (an Offer, or Welcome's Unactivated)."""
        self.owe(m.Decline(
            request_id=new_id(), worker_id=self.current.worker_id, session_id=session_id,
            session_generation=generation, run_id=lease.run_id, attempt_id=lease.attempt_id,
            offer_id=lease.offer_id, lease_generation=lease.lease_generation, lease_token=lease_token,
            lease_version=getattr(lease, "lease_version", 1), reason=reason), lease.attempt_id)


def decoded(report: OwedReport) -> Any:
    return codec.decode([codec.HEADER, report.body])

