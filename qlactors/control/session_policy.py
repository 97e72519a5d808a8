"""Control side: who the Gateway's executors are: the one local session of an edge process, or the cluster's
workers, whose sessions, leases and log chunks the database decides (SEMANTICS.md §9, §13).

A policy answers the session messages (Register, Heartbeat), says how long a run lease lasts and
whether offers may go out, and judges what differs between the profiles in a completion, a log
chunk and an attestation. Everything else the Gateway does the same way for both.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any, Callable, Protocol

from ..domain.receipt import token_hash
from ..domain.results import Outcome, Result
from ..store.cadence.control import Control
from ..store.dispatch.dispatch import Dispatch
from ..store.dispatch.log_chunks import LogChunks
from ..store.records import Fenced, LeaseTerms, Session
from ..store.dispatch.request_answers import AnswerKey, RequestAnswers
from ..store.dispatch.session_rules import DUPLICATE, DUPLICATE_WORKER
from ..wire import codec
from ..wire import messages as m

log = logging.getLogger("qlactors.gateway")


def _protocol_refusal(msg: m.Register) -> str | None:
    if max(msg.protocol_min, codec.PROTOCOL_MIN) <= min(msg.protocol_max, codec.PROTOCOL_MAX):
        return None
    return (f"protocol mismatch: this control side speaks protocol {codec.PROTOCOL_MIN}..{codec.PROTOCOL_MAX}; "
            f"the worker speaks {msg.protocol_min}..{msg.protocol_max}: upgrade one of them")


def agreed_protocol(msg: m.Register) -> int:
    """The version a Welcome agrees: the highest both sides speak (Register checked first)."""
    return min(msg.protocol_max, codec.PROTOCOL_MAX)


class DiskRoom(Protocol):
    """Edge: the disk reserve of the logs' file system (executor/disk_reserve.DiskReserve), which
    the Gateway checks before it offers."""

    def has_room(self) -> bool:
        """False while the free space is below the reserve."""


class LocalSessions:
    """Edge: the executor in this process, its session registered at startup; leases live as long
    as the process (nothing to renew), logs stay in local files, recovery reads the process."""

    run_lease_ms: int | None = None
    log_chunks = None  # logs stay in local files: a LogChunk is answered by `log_chunk`
    ledger = None  # one in-process executor sends no copies: no answer ledger, no statement for it

    def __init__(self, session: Session, heartbeat_ms: int, disk_reserve: DiskRoom | None = None) -> None:
        self.session = session
        self.heartbeat_ms = heartbeat_ms
        self.disk_reserve = disk_reserve

    def register(self, msg: m.Register, worker_id: str) -> m.Welcome | str:
        if worker_id != self.session.worker_id:
            return f"unknown worker {worker_id!r}"
        refusal = _protocol_refusal(msg)
        if refusal:
            return refusal
        s = self.session
        return m.Welcome(answer_to=msg.request_id, worker_id=s.worker_id, session_id=s.session_id, session_generation=s.generation,
                         resumed=False, resume_secret=secrets.token_urlsafe(32), protocol=agreed_protocol(msg),
                         heartbeat_ms=self.heartbeat_ms, session_lease_ms=None, run_lease_ms=None,
                         unactivated=[], heartbeat_seq=0)

    def _current(self, msg: Any, worker_id: str) -> bool:
        s = self.session
        return (worker_id, msg.session_id, msg.session_generation) == (s.worker_id, s.session_id, s.generation)

    def heartbeat(self, msg: m.Heartbeat, worker_id: str) -> tuple[m.HeartbeatAck, list]:
        ended = not self._current(msg, worker_id)
        renewed = [] if ended else [
            m.Renewed(attempt_id=r.attempt_id, lease_generation=r.lease_generation, lease_version=0,
                      expires_at_ms=None) for r in msg.renewals]
        return m.HeartbeatAck(answer_to=msg.request_id, seq=msg.seq, session_ended=ended, session_expires_at_ms=None, renewed=renewed,
                              fenced=[], detail="stale session" if ended else ""), []

    def leave(self, msg: m.Leave, worker_id: str) -> Outcome:
        # The edge executor never drains its session: it lives and ends with this process.
        return Outcome(Result.REFUSED, "an edge session lives as long as its process")

    def may_offer(self) -> bool:
        return self.disk_reserve is None or self.disk_reserve.has_room()

    def completion_facts(self, worker_id: str, msg: m.Completed) -> dict[str, Any]:
        return {}  # one clock on edge: the store compares the finish with the deadline itself

    def log_chunk(self, msg: m.LogChunk, worker_id: str) -> m.LogAck:
        return m.LogAck(answer_to=msg.request_id, attempt_id=msg.attempt_id, result=Result.REFUSED.value,
                        acked_offset=0, detail="edge keeps logs in local files")

    def attest(self, msg: m.Attest, worker_id: str) -> m.Attested:
        # The executor shares this process; recovery judges by its own records and the process
        # identity (SEMANTICS.md §6): an attestation only tells it where to look now.
        current = self._current(msg, worker_id)
        return m.Attested(answer_to=msg.request_id, run_id=msg.run_id, attempt_id=msg.attempt_id, fact=msg.fact,
                          result=(Result.APPLIED if current else Result.FENCED).value,
                          offer_id=None, lease_generation=None, lease_version=None,
                          lease_expires_at_ms=None, detail="" if current else "stale session")

    def worker_of(self, order: Any) -> str:
        return self.session.worker_id


class ClusterSessions:
    """A cluster replica: workers authenticated by their keys, every session, lease, renewal,
    completion and log chunk decided by the database (SEMANTICS.md §9, §13).

    `resume_secret(worker_id, register_id)` gives the secret a Welcome carries
    (`domain.resume_secret` keyed with the replicas' shared secret key): derived, not drawn, so
    every copy of one Register, on any replica, is answered with the same secret.
    """

    def __init__(self, dispatch: Dispatch, log_chunks: LogChunks | None, control: Control, *, heartbeat_ms: int,
                 session_lease_ms: int, run_lease_ms: int, resume_secret: Callable[[str, str], str]) -> None:
        self.dispatch = dispatch
        self.resume_secret = resume_secret
        self.log_chunks = log_chunks
        self.control = control
        self.heartbeat_ms = heartbeat_ms
        self.session_lease_ms = session_lease_ms
        self.run_lease_ms = run_lease_ms
        # The answer ledger: a repeated request gets its first answer (SEMANTICS.md §9 Owed reports);
        # the replica prunes it every few cycles (`RequestAnswers.prune_due`).
        self.ledger = RequestAnswers(dispatch.store)

    # -- sessions -----------------------------------------------------------------------------

    def register(self, msg: m.Register, worker_id: str) -> m.Welcome | str:
        """Resume the quoted session or open a new one (SEMANTICS.md §9 Sessions, Register once).

        Idempotent by `msg.register_id`: a repeat (a re-sent copy, or the copy another replica
        got) is answered with the session the first copy resumed or opened, with the same
        secret; it never rotates the secret again, never falls back to a generation + 1 and
        never ends that session. A resume the store refuses (past its lease, rebooted,
        superseded, revoked or retired) falls back to a new session under the same register id.
        """
        refusal = _protocol_refusal(msg)
        if refusal:
            return refusal
        if not msg.register_id:
            return "a Register carries a register_id"
        secret = self.resume_secret(worker_id, msg.register_id)
        labels = tuple(sorted(set(msg.labels)))
        if msg.resume_session_id is not None and msg.resume_generation is not None and msg.resume_secret:
            try:
                session = self.dispatch.sessions.resume(
                    worker_id, msg.resume_session_id, msg.resume_generation, token_hash(msg.resume_secret),
                    token_hash(secret), msg.boot_id, capacity=msg.capacity, labels=labels,
                    session_lease_ms=self.session_lease_ms, require_key=True, register_id=msg.register_id,
                    worker_clock_ms=msg.worker_clock_ms)
            except Fenced as err:  # past its lease, after a reboot, superseded, revoked, retired
                log.info("event=resume_refused worker=%s session=%s reason=%s", worker_id,
                         msg.resume_session_id, err)
            else:
                return self._welcome(msg, session, secret, resumed=True,
                                     unactivated=self.dispatch.sessions.unactivated_leases(session.session_id))
        try:
            session = self.dispatch.sessions.register(
                worker_id, msg.capacity, boot_id=msg.boot_id, labels=labels,
                session_lease_ms=self.session_lease_ms, resume_secret_hash=token_hash(secret), require_key=True,
                register_id=msg.register_id, worker_clock_ms=msg.worker_clock_ms,
                lost_session_id=msg.resume_session_id)
        except Fenced as err:  # revoked after this replica's allow-list cache was read, or a duplicate
            if str(err).startswith(DUPLICATE_WORKER):
                log.error("event=duplicate_worker_refused worker=%s boot=%s (a second live process presents "
                          "this worker's key; it is refused and exits)", worker_id, msg.boot_id)
            return str(err)
        if session.note == DUPLICATE:
            log.error("event=duplicate_worker worker=%s generation=%d boot=%s (two live processes present this "
                      "worker's key and took its session from each other: the one that held it before takes it "
                      "back; the other is refused at its next Register and exits 1)", worker_id,
                      session.generation, msg.boot_id)
        return self._welcome(msg, session, secret, resumed=False, unactivated=[])

    def _welcome(self, msg: m.Register, session: Any, secret: str, *, resumed: bool,
                 unactivated: list) -> m.Welcome:
        return m.Welcome(
            answer_to=msg.request_id,
            worker_id=session.worker_id, session_id=session.session_id, session_generation=session.generation,
            resumed=resumed, resume_secret=secret, protocol=agreed_protocol(msg), heartbeat_ms=self.heartbeat_ms,
            heartbeat_seq=session.heartbeat_seq,
            session_lease_ms=self.session_lease_ms, run_lease_ms=self.run_lease_ms,
            unactivated=[m.Unactivated(run_id=u.run_id, attempt_id=u.attempt_id, offer_id=u.offer_id,
                                       lease_generation=u.lease_generation) for u in unactivated])

    def heartbeat(self, msg: m.Heartbeat, worker_id: str) -> tuple[m.HeartbeatAck, list]:
        from ..store.records import LeaseQuote

        answer = self.dispatch.heartbeats.apply(
            worker_id, msg.session_id, msg.session_generation, msg.seq, free_slots=msg.free_slots,
            worker_clock_ms=msg.worker_clock_ms,
            renewals=[LeaseQuote(run_id=r.run_id, attempt_id=r.attempt_id, offer_id=r.offer_id,
                                 lease_generation=r.lease_generation, lease_token_hash=token_hash(r.lease_token))
                      for r in msg.renewals],
            session_lease_ms=self.session_lease_ms, run_lease_ms=self.run_lease_ms)
        ack = m.HeartbeatAck(
            answer_to=msg.request_id, seq=msg.seq, session_ended=answer.session_ended, session_expires_at_ms=answer.session_expires_at_ms,
            renewed=[m.Renewed(attempt_id=a, lease_generation=g, lease_version=v, expires_at_ms=e)
                     for a, g, v, e in answer.renewed],
            fenced=[m.FencedLease(attempt_id=a, lease_generation=g, reason=r) for a, g, r in answer.fenced],
            detail=answer.reason or "", last_seq=answer.last_seq)
        stops = [] if answer.session_ended else self.control.stops.pending(worker_id=worker_id)
        return ack, stops

    def leave(self, msg: m.Leave, worker_id: str) -> Outcome:
        """A worker's drain (SEMANTICS.md §9 Drain): its session `draining`, then `offline`, from
        the authenticated worker's session only (`Sessions.end` fences any other)."""
        return self.dispatch.sessions.end(worker_id, msg.session_id, msg.session_generation, status=msg.status,
                                          answer=AnswerKey(worker_id, msg.request_id, msg.KIND, Outcome[None]))

    def may_offer(self) -> bool:
        return True  # a worker checks its own disk before it pulls (executor/pulling.py)

    # -- reports that differ from edge ------------------------------------------------------------

    def completion_facts(self, worker_id: str, msg: m.Completed) -> dict[str, Any]:
        return dict(worker_id=worker_id, final_log_offset=msg.final_log_offset,
                    finished_in_time=msg.finished_in_time)

    def log_ack(self, msg: m.LogChunk, outcome: Outcome[int]) -> m.LogAck:
        """The answer to a chunk the Gateway stored through `log_chunks` (its value: the acked offset)."""
        if not outcome.applied:
            log.warning("event=log_chunk_%s attempt=%s offset=%d detail=%s", outcome.result, msg.attempt_id,
                        msg.offset, outcome.detail)
        return m.LogAck(answer_to=msg.request_id, attempt_id=msg.attempt_id, result=outcome.result.value,
                        acked_offset=outcome.value, detail=outcome.detail or "")

    def attest(self, msg: m.Attest, worker_id: str) -> m.Attested:
        from ..store.records import Identity, LeaseQuote

        def answer(result: Result, detail: str = "") -> m.Attested:
            return m.Attested(answer_to=msg.request_id, run_id=msg.run_id, attempt_id=msg.attempt_id, fact=msg.fact,
                              result=result.value,
                              offer_id=None, lease_generation=None, lease_version=None,
                              lease_expires_at_ms=None, detail=detail)

        if msg.lease is None or msg.lease_session_id is None or msg.lease_session_generation is None:
            return answer(Result.REFUSED, "an attestation on a cluster quotes its lease")
        if msg.fact == "running" and (msg.new_slot is None or msg.pid is None):
            return answer(Result.REFUSED, "a `running` attestation carries the identity and a fresh lease pair")
        lease = msg.lease
        identity = None
        if msg.fact == "running":
            identity = Identity(msg.boot_id or "", msg.pid, msg.pgid or 0, msg.start_ticks or 0)
        outcome = self.dispatch.attestations.apply(
            worker_id, msg.session_id, msg.session_generation,
            LeaseQuote(run_id=lease.run_id, attempt_id=lease.attempt_id, offer_id=lease.offer_id,
                       lease_generation=lease.lease_generation, lease_token_hash=token_hash(lease.lease_token)),
            msg.lease_session_id, msg.lease_session_generation, msg.fact,
            new_lease_token_hash=token_hash(msg.new_slot.lease_token) if msg.new_slot else None,
            new_offer_id=msg.new_slot.offer_id if msg.new_slot else None,
            identity=identity, run_lease_ms=self.run_lease_ms,
            answer=AnswerKey(worker_id, msg.request_id, msg.KIND, Outcome[LeaseTerms]))
        if outcome.applied and msg.fact == "running":
            held = outcome.value
            return m.Attested(answer_to=msg.request_id, run_id=msg.run_id, attempt_id=msg.attempt_id, fact=msg.fact,
                              result=Result.APPLIED.value, offer_id=msg.new_slot.offer_id,
                              lease_generation=held.lease_generation, lease_version=held.lease_version,
                              lease_expires_at_ms=held.expires_at_ms, detail="")
        return answer(outcome.result, outcome.detail or "")

    def worker_of(self, order: Any) -> str | None:
        return getattr(order, "worker_id", None)
