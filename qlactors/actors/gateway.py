"""The Gateway: the control side's face to executors — sessions, offers, fenced reports, completions,
log chunks and attestations, each answered; and the stops and nudges for one worker.

Both profiles use it: on edge the one executor is in this process (its session lives as long as
the process); on a cluster every worker connects over CurveZMQ and every decision is the
database's (SEMANTICS.md §9). Which of the two is the `Sessions` policy in the context
(`actors/session_policy.py`); everything else is one code path.

The worker id of a cluster message is the authenticated one (`Inbound.worker_id`, from the
frame's User-Id through the allow-list); the bridge refuses a message naming another worker.
"""

from __future__ import annotations

import logging
from typing import Any

from ..domain.receipt import Receipt, ReceiptError, token_hash
from ..faults import crash_point, drop_point
from ..wire import messages as m
from ..wire.bridge import Inbound
from ..wire.offers import BATCH_BUDGET_BYTES, check_offer, offers_message
from .base import RuntimeActor
from .signals import AttemptEnded, Redeliver, Tick, ToWorkers, WakeAt

log = logging.getLogger("qlactors.gateway")


def fence_of(report: Any, worker_id: str):
    """The store's Fence for a fenced wire report (only the lease token's hash is compared)."""
    from ..store.records import Fence

    return Fence(worker_id=worker_id, session_id=report.session_id,
                 session_generation=report.session_generation, run_id=report.run_id,
                 attempt_id=report.attempt_id, offer_id=report.offer_id,
                 lease_generation=report.lease_generation,
                 lease_token_hash=token_hash(report.lease_token), lease_version=report.lease_version)


class Gateway(RuntimeActor):
    name = "gateway"
    uses_outbox = True

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.sessions = ctx.sessions
        self.peers: dict[str, bytes] = {}  # worker id -> its ROUTER identity, as last heard
        self.worker_id = ""  # the sender of the message being handled (authenticated on a cluster)

    def handlers(self):
        return {
            m.Register: self.on_register, m.Heartbeat: self.on_heartbeat, m.Pull: self.on_pull,
            m.Activate: self.on_activate, m.Started: self.on_started, m.StartFailed: self.on_start_failed,
            m.Decline: self.on_decline, m.Completed: self.on_completed, m.LogChunk: self.on_log_chunk,
            m.Attest: self.on_attest, ToWorkers: self.on_to_workers,
        }

    def on_receive(self, message: Any) -> Any:
        inner = message.message if isinstance(message, Redeliver) else message
        inbound = inner if isinstance(inner, Inbound) else None
        if inbound is not None:
            # On a cluster the bridge has refused a message naming another worker than its key's.
            self.worker_id = (inbound.worker_id if inbound.worker_id is not None
                              else getattr(inbound.message, "worker_id", ""))
        # A well-formed frame whose values the store or domain refuses (an id too long, pid 0, a
        # negative count) is the peer's fault: answer `refused`, never let it stop the runtime.
        try:
            return super().on_receive(message)
        except ValueError as err:  # BadInput, and the domain's value errors (a non-ASCII token...)
            if inbound is None:
                raise
            report = inbound.message
            log.warning("event=report_refused kind=%s error=%s", report.KIND, err)
            self._ack(inbound.peer, report.KIND, report, "refused", str(err))
            return None

    def _ack(self, peer: bytes, of: str, msg: Any, result: str, detail: str = "") -> None:
        self.out.to_peer(peer, m.Ack(of=of, run_id=getattr(msg, "run_id", ""),
                                     attempt_id=getattr(msg, "attempt_id", ""),
                                     offer_id=getattr(msg, "offer_id", ""), result=result,
                                     detail=(detail or "")[:500]))

    # -- sessions -----------------------------------------------------------------------------

    def on_register(self, msg: m.Register, peer: bytes) -> None:
        answer = self.sessions.register(msg, self.worker_id)
        if isinstance(answer, str):
            log.warning("event=register_refused worker=%s reason=%s", self.worker_id, answer)
            self._ack(peer, "register", msg, "refused", answer)
            return
        self.peers[answer.worker_id] = peer
        log.info("event=session_open worker=%s session=%s generation=%d resumed=%s", answer.worker_id,
                 answer.session_id, answer.session_generation, answer.resumed)
        self.out.to_peer(peer, answer)

    def on_heartbeat(self, msg: m.Heartbeat, peer: bytes) -> None:
        answer, stops = self.sessions.heartbeat(msg, self.worker_id)
        if not answer.session_ended:
            self.peers[self.worker_id] = peer
        if answer.renewed and drop_point("gateway_drop_heartbeat_ack"):
            log.warning("event=fault_heartbeat_ack_dropped seq=%d renewed=%d", msg.seq, len(answer.renewed))
        else:
            self.out.to_peer(peer, answer)
        for order in stops:  # a stop committed by another replica reaches the worker here too
            self._send_stop(peer, order)

    # -- offers and fenced reports ---------------------------------------------------------------

    def on_pull(self, msg: m.Pull, peer: bytes) -> None:
        from ..store.records import Fenced

        views = []
        # Nothing is offered before startup recovery is done, during shutdown, beyond the pairs
        # the executor sent, or (edge) while the logs' file system is below the reserve.
        if self.ctx.admitting.is_set() and msg.offers and self.sessions.may_offer():
            try:
                views = self.ctx.dispatch.offer_batch(
                    self.worker_id, msg.session_id, msg.session_generation,
                    [(slot.offer_id, token_hash(slot.lease_token)) for slot in msg.offers],
                    log_cap_bytes=self.ctx.config.runtime.log_cap_bytes,
                    lease_ttl_ms=self.sessions.run_lease_ms,
                    check=check_offer,  # an offer the wire cannot carry ends OFFER_UNENCODABLE
                    size=check_offer, budget_bytes=BATCH_BUDGET_BYTES)
            except Fenced as err:
                self._ack(peer, "pull", msg, "fenced", str(err))
                return
        self.peers[self.worker_id] = peer
        if views and drop_point("gateway_drop_offers"):
            log.warning("event=fault_offers_dropped pull=%s offers=%d", msg.pull_id, len(views))
            return
        self.out.to_peer(peer, offers_message(_SessionName(self.worker_id, msg), msg.pull_id, views))

    def on_activate(self, msg: m.Activate, peer: bytes) -> None:
        result = self.ctx.dispatch.activate(fence_of(msg, self.worker_id), msg.callback_token_hash,
                                            msg.log_artifact_id)
        if result.result == "applied":
            self.out.to_peer(peer, m.Activated(run_id=msg.run_id, attempt_id=msg.attempt_id,
                                               offer_id=msg.offer_id, lease_version=result.lease_version,
                                               deadline_at_ms=result.deadline_at_ms))
            if result.deadline_at_ms is not None:
                self.ctx.directory.tell("supervisor", WakeAt(result.deadline_at_ms))
        else:
            self._ack(peer, "activate", msg, result.result, result.detail)

    def on_started(self, msg: m.Started, peer: bytes) -> None:
        outcome = self.ctx.dispatch.started(fence_of(msg, self.worker_id), msg.boot_id, msg.pid, msg.pgid,
                                            msg.start_ticks)
        self._ack(peer, "started", msg, outcome.result, outcome.detail)

    def on_start_failed(self, msg: m.StartFailed, peer: bytes) -> None:
        outcome = self.ctx.dispatch.start_failed(fence_of(msg, self.worker_id), msg.reason)
        self._ack(peer, "start_failed", msg, outcome.result, outcome.detail)

    def on_decline(self, msg: m.Decline, peer: bytes) -> None:
        outcome = self.ctx.dispatch.decline(fence_of(msg, self.worker_id))
        self._ack(peer, "decline", msg, outcome.result, outcome.detail)
        if outcome.result == "applied":
            log.info("event=offer_declined run=%s attempt=%s reason=%s", msg.run_id, msg.attempt_id,
                     msg.reason[:80])
            self.ctx.directory.tell("scheduler", Tick("decline"))  # offered again at once

    # -- completions, logs, attestations ----------------------------------------------------------

    def on_completed(self, msg: m.Completed, peer: bytes) -> None:
        try:
            receipt = Receipt(schema_version=msg.schema_version, run_id=msg.run_id, attempt_id=msg.attempt_id,
                              callback_sequence=msg.callback_sequence, token=msg.token,
                              started_at_ms=msg.started_at_ms, finished_at_ms=msg.finished_at_ms,
                              exit_code=msg.exit_code, output_open=msg.output_open)
        except ReceiptError as err:
            self._ack(peer, "completed", msg, "refused", f"invalid receipt: {err.reason}")
            return
        crash_point("before_completion_commit")
        outcome = self.ctx.completion.complete(
            msg.run_id, msg.attempt_id, receipt, msg.log_dropped_bytes, msg.stopped_by,
            **self.sessions.completion_facts(self.worker_id, msg))
        self._ack(peer, "completed", msg, outcome.result, outcome.reason or "")
        if outcome.result in ("applied", "already_terminal") and self.ctx.admitting.is_set():
            self.out.to_peer(peer, m.Nudge())  # its slot is free in the database now: pull again

    def on_log_chunk(self, msg: m.LogChunk, peer: bytes) -> None:
        self.out.to_peer(peer, self.sessions.log_chunk(msg, self.worker_id))

    def on_attest(self, msg: m.Attest, peer: bytes) -> None:
        answer = self.sessions.attest(msg, self.worker_id)
        if answer.result == "applied" and msg.fact not in ("running", "launch_unknown"):
            # Evidence for recovery, which judges it on its next page (now: a cycle is asked for).
            self.ctx.directory.tell("recovery", AttemptEnded(msg.run_id, msg.attempt_id))
            self.ctx.directory.tell("scheduler", Tick("attest"))
        self.out.to_peer(peer, answer)

    # -- to workers ---------------------------------------------------------------------------

    def on_to_workers(self, msg: ToWorkers, _peer: bytes) -> None:
        """After a cycle: the stop orders it committed, and a nudge when queued work waits."""
        for order in msg.stops:
            peer = self.peers.get(self.sessions.worker_of(order))
            if peer is not None:  # else: its worker hears it with its next heartbeat's answer
                self._send_stop(peer, order)
        if msg.nudge and self.ctx.admitting.is_set():
            for peer in self.peers.values():
                self.out.to_peer(peer, m.Nudge())

    def _send_stop(self, peer: bytes, order: Any) -> None:
        self.out.to_peer(peer, m.StopRequested(run_id=order.run_id, attempt_id=order.attempt_id,
                                               reason=order.reason, grace_ms=order.grace_ms))


class _SessionName:
    """The session an Offers answer names: the one the Pull quoted (the store checked it)."""

    __slots__ = ("worker_id", "session_id", "generation")

    def __init__(self, worker_id: str, pull: m.Pull) -> None:
        self.worker_id, self.session_id, self.generation = worker_id, pull.session_id, pull.session_generation
