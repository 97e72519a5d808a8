"""Store: numbered heartbeats and the lease renewals they carry (SEMANTICS.md §9 Sessions, Renewal).

One transaction per heartbeat and no advisory locks: the session row first (`FOR UPDATE`), then
the quoted leases' run rows, attempts and lease rows, each in id order (`report_locks.lock_rows`,
one statement per table) — the order every report and completion takes after its advisory
locks, so none of them waits on a heartbeat in a cycle. The renewals are one update of the
leases and one of their attempts' projections, whatever their number. The answer is stored
with the heartbeat's number in the same transaction: a repeat of that number gets the stored
answer and changes nothing.
"""

from __future__ import annotations

from typing import Sequence

from sqlalchemy import and_, bindparam, select, tuple_

from ...domain.states import LeaseStatus
from ...domain.transitions import plan_evidence_withdrawn
from ...errors import BadInput, Conflict
from ..engine import Store
from ..plans import apply_plan, attempt_snapshot, run_snapshot
from ..records import HeartbeatAnswer, LeaseQuote, check_id
from ..schema import run_attempts, run_dispatch_leases
from .dispatch_queries import SESSION_LOCKED
from .evidence import NO_EVIDENCE
from .report_locks import HeldRows, lock_rows
from .session_rows import update_session
from .session_rules import (
    MAX_QUOTES,
    answer_from_json,
    answer_json,
    check_ms,
    clock_skew,
    check_quote,
    renewal_fence,
    session_mismatch,
)

_L = run_dispatch_leases
_A = run_attempts
# The locked, checked leases renewed together (version + 1 each) and their attempts' projections.
_RENEW = (_L.update()
          .where(and_(tuple_(_L.c.attempt_id, _L.c.lease_generation).in_(bindparam("pairs", expanding=True)),
                      _L.c.status == LeaseStatus.LEASED.value))
          .values(version=_L.c.version + 1, expires_at_ms=bindparam("expires"), updated_at_ms=bindparam("now"))
          .returning(_L.c.attempt_id, _L.c.lease_generation, _L.c.version))
_PROJECTION = (_A.update()
               .where(tuple_(_A.c.id, _A.c.lease_generation).in_(bindparam("pairs", expanding=True)))
               .values(lease_version=select(_L.c.version).where(and_(
                   _L.c.attempt_id == _A.c.id, _L.c.lease_generation == _A.c.lease_generation))
                   .scalar_subquery(), lease_expires_at_ms=bindparam("expires")))


class Heartbeats:
    """`apply` a heartbeat: renew the session and the leases it quotes."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def apply(self, worker_id: str, session_id: str, generation: int, seq: int, *,
              free_slots: int, worker_clock_ms: int, renewals: Sequence[LeaseQuote],
              session_lease_ms: int | None, run_lease_ms: int) -> HeartbeatAnswer:
        """Heartbeat number `seq` of a session, renewing every lease in `renewals` it still holds.

        A session that is not the worker's current live one answers `session_ended` (register
        anew); `seq` equal to the last stored number answers the stored answer, lower answers
        `stale`; all three change nothing. Otherwise the session lease is renewed (database time
        + `session_lease_ms`; None keeps a process-long session), `free_slots` (clamped to the
        capacity), the heartbeat time and the clock skew (database time - `worker_clock_ms`) are
        stored, and each quoted lease is renewed to database time + `run_lease_ms` (version + 1,
        the attempt's projection follows; evidence it contradicts is withdrawn) or listed as
        fenced with its reason (`session_rules.renewal_fence`). Expiry never fences a renewal."""
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
                return HeartbeatAnswer(seq, session.lease_expires_at_ms, stale=True, reason="stale_seq",
                                       last_seq=session.heartbeat_seq)
            expires = now + run_lease_ms
            rows = HeldRows(now)
            lock_rows(conn, rows, run_ids=sorted({q.run_id for q in quotes}),
                      attempt_ids=sorted({q.attempt_id for q in quotes}),
                      pairs=sorted({(q.attempt_id, q.lease_generation) for q in quotes}))
            fenced, renewable = [], []
            for quote in quotes:
                pair = (quote.attempt_id, quote.lease_generation)
                reason = renewal_fence(quote, rows.leases.get(pair), rows.attempts.get(quote.attempt_id),
                                       worker_id, session_id, generation)
                if reason is not None:
                    fenced.append((*pair, reason))
                elif pair not in renewable:
                    renewable.append(pair)
            renewed = self._renew(conn, renewable, expires, now)
            _withdraw_evidence(conn, rows, renewable, now)
            session_expires = now + session_lease_ms if session_lease_ms is not None else None
            answer = HeartbeatAnswer(seq, session_expires, renewed, tuple(fenced))
            update_session(conn, session, now, lease_expires_at_ms=session_expires, heartbeat_at_ms=now,
                           free_slots=max(0, min(free_slots, session.capacity)),
                           clock_skew_ms=clock_skew(now, worker_clock_ms), heartbeat_seq=seq,
                           heartbeat_answer=answer_json(answer))
            return answer

    @staticmethod
    def _renew(conn, pairs: list[tuple[str, int]], expires: int, now: int) -> tuple:
        """Renew the checked, locked leases `pairs` to `expires`; (attempt, generation, version,
        expires) for each, in their order."""
        if not pairs:
            return ()
        versions = {(r.attempt_id, r.lease_generation): r.version
                    for r in conn.execute(_RENEW, {"pairs": pairs, "expires": expires, "now": now})}
        if len(versions) != len(pairs):
            raise Conflict(f"{len(pairs) - len(versions)} of {len(pairs)} renewed leases changed meanwhile")
        conn.execute(_PROJECTION, {"pairs": pairs, "expires": expires})
        return tuple((a, g, versions[(a, g)], expires) for a, g in pairs)


def _withdraw_evidence(conn, rows: HeldRows, renewed: list[tuple[str, int]], now: int) -> None:
    """A renewal of generation N proves the worker holds that lease: a not-running fact recorded
    for generation N (an operator's `confirm-stopped`, an attestation) cannot stand beside it. It
    is cleared here, in the renewal's transaction, with an `attempt.evidence_withdrawn` event naming
    what was said, who said it and when (SEMANTICS.md §10 as amended by issue 26). The rows are
    the ones this heartbeat locked; nearly every renewal finds nothing to withdraw."""
    for attempt_id, generation in renewed:
        attempt = rows.attempts.get(attempt_id)
        if attempt is None or attempt.evidence is None or attempt.evidence_lease_generation != generation:
            continue
        run = rows.runs[attempt.run_id]
        plan = plan_evidence_withdrawn(run_snapshot(run), attempt_snapshot(attempt), {
            "fact": attempt.evidence, "by": attempt.evidence_by, "at_ms": attempt.evidence_at_ms,
            "lease_generation": generation})
        apply_plan(conn, plan, now, actor_type="executor", attempt_values=dict(NO_EVIDENCE))
