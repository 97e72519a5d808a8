"""Store: worker sessions (SEMANTICS.md §9 Sessions): register, resume and end them; heartbeats with
their lease renewals (heartbeats.py) and attestations (attestations.py) are their own collaborators.

Every method is one short transaction and every expiry is judged on database time
(`Store.now_ms`). A session's generation is the worker's last + 1, taken under the advisory lock
`worker:<id>`, so two registrations never compute the same one; the new generation ends the
older sessions and with them every fence they could still quote. A resume is checked and
applied under the same lock and the session row lock.

Register once (SEMANTICS.md §9): a Register carries a `register_id`, stored on the session it
opened (`register_id`) or rotated by a resume (`resume_register_id`); a repeat of it — a re-sent
copy, or the same Register reaching another replica — is answered with that session as it is,
under the same locks, so it never opens a generation + 1, never rotates the secret again and
never ends the session the first copy opened or resumed. The control side derives the resume
secret from the register id (control/session_policy.py), so the repeat's Welcome carries the same
secret while only its hash is stored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable

from sqlalchemy import and_, bindparam, or_, select

from ...domain.recovery_evidence import LAUNCH_UNKNOWN, REBOOTED
from ...domain.results import Outcome, Result
from ...domain.states import AttemptStatus, LeaseStatus
from ...errors import BadInput, Conflict
from ...ids import new_id
from ..engine import Store
from ..plans import sql_states
from ..records import Fenced, Session, check_hash, check_id
from ..schema import run_attempts, run_dispatch_leases, worker_keys, worker_sessions
from .dispatch_queries import SESSION_LOCKED
from .request_answers import AnswerKey, first_answers, keep_answers
from .session_rows import LATEST_GENERATION, update_session
from .session_rules import (DUPLICATE_WORKER, REVOKED, SUPERSEDED, check_capacity, check_ms, clock_skew, duplicate_verdict,
                            ended_at, labels_json, normal_labels, resume_refusal, session_mismatch)

_WS = worker_sessions
_END_STATUSES = ("offline", "draining")


@dataclass(frozen=True, slots=True)
class Unactivated:
    """A live lease of a session whose attempt was never activated."""

    run_id: str
    attempt_id: str
    offer_id: str
    lease_generation: int


_OLD_BOOT = select(_WS.c.boot_id).where(_WS.c.session_id == run_attempts.c.session_id).scalar_subquery()
_REBOOTED = run_attempts.update().values(evidence_lease_generation=run_attempts.c.lease_generation).where(and_(
    run_attempts.c.worker_id == bindparam("w_worker_id"),
    run_attempts.c.status.in_(sql_states(AttemptStatus.STARTING, AttemptStatus.RUNNING)),
    or_(run_attempts.c.evidence.is_(None), run_attempts.c.evidence == LAUNCH_UNKNOWN,
        run_attempts.c.evidence_lease_generation.is_distinct_from(run_attempts.c.lease_generation)),
    or_(run_attempts.c.boot_id != bindparam("w_boot_id"),
        and_(run_attempts.c.boot_id.is_(None), _OLD_BOOT != bindparam("w_boot_id")))))


def _record_reboot(conn, worker_id: str, boot_id: str, now: int) -> None:
    """The host rebooted since these attempts started (SEMANTICS.md §10): the worker registers on
    another boot than the one in the attempt's identity or, with no identity recorded yet, than
    its lease session's. Recorded as the attempts' evidence (`rebooted`), under the worker's lock,
    so the candidate query stays a plain column test; at most the worker's capacity of rows.
    Recorded for each attempt's current lease generation, replacing a fact about an older one."""
    conn.execute(_REBOOTED, dict(evidence=REBOOTED, evidence_at_ms=now, evidence_by=None, updated_at_ms=now,
                                 w_worker_id=worker_id, w_boot_id=boot_id))


_KEY_OF = select(worker_keys.c.worker_id).where(worker_keys.c.worker_id == bindparam("worker_id"))


def _check_register_id(register_id: str | None) -> None:
    if register_id is not None:
        check_id("register id", register_id, 64)


def _as_session(row) -> Session:
    """The session as its row stands: the answer to a repeat of the Register that opened or
    resumed it (without the note: the first copy's answer reported it)."""
    return Session(row.session_id, row.worker_id, row.generation, row.capacity,
                   lease_expires_at_ms=row.lease_expires_at_ms, labels=tuple(json.loads(row.labels_json)),
                   boot_id=row.boot_id, heartbeat_seq=row.heartbeat_seq)


class Sessions:
    """Register, resume and end worker sessions."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def register(self, worker_id: str, capacity: int, *, boot_id: str | None = None,
                 labels: Iterable[str] = (), session_lease_ms: int | None = None,
                 resume_secret_hash: str | None = None, require_key: bool = False,
                 register_id: str | None = None, worker_clock_ms: int | None = None,
                 lost_session_id: str | None = None) -> Session:
        """A new `online` session, generation = previous + 1; older sessions of the worker go `offline`
        (`ended_at_ms` set, unless they had already ended).

        `register_id` (a cluster worker's Register): when a session of this worker was opened by
        that id already, it is returned as it stands and nothing changes (a repeat gets the first
        answer, even if that session has ended since; the allow-list is still checked first).

        `require_key` (a cluster worker): `Fenced` unless the worker is still on the allow-list,
        checked under the worker's lock that `worker revoke` takes too, so a Register that a
        replica's not yet refreshed allow-list cache let through cannot outlive the revocation.

        `lost_session_id`: the session this Register asked to resume and was refused. A second
        live process presenting the worker's key (`session_rules.duplicate_verdict`): when that
        session was taken over while it lived by the newest one, the new session is opened noted
        `duplicate` (this process takes the key back), or, when the newest is itself so noted,
        `Fenced` (`duplicate_worker: ...`, nothing changed): this is the other process coming back.

        `worker_clock_ms` (the Register's): the worker's clock, so `workers` shows the clock skew
        from the first moment, not only after the first heartbeat.

        The new generation invalidates every fence of the old sessions at once. `session_lease_ms`
        None (edge): the session lives as long as the process; otherwise it expires at database
        time + the lease unless heartbeats renew it. Only the resume secret's hash is stored.
        With a `boot_id`, the worker's `starting|running` attempts of another boot get the evidence
        `rebooted` (unless a trusted fact is recorded already) for recovery (SEMANTICS.md §10).
        """
        _check_register_arguments(worker_id, capacity, boot_id, resume_secret_hash, session_lease_ms, register_id)
        labels = normal_labels(labels)
        with self.store.write() as conn:
            # Two registrations of one worker would both compute the same next generation.
            self.store.advisory_lock(conn, f"worker:{worker_id}")
            if require_key and conn.execute(_KEY_OF, {"worker_id": worker_id}).first() is None:
                raise Fenced(f"worker {worker_id!r} is not on the allow-list (revoked)")
            previous = conn.execute(select(_WS).where(_WS.c.worker_id == worker_id).with_for_update()).all()
            if register_id is not None:
                for row in previous:
                    if row.register_id == register_id:
                        return _as_session(row)
            now = self.store.now_ms(conn)
            generation = max((s.generation for s in previous), default=0) + 1
            note = _duplicate_note(worker_id, previous, lost_session_id, generation, now, session_lease_ms)
            _end_previous(conn, previous, worker_id, boot_id, now)
            expires = now + session_lease_ms if session_lease_ms is not None else None
            row = dict(session_id=new_id(), worker_id=worker_id, generation=generation, status="online",
                       version=1, capacity=capacity, free_slots=capacity, heartbeat_at_ms=now,
                       lease_expires_at_ms=expires, created_at_ms=now, updated_at_ms=now, boot_id=boot_id,
                       resume_secret_hash=resume_secret_hash, heartbeat_seq=0, heartbeat_answer=None,
                       labels_json=labels_json(labels), ended_at_ms=None,
                       clock_skew_ms=clock_skew(now, worker_clock_ms), drained_at_ms=None,
                       register_id=register_id, resume_register_id=None, ended_by=None, note=note)
            if not self.store.insert_new(conn, _WS, row):
                raise Conflict(f"worker {worker_id!r} registered generation {generation} meanwhile")
            return Session(row["session_id"], worker_id, generation, capacity, lease_expires_at_ms=expires,
                           labels=labels, boot_id=boot_id, note=note)

    def resume(self, worker_id: str, session_id: str, generation: int, resume_secret_hash: str,
               new_resume_secret_hash: str, boot_id: str, *, capacity: int,
               labels: Iterable[str], session_lease_ms: int, require_key: bool = False,
               register_id: str | None = None, worker_clock_ms: int | None = None) -> Session:
        """Resume the worker's current session after a restart within its lease, on the same boot.
        A session its worker drained (`end`) is resumed too: it is `online` again, no
        longer ended nor drained; one the operator ended (`worker revoke`, `worker retire`) never.

        Raises `Fenced` whose message starts with the reason word (`unknown_session`,
        `superseded`, `revoked`, `retired`, `offline`, `expired`, `rebooted`, `wrong_secret`):
        the worker registers anew. `require_key` (a cluster worker): `revoked` when the worker is
        no longer on the allow-list, checked under the `worker:<id>` lock as a Register is.

        On success the secret rotates (the old one is refused from now on) and the session records
        `register_id`: a repeat of that resume (same session, generation and register id) gets the
        session as it stands, with no second rotation and no check of the rotated secret, as long
        as no later resume rotated it again. The lease is renewed from database time (the resume
        counts as a heartbeat: `workers` shows its age from the resume) and capacity
        and labels are the worker's current ones, and so is the clock skew given `worker_clock_ms`;
        the Session's `heartbeat_seq` is the last heartbeat number stored, to number on from.
        """
        check_id("worker id", worker_id, 128)
        check_id("session id", session_id)
        check_hash("resume secret hash", resume_secret_hash)
        check_hash("new resume secret hash", new_resume_secret_hash)
        check_id("boot id", boot_id, 64)
        check_capacity(capacity)
        check_ms("session_lease_ms", session_lease_ms)
        _check_register_id(register_id)
        labels = normal_labels(labels)
        with self.store.write() as conn:
            # The lock order of a registration: the worker's, then its session rows.
            self.store.advisory_lock(conn, f"worker:{worker_id}")
            if require_key and conn.execute(_KEY_OF, {"worker_id": worker_id}).first() is None:
                raise Fenced(f"{REVOKED}: worker {worker_id!r} is not on the allow-list; session "
                             f"{session_id} cannot be resumed")
            session = conn.execute(SESSION_LOCKED, {"session_id": session_id}).first()
            if (register_id is not None and session is not None and session.worker_id == worker_id
                    and session.generation == generation and session.resume_register_id == register_id):
                return _as_session(session)
            latest = conn.execute(LATEST_GENERATION, {"worker_id": worker_id}).scalar_one()
            now = self.store.now_ms(conn)
            refusal = resume_refusal(session, worker_id, generation, latest, boot_id, resume_secret_hash, now)
            if refusal is not None:
                raise Fenced(f"{refusal}: session {session_id} of worker {worker_id!r} cannot be resumed; "
                             "register a new session")
            expires = now + session_lease_ms
            update_session(conn, session, now, resume_secret_hash=new_resume_secret_hash,
                           lease_expires_at_ms=expires, heartbeat_at_ms=now, capacity=capacity, status="online",
                           ended_at_ms=None, drained_at_ms=None, resume_register_id=register_id,
                           free_slots=min(session.free_slots, capacity), labels_json=labels_json(labels),
                           **({} if worker_clock_ms is None else {"clock_skew_ms": clock_skew(now, worker_clock_ms)}))
            return Session(session_id, worker_id, generation, capacity, lease_expires_at_ms=expires,
                           labels=labels, boot_id=boot_id, heartbeat_seq=session.heartbeat_seq)

    def unactivated_leases(self, session_id: str, limit: int = 256) -> list[Unactivated]:
        """The session's live leases whose attempt was never activated, for Welcome after a resume:
        the worker declines those it does not know (SEMANTICS.md §9 Offers)."""
        check_id("session id", session_id)
        query = (select(run_dispatch_leases.c.run_id, run_dispatch_leases.c.attempt_id,
                        run_dispatch_leases.c.offer_id, run_dispatch_leases.c.lease_generation)
                 .join(run_attempts, run_attempts.c.id == run_dispatch_leases.c.attempt_id)
                 .where(and_(run_dispatch_leases.c.session_id == session_id,
                             run_dispatch_leases.c.status == LeaseStatus.LEASED.value,
                             run_attempts.c.status == AttemptStatus.CLAIMED.value))
                 .order_by(run_dispatch_leases.c.attempt_id).limit(limit))
        with self.store.read() as conn:
            return [Unactivated(*row) for row in conn.execute(query)]

    def end(self, worker_id: str, session_id: str, generation: int, *,
            status: str = "offline", answer: AnswerKey | None = None) -> Outcome:
        """Its worker drains the session (SEMANTICS.md §9 Drain, the wire's `Leave`): `draining`
        (no more offers to it; its reports still count) then `offline`.

        Either records `drained_at_ms` (a planned stop: recovery counts the session as ended only
        a drain grace after it ended); going `offline` records `ended_at_ms` (its lease's expiry
        when that is past). `fenced`, changing nothing, when the session is not the worker's
        current one (unknown, another worker's or generation, superseded by a later generation,
        or ended without a drain: revoked, retired). Repeats are `applied` with detail
        `already_draining` / `already_offline` (a `draining` arriving after `offline` too);
        `draining` is `refused` for a session whose lease has expired. `answer` names the
        request for the ledger (a cluster replica): a repeat of it gets its first answer.
        """
        if status not in _END_STATUSES:
            raise BadInput(f"a session ends {' or '.join(_END_STATUSES)}")
        check_id("worker id", worker_id, 128)
        check_id("session id", session_id)
        with self.store.write() as conn:
            session = conn.execute(SESSION_LOCKED, {"session_id": session_id}).first()
            now = self.store.now_ms(conn)
            if answer is not None and (first := first_answers(conn, [answer]).get(answer.id)) is not None:
                return first  # a repeat of this Leave: its first answer, nothing applied again
            result = self._end(conn, session, worker_id, generation, status, now)
            if answer is not None:
                keep_answers(conn, [(answer, result)], now)
            return result

    def _end(self, conn, session, worker_id: str, generation: int, status: str, now: int) -> Outcome:
        """`end` under the session row lock."""
        detail = session_mismatch(session, worker_id, generation, now, online_only=False)
        if detail in ("unknown_session", "session_worker", "session_generation"):
            return Outcome(Result.FENCED, detail)
        if conn.execute(LATEST_GENERATION, {"worker_id": worker_id}).scalar_one() > generation:
            return Outcome(Result.FENCED, SUPERSEDED)
        if session.status == "offline":
            if session.drained_at_ms is None:
                return Outcome(Result.FENCED, "session_offline")  # revoked or retired: not its to end
            return Outcome(Result.APPLIED, "already_offline")
        if status == "draining":
            if session.status == "draining":
                return Outcome(Result.APPLIED, "already_draining")
            if detail is not None:
                return Outcome(Result.REFUSED, detail)
            update_session(conn, session, now, status="draining", drained_at_ms=now)
        else:
            update_session(conn, session, now, status="offline", ended_at_ms=ended_at(session, now),
                           drained_at_ms=session.drained_at_ms or now)
        return Outcome(Result.APPLIED)


def _duplicate_note(worker_id: str, previous: list, lost_session_id: str | None, generation: int, now: int,
                    session_lease_ms: int | None) -> str | None:
    """The new session's note (`session_rules.duplicate_verdict`), or `Fenced` when this Register is
    the other of two live processes presenting one key coming back (nothing is changed then)."""
    lost = next((s for s in previous if s.session_id == lost_session_id), None)
    successor = next((s for s in previous if lost is not None and s.generation == lost.generation + 1
                      and s.generation == generation - 1), None)
    note = duplicate_verdict(lost, successor, now, session_lease_ms)
    if note == DUPLICATE_WORKER:
        raise Fenced(f"{DUPLICATE_WORKER}: another live process presents the key of worker "
                     f"{worker_id!r} and holds its session (generation {generation - 1}); two "
                     "processes with one key take the session from each other: stop this one, "
                     "or give it a key of its own (qlactors keys new, worker allow)")
    return note


def _check_register_arguments(worker_id: str, capacity: int, boot_id: str | None, resume_secret_hash: str | None,
                              session_lease_ms: int | None, register_id: str | None) -> None:
    """BadInput for what `register` cannot take (nothing is written)."""
    check_id("worker id", worker_id, 128)
    check_capacity(capacity)
    if boot_id is not None:
        check_id("boot id", boot_id, 64)
    if resume_secret_hash is not None:
        check_hash("resume secret hash", resume_secret_hash)
    check_ms("session_lease_ms", session_lease_ms, optional=True)
    _check_register_id(register_id)


def _end_previous(conn, previous: list, worker_id: str, boot_id: str | None, now: int) -> None:
    """A new registration's effects on what came before: every older session goes `offline`, and
    with a `boot_id` the worker's attempts of another boot get the evidence `rebooted`."""
    for old in previous:
        if old.status != "offline":
            update_session(conn, old, now, status="offline", ended_at_ms=ended_at(old, now))
    if boot_id is not None:
        _record_reboot(conn, worker_id, boot_id, now)
