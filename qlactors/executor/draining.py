"""Executor side: the drain at SIGTERM (SEMANTICS.md §9 Drain): it stops pulling (the profile clears
`admitting`), tells its replica the session is `draining`, declines every offer it accepted but
never launched (and those answering a Pull sent before), keeps its running jobs
running (the journal keeps them for the restart, which resumes or re-attests them), and once
every decline is answered tells the replica it is `offline`. The profile waits for that answer
for a bounded time only: an unreachable replica never holds the shutdown, the session then
simply expires.

A decline answered `applied` (released, offered again) or `fenced` (the lease is not this
worker's any more) forgets the offer; `refused` means the attempt was activated meanwhile (never
launched here: a drain does not launch): it is given back (`never_launched`), and its journal
row stays `accepted`, so a restart gives it back again if that attestation was lost.

What a decline's answer does to its attempt (forgotten, or given back) is the attempt machine's
(executor/attempt.py: DRAIN, DECLINE_APPLIED, DECLINE_REFUSED); this part keeps the drain's own
state: the Leave, the declines waited for, the answer to the Pull pending at SIGTERM.

A part the Executor holds (executor/executor.py), given the journal, the current session and the
owed reports.
"""

from __future__ import annotations

import logging
from typing import Any

from ..domain.results import Result
from ..ids import new_id
from ..runtime.signals import DrainSession
from ..wire import messages as m
from .journal.journal import Journal
from .owed_reports import OwedReports
from .session_policy import CurrentSession

log = logging.getLogger("qlactors.executor")

DECLINE_REASON = "draining"
_LEAVE = "leave"  # what a drain waits for besides its declines (attempt ids)


class Draining:
    """The SIGTERM drain of an Executor (see the module docstring)."""

    def __init__(self, *, journal: Journal, current: CurrentSession, owed: OwedReports) -> None:
        self.journal, self.current, self.owed = journal, current, owed
        self.done: Any = None  # the DrainSession's event while a drain runs
        self.phase: str | None = None  # the Leave status last sent
        self.waits: set[str] = set()  # attempt ids with a Decline unanswered, and `_LEAVE`

    def active(self) -> bool:
        """Whether a drain runs (SIGTERM came): nothing is accepted or launched any more."""
        return self.done is not None

    def begin(self, msg: DrainSession) -> bool:
        """SIGTERM: tell the replica the session is `draining`; False (and the drain is done at once)
        on edge (the session lives with the process), with no session to leave, or when one runs
        already. The Executor then declines every offer accepted and never launched (`expect`)."""
        s = self.current.welcome
        if not self.current.policy.drains or s is None or self.done is not None:
            if s is None:
                msg.no_session.set()
            msg.done.set()
            return False
        self.done = msg.done
        self.waits = {_LEAVE}
        self._leave("draining")
        return True

    def expect(self, attempt_id: str) -> None:
        """A Decline of the drain owed for `attempt_id`: waited for before the session goes offline."""
        self.waits.add(attempt_id)

    def begun(self, *, running: int) -> None:
        # A Pull waiting for its answer: its offers are declined when they come, which is before
        # the answer to this Leave (a replica answers a worker's requests in order); an answer
        # lost on the way is not waited for (those leases expire, and recovery offers them again).
        log.info("event=drain_begun session=%s declining=%d running=%d", self.current.welcome.session_id,
                 len(self.waits) - 1, running)

    def _leave(self, status: str) -> None:
        s = self.current.welcome
        if s is None:  # ended meanwhile (superseded, revoked): nothing left to leave
            self.done.set()
            return
        self.phase = status
        self.owed.owe(m.Leave(request_id=new_id(), worker_id=self.current.worker_id, session_id=s.session_id,
                          session_generation=s.session_generation, status=status))

    def _send_decline(self, offer: m.Offer, lease_token: str, session_id: str, generation: int) -> None:
        self.owed.decline(offer, lease_token, session_id, generation, DECLINE_REASON)

    def decline_drained_offers(self, msg: m.Offers, pairs: dict[str, str]) -> None:
        """The answer to the Pull pending when the drain began (its `pairs`): every offer in it
        declined (the Executor drops the Pull)."""
        for offer in msg.offers:
            token = pairs.get(offer.offer_id)
            if token is not None:
                self.waits.add(offer.attempt_id)
                self._send_decline(offer, token, msg.session_id, msg.session_generation)
        self.journal.clear_pull(msg.pull_id)

    def answer(self, msg: m.Ack, report: Any) -> bool:
        """Settle the answer to a drain's Leave or Decline (the owed `report` it answers); False for
        any other Ack. A Decline's attempt is the machine's (DECLINE_APPLIED, DECLINE_REFUSED), then
        `declined`."""
        if self.done is None:
            return False
        if msg.of == "leave":
            self.owed.settle(report)
            if msg.result != Result.APPLIED:
                log.warning("event=leave_%s status=%s detail=%s", msg.result, self.phase, msg.detail)
            if self.phase == "offline":
                log.info("event=session_left result=%s", msg.result)
                self.done.set()
            else:
                self.waits.discard(_LEAVE)
                self._maybe_offline()
            return True
        if msg.of != "decline" or msg.attempt_id not in self.waits:
            return False
        self.owed.settle(report)
        self.waits.discard(msg.attempt_id)
        return True

    def declined(self, msg: m.Ack) -> None:
        """A drain's Decline answered and its attempt decided: offline once nothing is waited for."""
        log.info("event=offer_declined_drain attempt=%s result=%s detail=%s", msg.attempt_id, msg.result,
                 msg.detail or "-")
        self._maybe_offline()

    def _maybe_offline(self) -> None:
        if self.phase == "draining" and not self.waits:
            self._leave("offline")
