"""Control side: the Gateway, the face to executors — sessions, offers, fenced reports, completions,
log chunks and attestations, each answered; and the stops and nudges for one worker.
Size: one handler per kind a worker sends, on one code path for both profiles.

Both profiles use it: on edge the one executor is in this process (its session lives as long as
the process); on a cluster every worker connects over CurveZMQ and every decision is the
database's (SEMANTICS.md §9). Which of the two is the `Sessions` policy in the context
(`control/session_policy.py`); everything else is one code path.

The worker id of a cluster message is the authenticated one (`Inbound.worker_id`, from the
frame's User-Id through the allow-list); the bridge refuses a message naming another worker.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

from ..clock import monotonic
from ..domain.receipt import Receipt, ReceiptError, token_hash
from ..domain.results import Outcome, Result
from ..errors import PeerFault
from ..faults import crash_point, drop_point
from ..runtime.actor import RuntimeActor
from ..runtime.signals import AttemptEnded, Redeliver, Tick, ToWorkers, WakeAt
from ..store.records import Activation, Fence, Fenced
from ..store.dispatch.report_batch import Report, ReportBatch, groups
from ..store.dispatch.report_locks import LockRequest
from ..store.dispatch.request_answers import AnswerKey, PullAnswer
from ..wire import codec
from ..wire import messages as m
from ..wire.bridge import Inbound
from ..wire.offers import BATCH_BUDGET_BYTES, check_offer, offers_message
from .context import ControlContext

# The reports answered together: each arrival waits in `pending` until the Flush the first of
# them told this actor is handled, so everything that arrived while a transaction ran commits
# in the next one (a group commit, `store/dispatch/report_batch.py`).
_BATCHED = (m.Activate, m.Started, m.StartFailed, m.Decline, m.Completed, m.LogChunk)


class _Flush:
    """Apply the pending reports now (told by the Gateway to itself)."""


_FLUSH = _Flush()

log = logging.getLogger("qlactors.gateway")
_clock = monotonic  # when a peer was last heard from (a test moves it on)


def fence_of(report: Any, worker_id: str):
    """The store's Fence for a fenced wire report (only the lease token's hash is compared)."""
    return Fence(worker_id=worker_id, session_id=report.session_id,
                 session_generation=report.session_generation, run_id=report.run_id,
                 attempt_id=report.attempt_id, offer_id=report.offer_id,
                 lease_generation=report.lease_generation,
                 lease_token_hash=token_hash(report.lease_token), lease_version=report.lease_version)


class Gateway(RuntimeActor):
    ctx: ControlContext
    name = "gateway"
    uses_outbox = True

    def __init__(self, ctx: ControlContext) -> None:
        super().__init__(ctx)
        self.sessions = ctx.sessions
        self.peers: dict[str, bytes] = {}  # worker id -> its ROUTER identity, as last heard
        self.heard: dict[str, float] = {}  # worker id -> when (`_clock`) its peer was last heard
        self.peer_workers: dict[bytes, str] = {}  # the reverse of `peers`: a peer of a live session -> its worker
        self.protocols: dict[str, int] = {}  # a worker -> the version its Welcome from here agreed
        self.worker_id = ""  # the sender of the message being handled (authenticated on a cluster)
        self.pending: list[Inbound] = []  # reports waiting for the next group commit
        self.nudges: set[bytes] | None = None  # during a flush: the peers a completion freed a slot of
        self.flush_told = False
        # A cluster keeps every answer for its repeats (the answer ledger); edge has none.
        self.batch = ReportBatch(ctx.dispatch.store, ledger=self.sessions.ledger is not None)

    def handlers(self):
        return {
            m.Register: self.on_register, m.Heartbeat: self.on_heartbeat, m.Pull: self.on_pull,
            **{kind: self.on_report for kind in _BATCHED},  # alone: after a batch failed, or redelivered
            m.Attest: self.on_attest, m.Leave: self.on_leave, ToWorkers: self.on_to_workers,
        }

    def on_receive(self, message: Any) -> Any:
        if message is _FLUSH:
            self.flush_told = False
            self._flush()
            return None
        if isinstance(message, Inbound) and isinstance(message.message, _BATCHED):
            self.pending.append(message)
            if not self.flush_told:
                self.flush_told = True
                self.actor_ref.tell(_FLUSH)
            return None
        if self.pending:  # anything else waits for the reports that came before it
            self._flush()
        return self._handle_one(message)

    def _handle_one(self, message: Any) -> Any:
        inner = message.message if isinstance(message, Redeliver) else message
        inbound = inner if isinstance(inner, Inbound) else None
        if inbound is not None:
            self.worker_id = self._sender(inbound)
        # A well-formed frame whose values the store or domain refuses (an id too long, pid 0, a
        # negative count, a non-ASCII token) is the peer's fault: answer `refused`, never let it
        # stop the runtime. Anything else is a bug: the actor fails and is restarted.
        try:
            return super().on_receive(message)
        except PeerFault as err:  # BadInput, InvalidTransition, PosixTextError, token_hash's...
            if inbound is None:
                raise
            self._refuse(inbound, err)
            return None

    @staticmethod
    def _sender(inbound: Inbound) -> str:
        # On a cluster the bridge has refused a message naming another worker than its key's.
        return inbound.worker_id if inbound.worker_id is not None else getattr(inbound.message, "worker_id", "")

    def _flush(self) -> None:
        """Apply the pending reports, one transaction per group (`report_batch.groups`), then
        answer each; a group that fails is applied again report by report, each with the usual
        retries of an unavailable database (so one bad report never holds back the others).
        The Nudges its completions call for go out last, one per worker."""
        pending, self.pending = self.pending, []
        self.nudges = set()
        try:
            self._apply_pending(pending)
        finally:
            nudges, self.nudges = self.nudges, None
        for peer in nudges:  # after every answer: one Pull then asks for all the slots freed
            self._to_peer(peer, m.Nudge())

    def _apply_pending(self, pending: list[Inbound]) -> None:
        if len(pending) == 1:  # alone, as it came (a quiet runtime's every report)
            self._handle_one(pending[0])
            return
        items = []
        for inbound in pending:
            self.worker_id = self._sender(inbound)
            try:
                item = self._report_of(inbound.message, inbound.peer)
            except PeerFault as err:
                self._refuse(inbound, err)
                continue
            if item is not None:
                items.append((inbound, *item))
        for group in groups([report for _i, report, _a in items]):
            chosen = [items[i] for i in group]
            try:
                results = self.batch.apply([report for _i, report, _a in chosen])
            except Exception as err:  # noqa: BLE001 - each report alone decides what it means
                log.warning("event=report_batch_failed reports=%d error=%r", len(chosen), err)
                for inbound, _r, _a in chosen:
                    self._handle_one(inbound)
                continue
            for (inbound, _r, answer), result in zip(chosen, results):
                self.worker_id = self._sender(inbound)
                answer(result)

    def _refuse(self, inbound: Inbound, err: PeerFault) -> None:
        report = inbound.message
        log.warning("event=report_refused kind=%s error=%s", report.KIND, err)
        self._ack(inbound.peer, report.KIND, report, Result.REFUSED, str(err))

    def _ack(self, peer: bytes, of: str, msg: Any, result: Result, detail: str | None = "") -> None:
        self._to_peer(peer, m.Ack(answer_to=msg.request_id, of=of, run_id=getattr(msg, "run_id", ""),
                                     attempt_id=getattr(msg, "attempt_id", ""),
                                     offer_id=getattr(msg, "offer_id", ""), result=result.value,
                                     detail=(detail or "")[:500]))

    # -- sessions -----------------------------------------------------------------------------

    def on_register(self, msg: m.Register, peer: bytes) -> None:
        answer = self.sessions.register(msg, self.worker_id)
        if isinstance(answer, str):
            log.warning("event=register_refused worker=%s reason=%s", self.worker_id, answer)
            self._ack(peer, "register", msg, Result.REFUSED, answer)
            # Only this peer's: a second process presenting the same key (duplicate_worker) has the
            # same worker id, and refusing it must not drop the peer of the one that keeps the session.
            if self.peers.get(self.worker_id) == peer:
                self._forget(self.worker_id)
            return
        self._remember(answer.worker_id, peer)
        self.protocols[answer.worker_id] = answer.protocol
        log.info("event=session_open worker=%s session=%s generation=%d resumed=%s", answer.worker_id,
                 answer.session_id, answer.session_generation, answer.resumed)
        self._to_peer(peer, answer)

    def on_heartbeat(self, msg: m.Heartbeat, peer: bytes) -> None:
        answer, stops = self.sessions.heartbeat(msg, self.worker_id)
        if answer.session_ended:  # superseded, expired, revoked or left: nothing more to send it
            self._forget(self.worker_id)
        else:
            self._remember(self.worker_id, peer)
        if answer.renewed and drop_point("gateway_drop_heartbeat_ack"):
            log.warning("event=fault_heartbeat_ack_dropped seq=%d renewed=%d", msg.seq, len(answer.renewed))
        else:
            self._to_peer(peer, answer)
        for order in stops:  # a stop committed by another replica reaches the worker here too
            self._send_stop(peer, order)

    def on_leave(self, msg: m.Leave, peer: bytes) -> None:
        """A worker drains (SIGTERM): its session `draining` (no more offers), then `offline`."""
        outcome = self.sessions.leave(msg, self.worker_id)
        log.info("event=session_%s worker=%s session=%s generation=%d result=%s detail=%s", msg.status,
                 self.worker_id, msg.session_id, msg.session_generation, outcome.result, outcome.detail or "-")
        self._ack(peer, "leave", msg, outcome.result, outcome.detail)
        if outcome.applied and msg.status == "offline":
            self._forget(self.worker_id)

    def _remember(self, worker_id: str, peer: bytes) -> None:
        old = self.peers.get(worker_id)
        if old is not None and old != peer:
            self.peer_workers.pop(old, None)
        self.peers[worker_id] = peer
        self.peer_workers[peer] = worker_id
        self.heard[worker_id] = _clock()

    def _forget(self, worker_id: str) -> None:
        """Its session ended: no more nudges or stops to its peer (a new session is heard anew)."""
        peer = self.peers.pop(worker_id, None)
        if peer is not None:
            self.peer_workers.pop(peer, None)
        self.heard.pop(worker_id, None)
        self.protocols.pop(worker_id, None)

    def _to_peer(self, peer: bytes, message: Any) -> None:
        """Send in the worker's agreed protocol; a failed send is logged only for a live session's peer."""
        worker = self.peer_workers.get(peer, "")
        self.out.to_peer(peer, message, worker=worker, protocol=self.protocols.get(worker, codec.PROTOCOL_MIN))

    def _forget_the_silent(self) -> None:
        """A cluster peer not heard from for a whole session lease: its session has expired (or
        its worker was revoked, whose frames the bridge refuses), or it talks to another replica,
        which reaches it. Its stops reach it with a later heartbeat's answer (`Stops.pending`)."""
        lease_ms = getattr(self.sessions, "session_lease_ms", None)  # edge: its own, for good
        if lease_ms is None:
            return
        oldest = _clock() - lease_ms / 1000
        for worker_id in [w for w, at in self.heard.items() if at < oldest]:
            log.info("event=peer_forgotten worker=%s reason=silent_past_session_lease", worker_id)
            self._forget(worker_id)

    # -- offers and fenced reports ---------------------------------------------------------------

    def on_pull(self, msg: m.Pull, peer: bytes) -> None:
        views = []
        # Nothing is offered before startup recovery is done, during shutdown, while the last
        # cycle failed (authority unknown, SEMANTICS.md §10), beyond the pairs the executor
        # sent, or (edge) while the logs' file system is below the reserve.
        if (self.ctx.admitting.is_set() and self.ctx.authority.is_set() and msg.offers
                and self.sessions.may_offer()):
            try:
                views = self.ctx.dispatch.offers.batch(
                    self.worker_id, msg.session_id, msg.session_generation,
                    [(slot.offer_id, token_hash(slot.lease_token)) for slot in msg.offers],
                    log_cap_bytes=self.ctx.config.runtime.log_cap_bytes,
                    lease_ttl_ms=self.sessions.run_lease_ms,
                    check=check_offer,  # an offer the wire cannot carry ends OFFER_UNENCODABLE
                    size=check_offer, budget_bytes=BATCH_BUDGET_BYTES,
                    answer=self._answer_key(msg, PullAnswer))
            except Fenced as err:
                self._ack(peer, "pull", msg, Result.FENCED, str(err))
                return
        self._remember(self.worker_id, peer)
        if views and drop_point("gateway_drop_offers"):
            log.warning("event=fault_offers_dropped pull=%s offers=%d", msg.pull_id, len(views))
            return
        # The session an Offers answer names: the one the Pull quoted (the store checked it).
        named = SimpleNamespace(worker_id=self.worker_id, session_id=msg.session_id, generation=msg.session_generation)
        self._to_peer(peer, offers_message(named, msg, views))

    # -- reports: applied in batches (`_flush`), or alone (`on_report`) --------------------------

    def on_report(self, msg: Any, peer: bytes) -> None:
        item = self._report_of(msg, peer)
        if item is not None:
            report, answer = item
            answer(self.batch.apply([report])[0])

    def _answer_key(self, msg: Any, result_type: Any) -> AnswerKey | None:
        """The request as the answer ledger knows it; None without a ledger (edge)."""
        if self.sessions.ledger is None:
            return None
        return AnswerKey(self.worker_id, msg.request_id, msg.KIND, result_type)

    def _report_of(self, msg: Any, peer: bytes):
        """The store Report for a report message and what answers its result; None when it was
        answered already (a receipt that does not decode; a log chunk on edge). The answer to a
        repeat is built from the result its first copy got (the ledger), by the same code."""
        reports, worker = self.ctx.dispatch.reports, self.worker_id
        if isinstance(msg, m.LogChunk):
            chunks = self.sessions.log_chunks
            if chunks is None:
                self._to_peer(peer, self.sessions.log_chunk(msg, worker))
                return None
            return (Report(LockRequest(msg.attempt_id, log_end=True),
                           lambda conn, rows: chunks.append_in(conn, rows, worker, msg.attempt_id,
                                                               msg.callback_token_hash, msg.offset,
                                                               msg.data, msg.checksum),
                           changes_rows=False),
                    lambda result: self._to_peer(peer, self.sessions.log_ack(msg, result)))
        if isinstance(msg, m.Completed):
            return self._completion_of(msg, peer)
        fence = fence_of(msg, worker)
        locks = LockRequest(msg.attempt_id, msg.run_id, fence, revision=isinstance(msg, m.Activate))
        if isinstance(msg, m.Activate):
            return (Report(locks, lambda conn, rows: reports.activate_in(conn, rows, fence, msg.callback_token_hash,
                                                                          msg.log_artifact_id),
                           answer=self._answer_key(msg, Outcome[Activation])),
                    lambda result: self._answer_activate(msg, peer, result))
        answer = self._answer_key(msg, Outcome[None])
        if isinstance(msg, m.Started):
            return (Report(locks, lambda conn, rows: reports.started_in(conn, rows, fence, msg.boot_id, msg.pid,
                                                                         msg.pgid, msg.start_ticks), durable=False,
                           answer=answer),
                    lambda outcome: self._ack(peer, "started", msg, outcome.result, outcome.detail))
        if isinstance(msg, m.StartFailed):
            return (Report(locks, lambda conn, rows: reports.start_failed_in(conn, rows, fence, msg.reason),
                           answer=answer),
                    lambda outcome: self._ack(peer, "start_failed", msg, outcome.result, outcome.detail))
        return (Report(locks, lambda conn, rows: reports.decline_in(conn, rows, fence), answer=answer),
                lambda outcome: self._answer_decline(msg, peer, outcome))

    def _answer_activate(self, msg: m.Activate, peer: bytes, outcome: Outcome[Activation]) -> None:
        if outcome.applied:
            activation = outcome.value
            self._to_peer(peer, m.Activated(answer_to=msg.request_id, run_id=msg.run_id, attempt_id=msg.attempt_id,
                                               offer_id=msg.offer_id, lease_version=activation.lease_version,
                                               deadline_at_ms=activation.deadline_at_ms))
            if activation.deadline_at_ms is not None:
                self.ctx.directory.tell("supervisor", WakeAt(activation.deadline_at_ms))
        else:
            self._ack(peer, "activate", msg, outcome.result, outcome.detail)

    def _answer_decline(self, msg: m.Decline, peer: bytes, outcome: Outcome) -> None:
        self._ack(peer, "decline", msg, outcome.result, outcome.detail)
        if outcome.applied:
            log.info("event=offer_declined run=%s attempt=%s reason=%s", msg.run_id, msg.attempt_id,
                     msg.reason[:80])
            self.ctx.directory.tell("scheduler", Tick("decline"))  # offered again at once

    def _completion_of(self, msg: m.Completed, peer: bytes):
        try:
            receipt = Receipt(schema_version=msg.schema_version, run_id=msg.run_id, attempt_id=msg.attempt_id,
                              callback_sequence=msg.callback_sequence, token=msg.token,
                              started_at_ms=msg.started_at_ms, finished_at_ms=msg.finished_at_ms,
                              exit_code=msg.exit_code, output_open=msg.output_open)
        except ReceiptError as err:
            self._ack(peer, "completed", msg, Result.REFUSED, f"invalid_receipt: {err.reason}")
            return None
        facts = self.sessions.completion_facts(self.worker_id, msg)

        def apply(conn, rows):
            crash_point("before_completion_commit")
            return self.ctx.completion.complete_in(conn, rows, msg.run_id, msg.attempt_id, receipt,
                                                   msg.log_dropped_bytes, msg.stopped_by, **facts)

        return (Report(LockRequest(msg.attempt_id, msg.run_id, live_lease=True), apply,
                       answer=self._answer_key(msg, Outcome[None])),
                lambda outcome: self._answer_completed(msg, peer, outcome))

    def _answer_completed(self, msg: m.Completed, peer: bytes, outcome: Outcome) -> None:
        self._ack(peer, "completed", msg, outcome.result, outcome.detail)
        if outcome.settled and self.ctx.admitting.is_set():
            # Its slot is free in the database now: pull again (after the flush's other answers).
            if self.nudges is not None:
                self.nudges.add(peer)
            else:
                self._to_peer(peer, m.Nudge())

    # -- attestations -------------------------------------------------------------------------

    def on_attest(self, msg: m.Attest, peer: bytes) -> None:
        answer = self.sessions.attest(msg, self.worker_id)
        if answer.result == Result.APPLIED and msg.fact not in ("running", "launch_unknown"):
            # Evidence for recovery, which judges it on its next page (now: a cycle is asked for).
            self.ctx.directory.tell("recovery", AttemptEnded(msg.run_id, msg.attempt_id, msg.stopped_by))
            self.ctx.directory.tell("scheduler", Tick("attest"))
        self._to_peer(peer, answer)

    # -- to workers ---------------------------------------------------------------------------

    def on_to_workers(self, msg: ToWorkers, _peer: bytes) -> None:
        """After a cycle: the stop orders it committed, and a nudge when queued work waits."""
        self._forget_the_silent()
        for order in msg.stops:
            peer = self.peers.get(self.sessions.worker_of(order))
            if peer is not None:  # else: its worker hears it with its next heartbeat's answer
                self._send_stop(peer, order)
        if msg.nudge and self.ctx.admitting.is_set():
            for peer in self.peers.values():
                self._to_peer(peer, m.Nudge())

    def _send_stop(self, peer: bytes, order: Any) -> None:
        self._to_peer(peer, m.StopRequested(run_id=order.run_id, attempt_id=order.attempt_id,
                                               reason=order.reason, grace_ms=order.grace_ms))
