"""Store: attestations (SEMANTICS.md §9 Re-attest): after every start a worker tells the control side,
from its current session, what it knows about each attempt in its journal, quoting the lease
(of whichever of its sessions) the attempt was offered under.

`running` re-binds that lease to the current session under a new lease generation (and makes a
`starting` attempt whose Started never landed `running`, the one transition an attestation
makes; the new lease clears any evidence). `never_launched` for a `claimed` attempt (an offer
accepted, never activated) gives the claim back at once: its lease ends `released`
(`declined`, version + 1) and the attempt is offered again, as a Decline does; once a start was
recorded (a Started or a `running` re-bind landed: the identity is known) it is `refused`.
Every other fact is recorded as the attempt's evidence (`run_attempts.evidence`, database time)
with the generation of the lease it quotes (`evidence_lease_generation`: recovery trusts it
only while that lease is the attempt's current one, §10), and changes nothing else: no event,
since an event bumps the run's version and evidence is not a transition of the run.

Lock order, as for every report: the attempt's advisory lock, the session row, the run row, the
lease row, then database time once.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, bindparam

from ...domain.recovery_evidence import NEVER_LAUNCHED
from ...domain.results import Outcome, Result
from ...domain.states import AttemptStatus, LeaseReleaseReason, LeaseStatus
from ...domain.transitions import adoption_payload, plan_adopted
from ...errors import BadInput, Conflict
from ..engine import Store
from ..plans import apply_plan, attempt_snapshot, current_attempt, end_lease, load_attempt, load_run, run_snapshot
from ..records import Identity, LeaseQuote, LeaseTerms, check_hash, check_id, same_hash
from ..schema import run_attempts, run_dispatch_leases
from .dispatch_queries import LEASE_BY_OFFER, LEASE_LOCKED, MAX_GENERATION, SESSION_SHARED
from .evidence import NO_EVIDENCE
from .request_answers import AnswerKey, first_answers, keep_answers
from .session_rules import EVIDENCE_FACTS, RUNNING, check_ms, check_quote, session_mismatch

ACTOR = "executor"
_A = run_attempts
_LIVE = (AttemptStatus.STARTING.value, AttemptStatus.RUNNING.value)
_EVIDENCE = _A.update().where(_A.c.id == bindparam("w_id"))
_REBIND = _A.update().where(and_(_A.c.id == bindparam("w_id"), _A.c.status == bindparam("w_status"),
                                 _A.c.lease_generation == bindparam("w_generation")))


class Attestations:
    """`apply` an attestation: what a worker knows about one attempt's process."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def apply(self, worker_id: str, session_id: str, generation: int, quote: LeaseQuote,
              quote_session_id: str, quote_session_generation: int, fact: str, *,
              new_lease_token_hash: str | None = None, new_offer_id: str | None = None,
              identity: Any = None, run_lease_ms: int, answer: AnswerKey | None = None) -> Outcome[LeaseTerms]:
        """Apply one attestation from the worker's current session (worker, session, generation).

        `fenced` (nothing changed) when that session is not current, or the quoted lease does not
        match (session, offer id, token) or is no longer `leased`; `refused` when the lease is
        another worker's. `superseded` when the attempt is terminal, `lost` or replaced by a later
        attempt of its run: the worker stops the process; nothing changes.

        `running` needs the process `identity` (the attempt's stored one, if any), a fresh
        `new_lease_token_hash` and `new_offer_id`: the quoted lease ends `released`
        (`lease_expired`) and a new lease (generation + 1, version 1, expiring at database time +
        `run_lease_ms`) binds the attempt to the current session. Repeated with the same new
        offer id and token, it answers the same lease again. `never_launched` for a `claimed`
        attempt releases the quoted lease (`declined`; `applied`, detail `released`, also for a
        repeat once it is released so), and is `refused` (`started`, nothing changed) once the
        attempt's start was recorded. The other facts (`stopped`, `ended`, `never_launched`,
        `launch_unknown`, `ended_with_receipt`) record the evidence for the quoted lease's
        generation; a repeat of the same fact about the same lease keeps the first time.

        `answer` names the request for the ledger (a cluster replica): looked up under the locks
        above, a repeat gets its first answer; a first answer is kept in this transaction.
        """
        check_id("worker id", worker_id, 128)
        check_id("session id", session_id)
        check_id("quoted session id", quote_session_id)
        check_quote(quote)
        check_ms("run_lease_ms", run_lease_ms)
        if fact == RUNNING:
            check_hash("new lease token hash", new_lease_token_hash)
            check_id("new offer id", new_offer_id)
            if identity is None:
                raise BadInput("a `running` attestation carries the process identity")
            identity = Identity.of(identity)
        elif fact not in EVIDENCE_FACTS:
            raise BadInput(f"unknown attestation fact {fact!r}")
        with self.store.write() as conn:
            self.store.advisory_lock(conn, f"attempt:{quote.attempt_id}")
            session = conn.execute(SESSION_SHARED, {"session_id": session_id}).first()
            run = load_run(conn, quote.run_id)
            attempt = load_attempt(conn, quote.attempt_id)
            lease = conn.execute(LEASE_LOCKED, {"attempt_id": quote.attempt_id,
                                                 "generation": quote.lease_generation}).first()
            now = self.store.now_ms(conn)
            if answer is not None and (first := first_answers(conn, [answer]).get(answer.id)) is not None:
                return first  # a repeat of this request: its first answer, nothing applied again
            result = self._judge(conn, worker_id, generation, quote, quote_session_id, quote_session_generation,
                                 fact, new_lease_token_hash, new_offer_id, identity, run_lease_ms, session, run,
                                 attempt, lease, now)
            if answer is not None:
                keep_answers(conn, [(answer, result)], now)
            return result

    def _judge(self, conn, worker_id: str, generation: int, quote: LeaseQuote, quote_session_id: str,
               quote_session_generation: int, fact: str, new_lease_token_hash: str | None,
               new_offer_id: str | None, identity: Any, run_lease_ms: int, session, run, attempt,
               lease, now: int) -> Outcome[LeaseTerms]:
        """`apply` under its locks, with the rows they read."""
        detail = session_mismatch(session, worker_id, generation, now, online_only=False)
        if detail is not None:
            return Outcome(Result.FENCED, detail)
        if run is None or attempt is None or attempt.run_id != run.id:
            return Outcome(Result.FENCED, "unknown_attempt")
        if lease is None or lease.run_id != run.id:
            return Outcome(Result.FENCED, "lease_generation")
        if lease.worker_id != worker_id:
            return Outcome(Result.REFUSED, "lease_worker")
        if (lease.session_id, lease.session_generation) != (quote_session_id, quote_session_generation):
            return Outcome(Result.FENCED, "lease_session")
        if lease.offer_id != quote.offer_id:
            return Outcome(Result.FENCED, "offer_id")
        if not same_hash(lease.token_hash, quote.lease_token_hash):
            return Outcome(Result.FENCED, "lease_token")
        # The worker proved it held this lease: tell it when its process has nothing to run for.
        status = AttemptStatus(attempt.status)
        if status.terminal:
            return Outcome(Result.SUPERSEDED, f"attempt_{status.value}")
        if current_attempt(conn, run.id).id != attempt.id:
            return Outcome(Result.SUPERSEDED, "later_attempt")
        if fact == RUNNING:
            replay = conn.execute(LEASE_BY_OFFER, {"offer_id": new_offer_id}).first()
            if replay is not None:
                return _replayed(replay, attempt.id, session, new_lease_token_hash)
        if fact == NEVER_LAUNCHED and _given_back(lease):  # the answer to the first copy was lost
            return _held("released", lease.lease_generation, lease.version, lease.expires_at_ms)
        if lease.status != LeaseStatus.LEASED.value:
            return Outcome(Result.FENCED, f"lease_{lease.status}")
        if fact == NEVER_LAUNCHED:
            if attempt.pid is not None:  # a Started (or a `running` re-bind) landed: it was launched
                return Outcome(Result.REFUSED, "started")
            if attempt.status == AttemptStatus.CLAIMED.value:
                version = end_lease(conn, attempt.id, now, LeaseStatus.RELEASED, LeaseReleaseReason.DECLINED)
                return _held("released", lease.lease_generation, version, lease.expires_at_ms)
        if fact != RUNNING:
            if (attempt.evidence, attempt.evidence_lease_generation) != (fact, lease.lease_generation):
                conn.execute(_EVIDENCE, dict(NO_EVIDENCE, evidence=fact, evidence_at_ms=now,
                                             evidence_lease_generation=lease.lease_generation,
                                             updated_at_ms=now, w_id=attempt.id))
            return _held(None, lease.lease_generation, lease.version, lease.expires_at_ms)
        return self._rebind(conn, run, attempt, lease, session, identity, new_offer_id,
                            new_lease_token_hash, now + run_lease_ms, now)

    def _rebind(self, conn, run, attempt, lease, session, identity: Identity, offer_id: str,
                token_hash: str, expires: int, now: int) -> Outcome[LeaseTerms]:
        """`running`: the attempt's lease moves to the current session under a new generation.

        A `starting` attempt whose Started never landed (no identity recorded) becomes `running`
        with this identity, as a Started report would have made it.
        """
        if attempt.status not in _LIVE:
            return Outcome(Result.REFUSED, f"attempt_{attempt.status}")
        stored = Identity.from_row(attempt)
        if stored is not None and stored != identity:
            return Outcome(Result.REFUSED, "identity_mismatch")
        end_lease(conn, attempt.id, now, LeaseStatus.RELEASED, LeaseReleaseReason.LEASE_EXPIRED)
        new_generation = conn.execute(MAX_GENERATION, {"attempt_id": attempt.id}).scalar_one() + 1
        if not self.store.insert_new(conn, run_dispatch_leases, dict(
                attempt_id=attempt.id, lease_generation=new_generation, run_id=attempt.run_id,
                status=LeaseStatus.LEASED.value, version=1, worker_id=session.worker_id,
                session_id=session.session_id, session_generation=session.generation,
                token_hash=token_hash, offer_id=offer_id, expires_at_ms=expires, release_reason=None,
                created_at_ms=now, updated_at_ms=now)):
            raise Conflict(f"lease {new_generation} of attempt {attempt.id} was written meanwhile")
        # The process runs: whatever not-running fact an earlier attestation recorded is void.
        projection = dict(offer_id=offer_id, lease_generation=new_generation, lease_version=1,
                          lease_expires_at_ms=expires, worker_id=session.worker_id,
                          session_id=session.session_id, session_generation=session.generation,
                          **NO_EVIDENCE)
        plan = plan_adopted(run_snapshot(run), attempt_snapshot(attempt), adoption_payload(
            new_generation, lease.lease_generation, session.worker_id, session.session_id))
        if stored is None:
            apply_plan(conn, plan, now, actor_type=ACTOR, expected_callback_sequence=attempt.callback_sequence,
                       run_values={"started_at_ms": now} if run.started_at_ms is None else None,
                       attempt_values=dict(projection, boot_id=identity.boot_id, pid=identity.pid,
                                           pgid=identity.pgid, start_ticks=identity.start_ticks,
                                           started_at_ms=now))
            return _held("rebound", new_generation, 1, expires)
        if conn.execute(_REBIND, dict(projection, updated_at_ms=now, w_id=attempt.id, w_status=attempt.status,
                                      w_generation=lease.lease_generation)).rowcount != 1:
            raise Conflict(f"attempt {attempt.id} changed meanwhile")
        apply_plan(conn, plan, now, actor_type=ACTOR)  # the run's version and `attempt.adopted`
        return _held("rebound", new_generation, 1, expires)


def _held(detail: str | None, generation: int, version: int, expires_at_ms: int | None) -> Outcome[LeaseTerms]:
    """`applied`, with the lease the worker holds afterwards."""
    return Outcome(Result.APPLIED, detail, value=LeaseTerms(generation, version, expires_at_ms))


def _given_back(lease) -> bool:
    """The quoted lease was released by a give-back (this `never_launched`, or a Decline)."""
    return (lease.status == LeaseStatus.RELEASED.value
            and lease.release_reason == LeaseReleaseReason.DECLINED.value)


def _replayed(lease, attempt_id: str, session, token_hash: str) -> Outcome[LeaseTerms]:
    """A `running` attestation whose new offer id already names a lease: the same re-bind again
    (its answer was lost), or `fenced` when that offer id belongs to something else."""
    if (lease.attempt_id != attempt_id or lease.session_id != session.session_id
            or not same_hash(lease.token_hash, token_hash)):
        return Outcome(Result.FENCED, "offer_id_used")
    if lease.status != LeaseStatus.LEASED.value:
        return Outcome(Result.FENCED, f"lease_{lease.status}")
    return _held("rebound", lease.lease_generation, lease.version, lease.expires_at_ms)
