"""The Executor's side of a session (SEMANTICS.md §9): numbered heartbeats carrying the renewals,
their answers (a fenced lease's process is stopped), attestations quoting the lease they are
about, and repeating a Pull whose answer went astray. (Re-attesting and re-binding survivors:
executor_adopt.py.)

A mixin of `Executor` (executor/executor.py), kept apart so each module reads on its own; it
uses the Executor's state (`session`, `live`, `pending_pull`, ...) and nothing else.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..clock import wall_ms
from ..ids import new_id
from ..runtime.signals import HeartbeatDue
from ..wire import messages as m
from .context import ExecutorContext
from .journal.records import LeaseFacts

log = logging.getLogger("qlactors.executor")

CUT_OFF_BEATS = 2  # heartbeat intervals without an answer: no replica is reachable (§7)


class SessionReports:
    """Heartbeats, attestations and Pull repeats of an Executor (see the module docstring)."""

    ctx: ExecutorContext

    def _schedule_heartbeat(self) -> None:
        self.ctx.bridge.call_at("heartbeat", time.monotonic() + self.session.heartbeat_ms / 1000, self.me,
                                HeartbeatDue())

    def on_heartbeat_due(self, _msg: HeartbeatDue, _peer: bytes) -> None:
        s = self.session
        if s is None or s.session_lease_ms is None:
            return
        # Numbered per session and increasing across restarts of this worker (a resumed session
        # keeps its stored number): the wall clock in ms, or one more than the last.
        self.heartbeat_seq = max(self.heartbeat_seq + 1, wall_ms())
        # Only the current session's leases: one still an ended session's waits for the answer to
        # its re-attestation (executor_adopt.py), which re-binds it.
        renewals = [m.LeaseRef(run_id=l.run_id, attempt_id=l.attempt_id, offer_id=l.lease.offer_id,
                               lease_generation=l.lease.lease_generation, lease_token=l.lease.lease_token)
                    for l in self.live.values() if self._held_lease(l)]
        self.out.to_control(m.Heartbeat(
            request_id=new_id(), worker_id=self.worker_id, session_id=s.session_id, session_generation=s.session_generation,
            seq=self.heartbeat_seq, free_slots=max(0, self._free()), worker_clock_ms=wall_ms(),
            renewals=renewals))
        self._repeat_pull()
        self._repeat_activates()
        self._reprobe()
        self._enforce_deadlines()
        self._schedule_heartbeat()

    def _enforce_deadlines(self) -> None:
        """Cut off from every replica (nothing heard from any for `CUT_OFF_BEATS` heartbeat
        intervals, though each heartbeat is answered), the worker enforces its jobs' deadlines
        itself (SEMANTICS.md §7): past its own deadline (activation on this clock + timeout) a
        job gets a local timeout intent in the journal, then the stop by exact identity. The
        report is its Completed, once a replica is reached again: finished after this worker's
        deadline (`finished_in_time` False), and the control side, which committed its own
        timeout intent at the database deadline whatever the worker's reach, ends the run
        `timed_out`. While a replica answers, its StopRequested stops the job."""
        if time.monotonic() - self.answered_at < CUT_OFF_BEATS * self.session.heartbeat_ms / 1000:
            return
        now = wall_ms()
        for local in self.live.values():
            if local.deadline_ms is None or now < local.deadline_ms:
                continue
            if local.identity is None or local.stop_phase is not None:
                continue
            self.ctx.journal.timeout_intent(local.attempt_id, now)
            log.warning("event=local_timeout run=%s attempt=%s deadline_ms=%d cut_off_s=%.1f", local.run_id,
                        local.attempt_id, local.deadline_ms, time.monotonic() - self.answered_at)
            self._begin_stop(local, "timeout")

    def _decline_unknown(self, welcome: m.Welcome) -> None:
        """Decline each lease Welcome lists as never activated that this instance does not hold
        (SEMANTICS.md §9 Offers): its Pull was journalled, but its Offers answer reached an
        instance that died before journalling the offer, or never arrived. Declined, it is
        released and offered again at once, instead of holding a slot until the lease expires.

        Offers this executor knows (held, or journalled as accepted) are kept for `_adopt`. The
        lease token comes from the journalled Pull; a lease with no journalled pair cannot be
        quoted (its token is unknown here) and is left to expire. Every journalled Pull is stale
        once a session opens without one pending (its answer can no longer be taken): forgotten.
        """
        if not self._cluster() or self.pending_pull is not None:
            return
        tokens: dict[str, str] = {}
        while True:
            stale = self.ctx.journal.open_pulls()
            if not stale:
                break
            for pulled in stale:
                tokens.update(pulled.pairs)
                self.ctx.journal.clear_pull(pulled.pull_id)
        self.answered_pairs.update(tokens)  # a late Offers answer to one of them: declined
        for lease in welcome.unactivated:
            if lease.attempt_id in self.live:
                continue  # held here: it goes on
            entry = self.ctx.journal.get(lease.attempt_id)
            if entry is not None and entry.lease is not None and entry.lease.offer_id == lease.offer_id:
                continue  # journalled as accepted: `_adopt` takes it from there
            token = tokens.get(lease.offer_id)
            if token is None:
                log.warning("event=unactivated_lease_unknown attempt=%s offer=%s action=expire",
                            lease.attempt_id, lease.offer_id)
                continue
            log.warning("event=unactivated_lease_declined attempt=%s offer=%s", lease.attempt_id, lease.offer_id)
            self._decline(lease, token, welcome.session_id, welcome.session_generation, "unknown_after_restart")

    def _repeat_pull(self) -> None:
        """A Pull unanswered for a heartbeat interval went astray (an answer lost on the way, a
        replica gone): send it again, the same pairs, which get the same offers and no second
        lease."""
        if self.pull_message is None or self.pending_pull is None:
            return
        if time.monotonic() - self.pull_sent_at < self.session.heartbeat_ms / 1000:
            return
        log.warning("event=pull_repeated pull=%s pairs=%d", self.pull_message.pull_id,
                    len(self.pull_message.offers))
        self.pull_sent_at = time.monotonic()
        self.out.to_control(self.pull_message)

    def _repeat_activates(self) -> None:
        """An Activate unanswered for a heartbeat interval went astray (lost on the way, or its
        replica died before it committed it): send it again, the same request, fence and token
        hash; a repeat gets the first answer, and the launch happens once, on the first
        `Activated` that comes.
        Not while draining: those offers are declined (executor_drain.py), never launched."""
        if self.drain_done is not None:
            return
        now = time.monotonic()
        for local in self.live.values():
            if local.activate_sent_at is None or local.identity is not None or local.offer is None:
                continue
            if now - local.activate_sent_at < self.session.heartbeat_ms / 1000:
                continue
            log.warning("event=activate_repeated run=%s attempt=%s", local.run_id, local.attempt_id)
            self._send_activate(local)

    def _attest(self, run_id: str, attempt_id: str, fact: str, stopped_by: str | None = None, *,
                lease: LeaseFacts | None = None, slot: tuple[str, str] | None = None,
                identity: Any = None) -> None:
        """An Attest from the current session quoting the lease it is about (SEMANTICS.md §9): the
        one given, else the one held or journalled (edge rows written before schema 6 have none)."""
        s = self.session
        if s is None:
            return
        if lease is None:
            held = self.live.get(attempt_id)
            entry = None if held is not None and held.lease is not None else self.ctx.journal.get(attempt_id)
            lease = held.lease if entry is None and held is not None else getattr(entry, "lease", None)
        i = identity
        self._owe(m.Attest(
            request_id=new_id(), worker_id=self.worker_id, session_id=s.session_id, session_generation=s.session_generation,
            run_id=run_id, attempt_id=attempt_id,
            lease=None if lease is None else m.LeaseRef(
                run_id=run_id, attempt_id=attempt_id, offer_id=lease.offer_id,
                lease_generation=lease.lease_generation, lease_token=lease.lease_token),
            lease_session_id=None if lease is None else lease.session_id,
            lease_session_generation=None if lease is None else lease.session_generation,
            fact=fact, stopped_by=stopped_by,
            new_slot=None if slot is None else m.OfferSlot(offer_id=slot[0], lease_token=slot[1]),
            boot_id=getattr(i, "boot_id", None), pid=getattr(i, "pid", None), pgid=getattr(i, "pgid", None),
            start_ticks=getattr(i, "start_ticks", None)), attempt_id)

    def on_heartbeat_ack(self, msg: m.HeartbeatAck, _peer: bytes) -> None:
        """Renewed leases go on; a fenced one's process is stopped by its exact identity (and attested
        when it has ended); an ended session means registering anew. Edge sends no heartbeat."""
        if self.session is None or msg.seq != self.heartbeat_seq:
            return  # the answer to an earlier heartbeat, or to a session already left
        if msg.session_ended:
            log.warning("event=session_ended session=%s detail=%s", self.session.session_id, msg.detail)
            if self.drain_done is not None:  # left by the drain (offline): no new session now
                self.ctx.bridge.cancel_timer("heartbeat")
                return
            self.session = None
            if self.pending_pull is not None:  # an answer to it that comes late is declined with them
                self.answered_pairs.update(self.pending_pull[1])
            self.pending_pull = self.pull_message = None  # its pairs were the old session's
            self.ctx.bridge.cancel_timer("heartbeat")
            # Naming the lost session (refused, it falls back to a new one) tells the control side
            # that this process lived on while another took its session: a duplicate key (§9).
            self._register(resume=True)
            return
        for fenced in msg.fenced:
            local = self.live.get(fenced.attempt_id)
            if local is None or local.lease is None or local.lease.lease_generation != fenced.lease_generation:
                continue
            log.warning("event=lease_fenced attempt=%s reason=%s", fenced.attempt_id, fenced.reason)
            if local.identity is not None:
                if local.stop_phase is None:
                    self._begin_stop(local, "fenced")
            else:  # not launched: never will be under this lease
                self.ctx.journal.clear(local.attempt_id)
                del self.live[local.attempt_id]
        # A replica nudges the workers it talks to when work waits; a run another replica (or a
        # command) created reaches this worker by this pull at the latest.
        self._pull()
