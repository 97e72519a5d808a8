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

A part the Executor holds (executor/executor.py), given the current session, the live table, the
Pull and the owed reports.
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
from .pulling import Pulling
from .session_policy import CurrentSession
from .slots import Slots

log = logging.getLogger("qlactors.executor")

DECLINE_REASON = "draining"
_LEAVE = "leave"  # what a drain waits for besides its declines (attempt ids)


class Draining:
    """The SIGTERM drain of an Executor (see the module docstring)."""

    def __init__(self, *, journal: Journal, current: CurrentSession, slots: Slots, pulling: Pulling,
                 owed: OwedReports) -> None:
        self.journal, self.current, self.slots, self.pulling, self.owed = journal, current, slots, pulling, owed
        self.done: Any = None  # the DrainSession's event while a drain runs
        self.phase: str | None = None  # the Leave status last sent
        self.waits: set[str] = set()  # attempt ids with a Decline unanswered, and `_LEAVE`

    def active(self) -> bool:
        """Whether a drain runs (SIGTERM came): nothing is accepted or launched any more."""
        return self.done is not None

    def on_drain_session(self, msg: DrainSession, _peer: bytes) -> None:
        s = self.current.welcome
        if not self.current.policy.drains or s is None or self.done is not None:
            if s is None:
                msg.no_session.set()
            msg.done.set()  # edge (the session lives with the process), or no session to leave
            return
        self.done = msg.done
        self.waits = {_LEAVE}
        self._leave("draining")
        for local in self.slots:
            if local.identity is None and local.offer is not None:  # accepted, never launched
                self.waits.add(local.attempt_id)
                self._send_decline(local.offer, local.lease_token, local.session_id, local.session_generation)
        # A Pull waiting for its answer: its offers are declined when they come, which is before
        # the answer to this Leave (a replica answers a worker's requests in order); an answer
        # lost on the way is not waited for (those leases expire, and recovery offers them again).
        log.info("event=drain_begun session=%s declining=%d running=%d", s.session_id,
                 len(self.waits) - 1, sum(l.identity is not None for l in self.slots))

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

    def decline_drained_offers(self, msg: m.Offers) -> None:
        """The answer to the Pull pending when the drain began: every offer in it declined."""
        pairs = self.pulling.pairs()
        for offer in msg.offers:
            token = pairs.get(offer.offer_id)
            if token is not None:
                self.waits.add(offer.attempt_id)
                self._send_decline(offer, token, msg.session_id, msg.session_generation)
        self.journal.clear_pull(msg.pull_id)
        self.pulling.drop()

    def ack(self, msg: m.Ack, report: Any) -> bool:
        """Handle the answer to a drain's Leave or Decline (the owed `report` it answers, settled
        here); False for any other Ack."""
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
        local: Any = self.slots.get(msg.attempt_id)
        if local is not None and local.identity is None:
            self.slots.release(msg.attempt_id)
            if msg.result == Result.REFUSED:  # activated meanwhile, never launched: given back
                self.owed.give_back(local.run_id, local.attempt_id, local.lease)
            else:  # released and offered again, or no longer this worker's
                self.journal.clear(msg.attempt_id)
        log.info("event=offer_declined_drain attempt=%s result=%s detail=%s", msg.attempt_id, msg.result,
                 msg.detail or "-")
        self._maybe_offline()
        return True

    def _maybe_offline(self) -> None:
        if self.phase == "draining" and not self.waits:
            self._leave("offline")
