"""Numbered heartbeats and the lease renewals they carry (SEMANTICS.md §9 Sessions, Renewal).

One transaction per heartbeat and no advisory locks: the session row first (`FOR UPDATE`), then
for each quoted lease in attempt-id order its run row, its attempt and its lease row — the order
every report and completion takes after its advisory lock, so none of them waits on a heartbeat
in a cycle. The answer is stored with the heartbeat's number in the same transaction: a repeat of
that number gets the stored answer and changes nothing.
"""

from __future__ import annotations

from typing import Sequence

from sqlalchemy import and_, bindparam

from ..domain.states import LeaseStatus
from ..errors import BadInput, Conflict
from .dispatch_queries import LEASE_LOCKED, SESSION_LOCKED
from .plans import load_attempt, load_run
from .records import HeartbeatAnswer, LeaseQuote, check_id
from .schema import run_attempts, run_dispatch_leases
from .session_rows import update_session
from .session_rules import (
    MAX_QUOTES,
    answer_from_json,
    answer_json,
    check_ms,
    check_quote,
    renewal_fence,
    session_mismatch,
)

_L = run_dispatch_leases
_RENEW = _L.update().where(and_(
    _L.c.attempt_id == bindparam("w_attempt_id"), _L.c.lease_generation == bindparam("w_generation"),
    _L.c.status == LeaseStatus.LEASED.value, _L.c.version == bindparam("w_version")))
_PROJECTION = run_attempts.update().where(and_(
    run_attempts.c.id == bindparam("w_attempt_id"),
    run_attempts.c.lease_generation == bindparam("w_generation")))


class Heartbeats:
    """`heartbeat`: renew the session and the leases it quotes; needs `self.store`."""

    def heartbeat(self, worker_id: str, session_id: str, generation: int, seq: int, *,
                  free_slots: int, worker_clock_ms: int, renewals: Sequence[LeaseQuote],
                  session_lease_ms: int | None, run_lease_ms: int) -> HeartbeatAnswer:
        """Heartbeat number `seq` of a session, renewing every lease in `renewals` it still holds.

        A session that is not the worker's current live one answers `session_ended` (register
        anew); `seq` equal to the last stored number answers the stored answer, lower answers
        `stale`; all three change nothing. Otherwise the session lease is renewed (database time
        + `session_lease_ms`; None keeps a process-long session), `free_slots` (clamped to the
        capacity), the heartbeat time and the clock skew (database time - `worker_clock_ms`) are
        stored, and each quoted lease is renewed to database time + `run_lease_ms` (version + 1,
        the attempt's projection follows) or listed as fenced with its reason
        (`session_rules.renewal_fence`). Expiry alone never fences a renewal.
        """
        check_id("worker id", worker_id, 128)
        check_id("session id", session_id)
        if type(seq) is not int or not 1 <= seq < 2**62:
            raise BadInput("a heartbeat number is a positive integer")
        for name, value in (("free_slots", free_slots), ("worker_clock_ms", worker_clock_ms)):
            if type(value) is not int or not 0 <= value < 2**62:
                raise BadInput(f"{name} must be a non-negative integer")
        check_ms("session_lease_ms", session_lease_ms, optional=True)
        check_ms("run_lease_ms", run_lease_ms)
        if len(renewals) > MAX_QUOTES:
            raise BadInput(f"a heartbeat quotes at most {MAX_QUOTES} leases")
        quotes = sorted({check_quote(q) for q in renewals},
                        key=lambda q: (q.attempt_id, q.lease_generation, q.offer_id, q.lease_token_hash))
        with self.store.write() as conn:
            session = conn.execute(SESSION_LOCKED, {"session_id": session_id}).first()
            now = self.store.now_ms(conn)
            ended = session_mismatch(session, worker_id, generation, now, online_only=False)
            if ended is not None:
                return HeartbeatAnswer(seq, None, session_ended=True, reason=ended)
            if seq == session.heartbeat_seq:  # seq >= 1: its answer was stored with it
                return answer_from_json(session.heartbeat_answer)
            if seq < session.heartbeat_seq:
                return HeartbeatAnswer(seq, session.lease_expires_at_ms, stale=True, reason="stale_seq")
            expires = now + run_lease_ms
            renewed, fenced = [], []
            for quote in quotes:
                load_run(conn, quote.run_id)  # the run row first, as every report locks it
                attempt = load_attempt(conn, quote.attempt_id)
                lease = conn.execute(LEASE_LOCKED, {"attempt_id": quote.attempt_id,
                                                     "generation": quote.lease_generation}).first()
                reason = renewal_fence(quote, lease, attempt, worker_id, session_id, generation)
                if reason is not None:
                    fenced.append((quote.attempt_id, quote.lease_generation, reason))
                    continue
                version = lease.version + 1
                if conn.execute(_RENEW, dict(version=version, expires_at_ms=expires, updated_at_ms=now,
                                             w_attempt_id=lease.attempt_id, w_generation=lease.lease_generation,
                                             w_version=lease.version)).rowcount != 1:
                    raise Conflict(f"lease {lease.lease_generation} of attempt {lease.attempt_id} changed meanwhile")
                conn.execute(_PROJECTION, dict(lease_version=version, lease_expires_at_ms=expires,
                                               w_attempt_id=lease.attempt_id, w_generation=lease.lease_generation))
                renewed.append((quote.attempt_id, quote.lease_generation, version, expires))
            session_expires = now + session_lease_ms if session_lease_ms is not None else None
            answer = HeartbeatAnswer(seq, session_expires, tuple(renewed), tuple(fenced))
            update_session(conn, session, now, lease_expires_at_ms=session_expires, heartbeat_at_ms=now,
                           free_slots=max(0, min(free_slots, session.capacity)),
                           clock_skew_ms=now - worker_clock_ms, heartbeat_seq=seq,
                           heartbeat_answer=answer_json(answer))
            return answer
