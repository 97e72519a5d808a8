"""Executor side: a session kept alive (SEMANTICS.md §9) — numbered heartbeats carrying the
renewals, their answers (a fenced lease's process is stopped, an ended session means registering
anew), the repeats a heartbeat carries (a Pull or an Activate whose answer went astray, /proc
probed again), a cut-off worker's own deadlines (§7), and the leases a Welcome lists as never
activated. (Re-attesting and re-binding survivors: adoption.py.)

A part the Executor holds (executor/executor.py), given the journal, the timers, the current
session, the live table, the Pull and the owed reports. What a heartbeat or its answer means for
an attempt (an Activate due again, a deadline passed, a lease fenced) it returns to the Executor,
which asks the attempt machine (executor/attempt.py); the Register is still passed in.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..clock import wall_ms
from ..ids import new_id
from ..runtime.context import Named
from ..runtime.signals import HeartbeatDue
from ..wire import messages as m
from ..wire.bridge import Bridge
from .journal.journal import Journal
from .owed_reports import OwedReports
from .session_policy import CurrentSession
from .slots import Local, Slots

log = logging.getLogger("qlactors.executor")

CUT_OFF_BEATS = 2  # heartbeat intervals without an answer: no replica is reachable (§7)
WAITED_MAX = 64  # heartbeats waited for at once: an answer later than that many intervals is not acted on


@dataclass(frozen=True)
class Answer:
    """What the answer to a heartbeat asks of the Executor."""

    fenced: list[Local]  # held attempts whose lease is fenced
    session_ended: bool  # register anew (the Pull's pairs were the old session's)


@dataclass(frozen=True)
class Beat:
    """What a heartbeat found due for the held attempts."""

    activates_due: list[Local]
    past_deadline: list[Local]


class SessionReports:
    """Heartbeats and their answers, of an Executor (see the module docstring)."""

    def __init__(self, *, journal: Journal, bridge: Bridge, me: Named, current: CurrentSession, slots: Slots,
                 send: Callable[[Any], None], owed: OwedReports) -> None:
        self.journal, self.bridge, self.me = journal, bridge, me
        self.current, self.slots, self.send, self.owed = current, slots, send, owed
        self.heartbeat_seq = 0
        # The heartbeats whose answer is waited for, oldest first, and the session they were sent
        # from: an answer to one of them is acted on once, and the older ones are no longer waited
        # for (SEMANTICS.md §9 Exchange). Not only the last one: when answers take longer than a
        # heartbeat interval, each answers an earlier heartbeat than the last sent, and a worker
        # waiting for the last alone would act on none (never learn its session ended).
        self.waited: list[str] = []
        self.waited_session: tuple[str, int] | None = None
        self.answered_at = time.monotonic()  # the last message from the control side (any replica)

    def schedule_heartbeat(self, *, now: bool = False) -> None:
        delay = 0.0 if now else self.current.welcome.heartbeat_ms / 1000
        self.bridge.call_at("heartbeat", time.monotonic() + delay, self.me, HeartbeatDue())

    def numbered_from(self, stored: int | None) -> None:
        """A Welcome's (protocol 5) or a stale answer's stored heartbeat number: the next one is
        higher, whatever the wall clock did since (a resumed worker whose clock stepped back)."""
        if stored is not None and stored > self.heartbeat_seq:
            self.heartbeat_seq = stored

    def beat(self) -> Beat | None:
        """A heartbeat and the Pull it repeats; what it found due for the held attempts (their
        Activate, their own deadline while cut off), for the Executor to feed the attempt machine.
        None: no heartbeat (no session, edge)."""
        s = self.current.welcome
        if s is None or not self.current.policy.heartbeats:
            return None
        # Numbered per session and increasing across restarts of this worker (a resumed session
        # keeps its stored number, which Welcome names): the wall clock in ms, or one more than
        # the last.
        self.heartbeat_seq = max(self.heartbeat_seq + 1, wall_ms())
        # Only the current session's leases: one still an ended session's waits for the answer to
        # its re-attestation (adoption.py), which re-binds it.
        renewals = [m.LeaseRef(run_id=l.run_id, attempt_id=l.attempt_id, offer_id=l.lease.offer_id,
                               lease_generation=l.lease.lease_generation, lease_token=l.lease.lease_token)
                    for l in self.slots if self.current.holds(l.lease)]
        request_id = new_id()
        self._waits_for(request_id, (s.session_id, s.session_generation))
        self.send(m.Heartbeat(
            request_id=request_id, worker_id=self.current.worker_id, session_id=s.session_id,
            session_generation=s.session_generation, seq=self.heartbeat_seq,
            free_slots=max(0, self.slots.free()), worker_clock_ms=wall_ms(),
            renewals=renewals))
        self.schedule_heartbeat()
        return Beat(activates_due=self._activates_due(), past_deadline=self._past_deadline())

    def _waits_for(self, request_id: str, session: tuple[str, int]) -> None:
        if session != self.waited_session:
            self.waited, self.waited_session = [], session  # another session's are never acted on
        self.waited = self.waited[-(WAITED_MAX - 1):] + [request_id]

    def _answers(self, answer_to: str, session: tuple[str, int]) -> bool:
        """Whether `answer_to` names a heartbeat still waited for, sent from `session`; if so it and
        every older one are no longer waited for (each is acted on once, in order)."""
        if session != self.waited_session or answer_to not in self.waited:
            return False
        self.waited = self.waited[self.waited.index(answer_to) + 1:]
        return True

    def _past_deadline(self) -> list[Local]:
        """Cut off from every replica (nothing heard from any for `CUT_OFF_BEATS` heartbeat
        intervals, though each heartbeat is answered), the worker enforces its jobs' deadlines
        itself (SEMANTICS.md §7): past its own deadline (activation on this clock + timeout) a
        job gets a local timeout intent in the journal, then the stop by exact identity. The
        report is its Completed, once a replica is reached again: finished after this worker's
        deadline (`finished_in_time` False), and the control side, which committed its own
        timeout intent at the database deadline whatever the worker's reach, ends the run
        `timed_out`. While a replica answers, its StopRequested stops the job."""
        if time.monotonic() - self.answered_at < CUT_OFF_BEATS * self.current.welcome.heartbeat_ms / 1000:
            return []
        now = wall_ms()
        return [local for local in self.slots if local.deadline_ms is not None and now >= local.deadline_ms]

    def cut_off_s(self) -> float:
        """How long nothing was heard from any replica."""
        return time.monotonic() - self.answered_at

    def decline_unknown(self, welcome: m.Welcome, *, pull_pending: bool) -> dict[str, str]:
        """Decline each lease Welcome lists as never activated that this instance does not hold
        (SEMANTICS.md §9 Offers): its Pull was journalled, but its Offers answer reached an
        instance that died before journalling the offer, or never arrived. Declined, it is
        released and offered again at once, instead of holding a slot until the lease expires.

        Offers this executor knows (held, or journalled as accepted) are kept for adoption. The
        lease token comes from the journalled Pull; a lease with no journalled pair cannot be
        quoted (its token is unknown here) and is left to expire. Every journalled Pull is stale
        once a session opens without one pending (its answer can no longer be taken): forgotten;
        their pairs are returned, with which a late Offers answer to one of them is declined.
        """
        tokens: dict[str, str] = {}
        if pull_pending:
            return tokens
        while True:
            stale = self.journal.open_pulls()
            if not stale:
                break
            for pulled in stale:
                tokens.update(pulled.pairs)
                self.journal.clear_pull(pulled.pull_id)
        for lease in welcome.unactivated:
            if lease.attempt_id in self.slots:
                continue  # held here: it goes on
            entry = self.journal.get(lease.attempt_id)
            if entry is not None and entry.lease is not None and entry.lease.offer_id == lease.offer_id:
                continue  # journalled as accepted: adoption takes it from there
            token = tokens.get(lease.offer_id)
            if token is None:
                log.warning("event=unactivated_lease_unknown attempt=%s offer=%s action=expire",
                            lease.attempt_id, lease.offer_id)
                continue
            log.warning("event=unactivated_lease_declined attempt=%s offer=%s", lease.attempt_id, lease.offer_id)
            self.owed.decline(lease, token, welcome.session_id, welcome.session_generation, "unknown_after_restart")
        return tokens

    def _activates_due(self) -> list[Local]:
        """Held attempts whose Activate was sent a heartbeat interval ago or more: one unanswered
        that long went astray (lost on the way, or its replica died before it committed it), and
        the machine sends it again while the attempt is activating (ACTIVATE_DUE: the same
        request, fence and token hash; a repeat gets the first answer, and the launch happens
        once, on the first `Activated` that comes; never while draining)."""
        now = time.monotonic()
        heartbeat_s = self.current.welcome.heartbeat_ms / 1000
        return [local for local in self.slots
                if local.activate_sent_at is not None and now - local.activate_sent_at >= heartbeat_s]

    def answered(self, msg: m.HeartbeatAck, *, draining: bool) -> Answer | None:
        """Renewed leases go on; the held attempts whose lease is fenced are returned, for the
        Executor to stop (or forget, when never launched); an ended session means registering anew.
        None: not the answer waited for, or one that asks for nothing more (no pull). Edge sends no
        heartbeat. `draining`: left by the drain (offline), no new session is registered."""
        s = self.current.welcome
        if s is None or not self._answers(msg.answer_to, (s.session_id, s.session_generation)):
            return None  # a second answer, one older than an answer acted on, or one of a session already left
        if msg.last_seq is not None:  # `stale_seq`: numbered below the session's stored number
            log.warning("event=heartbeat_stale seq=%d stored=%d action=renumber", msg.seq, msg.last_seq)
            self.numbered_from(msg.last_seq)
            self.schedule_heartbeat(now=True)  # its renewals, at once
            return None
        if msg.session_ended:
            log.warning("event=session_ended session=%s detail=%s", s.session_id, msg.detail)
            self.waited = []  # the later heartbeats' answers can only say it again
            self.bridge.cancel_timer("heartbeat")
            if draining:  # left by the drain (offline): no new session now
                return None
            self.current.end()
            return Answer(fenced=[], session_ended=True)
        fenced_locals = []
        for fenced in msg.fenced:
            local = self.slots.get(fenced.attempt_id)
            if local is None or local.lease is None or local.lease.lease_generation != fenced.lease_generation:
                continue
            log.warning("event=lease_fenced attempt=%s reason=%s", fenced.attempt_id, fenced.reason)
            fenced_locals.append(local)
        return Answer(fenced=fenced_locals, session_ended=False)
