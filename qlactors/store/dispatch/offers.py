"""Store: offers, a Pull's (offer id, lease token hash) pairs answered with up to that many claimed
attempts, each under a new lease, in one short transaction (SEMANTICS.md §4 step 1, §9 Offers).

Lock order, the global one of §9 (advisory locks in key order, then the session row, then run,
attempt and lease rows): the tasks a batch may serve are read first without a lock, their
advisory locks (`task:<id>`) taken in task-id order, then the session row (capacity is counted
under it, so one session never oversells), then the candidate runs (`FOR UPDATE SKIP LOCKED`,
so concurrent pulls never wait on each other's rows). A fenced report takes `attempt:<id>`,
then `task:<id>`, then the session row: the same order, so the two never wait in a cycle.
On SQLite (one writer, no advisory locks) the look-ahead is skipped and no task filter applies.
The commit is not fsynced (`durable=False`): an offer lost in a power failure is offered again.
"""

from __future__ import annotations

import json
import logging
from typing import Callable, Sequence

from sqlalchemy import bindparam, literal_column, select
from sqlalchemy.engine import Connection

from ...domain.model import Command, env_from_json
from ...domain.states import AttemptStatus, LeaseStatus, RunStatus
from ...domain.transitions import plan_offer, plan_offer_unencodable
from ...errors import BadInput, Conflict
from ..engine import Store
from ..plans import (
    apply_plan,
    attempt_snapshot,
    events_together,
    load_attempt,
    load_attempts,
    load_run,
    run_snapshot,
)
from ..postgres import NOW_SQL, keep_time
from ..records import Fenced, OfferView, check_hash, check_id, same_hash
from ..schema import run_dispatch_leases
from ..views import cwd_from_column
from .dispatch_queries import (
    CLAIMED_ATTEMPT_UPDATE,
    LEASED_COUNT,
    MAX_GENERATION,
    OFFER_REVISION,
    SESSION,
    SESSION_LOCKED,
    busy,
    dispatchable,
)
from .evidence import NO_EVIDENCE
from .offer_queries import KINDS, candidate_tasks, claim_candidates, labels_param
from .request_answers import FIRST_PULL_ANSWER, AnswerKey, PullAnswer, decode, keep_answers
from .session_rules import session_mismatch

log = logging.getLogger("qlactors.dispatch")

ACTOR = "executor"
MAX_ERROR_SUMMARY = 512
MAX_BATCH = 256
# Rounds of claiming per batch: a round comes up short only when a pick changed between the
# query and its lock, its task filled up within the batch, or its offer could not be encoded.
_MAX_ROUNDS = 8
# How many of the oldest candidates (per kind, per pair) the unlocked look at the tasks reads.
_TASK_LOOKAHEAD = 4

_A, _R, _L = AttemptStatus, RunStatus, LeaseStatus
_UNENCODABLE = object()  # the pick ended OFFER_UNENCODABLE: look at the next candidate
_TAKEN = object()  # the pair's offer id was used meanwhile by a concurrent pull: the pair yields nothing
# The attempt's lease projection, as an offer quotes it.
_PROJECTION = ("offer_id", "lease_generation", "lease_version", "worker_id", "session_id",
               "session_generation")
_SESSION_TIMED = SESSION.add_columns(literal_column(NOW_SQL).label("db_now_ms"))
# The session's live leases (its capacity taken), the leases of the Pull's offer ids (a repeated
# Pull) and the Pull's first answer in the ledger (a repeat of it; NULL without a ledger), in one
# statement read under the session row lock: one row at least, with the count and no lease, else
# one row per lease found, each with the count.
_ONE_ROW = select(literal_column("1").label("one")).subquery()
_LEASES_AND_TAKEN = (
    select(LEASED_COUNT.correlate(None).scalar_subquery().label("taken_slots"),
           FIRST_PULL_ANSWER.label("first_answer"), run_dispatch_leases)
    .select_from(_ONE_ROW.outerjoin(run_dispatch_leases, run_dispatch_leases.c.offer_id.in_(
        bindparam("offer_ids", expanding=True)))))


def command_argv(command_json: str) -> tuple[str, ...]:
    """The argv to exec (`Command.exec_argv`); ValueError for a row it cannot read."""
    return Command.from_json(json.loads(command_json)).exec_argv()


class Offers:
    """`batch` (and `one`, its one-pair form)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def one(self, worker_id: str, session_id: str, session_generation: int, offer_id: str,
            lease_token_hash: str, **options) -> OfferView | None:
        """`batch` with one pair: the offer, or None."""
        found = self.batch(worker_id, session_id, session_generation, [(offer_id, lease_token_hash)], **options)
        return found[0] if found else None

    def batch(
        self,
        worker_id: str,
        session_id: str,
        session_generation: int,
        pairs: Sequence[tuple[str, str]],
        *,
        log_cap_bytes: int,
        lease_ttl_ms: int | None = None,
        check: Callable[[OfferView], None] | None = None,
        budget_bytes: int | None = None,
        size: Callable[[OfferView], int] | None = None,
        answer: AnswerKey | None = None,
    ) -> list[OfferView]:
        """Up to `len(pairs)` offers for this session, in pair order, from one transaction.

        A pair whose offer id already has a lease is a repeated Pull: that lease still `leased`,
        of this session, with the same token hash and its attempt still `claimed` answers the
        same offer again (no second lease); otherwise the pair yields nothing (pull with a fresh
        id). The other pairs each claim one dispatchable attempt, oldest first, never beyond the
        session's free capacity (capacity minus its leases of non-terminal attempts) nor a
        task's pinned `max_concurrent` (counted under the task's advisory lock, so a batch and
        concurrent batches never oversell), only from revisions whose required labels the
        session has. Raises `Fenced` when the session is not the worker's current, online,
        unexpired one. `lease_ttl_ms` None: the leases live as long as the runtime (edge).

        Dispatchable: no cancel intent, the attempt `claimed`, the not-before time reached, and
        the run `queued` or `dispatching` with no live lease (a declined claim, offered again
        under a new lease generation: there is no `dispatching -> queued` edge).

        Each offer is built from the pinned revision and given to `check` (the caller's encoder:
        ValueError for an offer the wire cannot carry) before its lease is written; such a pick
        ends `failed` (OFFER_UNENCODABLE) in this transaction and the next candidate is looked
        at. With `budget_bytes`, the batch stops before the sum of `size(view)` would pass it;
        the first offer always goes (the frame's limit for one offer is `check`'s business).

        `answer` names the Pull's request for the ledger (a cluster replica): a Pull whose first
        answer is kept replays exactly that answer's offers that are still live (by `_replay`)
        and claims nothing, whatever pairs the first left unused; a first answer is kept.
        """
        check_id("worker id", worker_id, 128)
        check_id("session id", session_id)
        pairs = [(check_id("offer id", o), check_hash("lease token hash", h)) for o, h in pairs]
        if not 1 <= len(pairs) <= MAX_BATCH or len({o for o, _ in pairs}) != len(pairs):
            raise BadInput(f"a pull carries 1 to {MAX_BATCH} pairs with distinct offer ids")
        if type(log_cap_bytes) is not int or log_cap_bytes < 0:
            raise BadInput("log_cap_bytes must be a non-negative integer")
        if lease_ttl_ms is not None and (type(lease_ttl_ms) is not int or lease_ttl_ms < 1):
            raise BadInput("lease_ttl_ms must be a positive integer or None")
        if budget_bytes is not None and (size is None or type(budget_bytes) is not int):
            raise BadInput("budget_bytes is an integer and needs size()")
        with self.store.write(durable=False) as conn, events_together(conn):
            return _Batch(self.store, conn, worker_id, session_id, session_generation, pairs,
                          log_cap_bytes, lease_ttl_ms, check, budget_bytes, size, answer=answer).run()


class _Batch:
    """One `Offers.batch` transaction's state: the session, the pairs left, the picks and the budget."""

    def __init__(self, store, conn, worker_id, session_id, generation, pairs, log_cap_bytes,
                 lease_ttl_ms, check, budget_bytes, size, *, answer: AnswerKey | None = None) -> None:
        self.store, self.conn = store, conn
        self.worker_id, self.session_id, self.generation = worker_id, session_id, generation
        self.pairs, self.log_cap_bytes, self.lease_ttl_ms = pairs, log_cap_bytes, lease_ttl_ms
        self.check, self.budget, self.size = check, budget_bytes, size
        self.answer = answer  # the Pull's request, for the ledger (None: edge, no ledger)
        self.used = 0
        self.offers: dict[str, OfferView] = {}
        # Read once per batch: a task's dispatched runs (only this batch adds to them while it
        # holds the task's lock) and the revisions its offers are built from.
        self.dispatched: dict[str, int] = {}
        self.revisions: dict[tuple[str, int], object] = {}

    def _fenced(self, session, now: int) -> None:
        detail = session_mismatch(session, self.worker_id, self.generation, now, online_only=True)
        if detail is not None:
            raise Fenced(f"session {self.session_id} of worker {self.worker_id!r} cannot pull ({detail}); "
                         "register a new session")

    def run(self) -> list[OfferView]:
        conn, store = self.conn, self.store
        tasks: list[str] | None = None  # None: no task filter (SQLite has one writer: no locks)
        if store.is_postgres:
            # For its labels, and the transaction's time in the same statement.
            early = conn.execute(_SESSION_TIMED, {"session_id": self.session_id}).first()
            now = keep_time(conn, early.db_now_ms) if early is not None else store.now_ms(conn)
            self._fenced(early, now)
            tasks = candidate_tasks(conn, store.dialect_name, labels_param(early.labels_json), now,
                                    _TASK_LOOKAHEAD * len(self.pairs) + 8)
            store.advisory_locks(conn, [f"task:{t}" for t in tasks])  # in task-id order, before any row lock
        session = conn.execute(SESSION_LOCKED, {"session_id": self.session_id}).first()
        now = store.now_ms(conn)
        self._fenced(session, now)
        # Read under the session row lock, which serialises this session's pulls: the same Pull
        # sent to two replicas at once (a failover repeat) then finds the leases the first wrote.
        key = self.answer
        rows = conn.execute(_LEASES_AND_TAKEN, {"offer_ids": [o for o, _ in self.pairs],
                                                "session_id": self.session_id,
                                                "ledger_worker_id": key.worker_id if key else None,
                                                "ledger_request_id": key.request_id if key else None}).all()
        existing = {r.offer_id: r for r in rows if r.offer_id is not None}
        if key is not None and rows[0].first_answer is not None:  # a repeat: its first answer again
            hashes = dict(self.pairs)
            first = decode(PullAnswer, rows[0].first_answer).offer_ids
            views = (self._replay(existing[o], hashes.get(o)) for o in first if o in existing)
            return [view for view in views if view is not None]
        fresh = [(o, h) for o, h in self.pairs if o not in existing]
        for offer_id, token_hash in self.pairs:
            if offer_id in existing:
                view = self._replay(existing[offer_id], token_hash)
                if view is not None:
                    self.offers[offer_id] = view
        free = session.capacity - rows[0].taken_slots
        if fresh and tasks != [] and free > 0:
            self._claim_fresh(session, fresh[:free], labels_param(session.labels_json), tasks, now)
        answered = [self.offers[o] for o, _ in self.pairs if o in self.offers]
        if key is not None:
            keep_answers(conn, [(key, PullAnswer(tuple(v.offer_id for v in answered)))], now)
        return answered

    def _claim_fresh(self, session, fresh, labels, tasks, now) -> None:
        skip_runs: list[str] = []
        full_tasks: list[str] = []
        left = list(fresh)
        for _ in range(_MAX_ROUNDS):
            progressed = False
            for kind in KINDS:
                if not left:
                    return
                picks = claim_candidates(self.conn, self.store.dialect_name, kind, labels=labels, now=now,
                                         limit=len(left), tasks=tasks, skip_runs=skip_runs,
                                         skip_tasks=full_tasks)
                attempts = load_attempts(self.conn, [pick.attempt_id for pick in picks])
                for pick in picks:
                    if not left:
                        return
                    skip_runs.append(pick.id)
                    if pick.task_id in full_tasks:
                        continue
                    attempt = attempts.get(pick.attempt_id)
                    if not dispatchable(self.conn, pick, attempt):
                        continue  # changed between the query's snapshot and its lock
                    if self._busy(pick) >= pick.max_concurrent:
                        full_tasks.append(pick.task_id)  # filled up (within this batch, or just now)
                        continue
                    outcome = self._claim(pick, attempt, session, left[0], now)
                    if outcome is _UNENCODABLE:
                        progressed = True
                        continue
                    if outcome is _TAKEN:
                        left.pop(0)
                        skip_runs.pop()  # not claimed: it may serve the next pair
                        progressed = True
                        continue
                    if outcome is None:  # over the budget: the batch is complete
                        return
                    self.offers[left[0][0]] = outcome
                    if pick.status == _R.QUEUED.value:
                        self.dispatched[pick.task_id] += 1  # `queued -> dispatching`
                    left.pop(0)
                    progressed = True
            if not progressed:
                return

    def _busy(self, pick) -> int:
        """The task's other dispatched runs (`dispatching|running`, the pick excluded)."""
        if pick.task_id not in self.dispatched:
            self.dispatched[pick.task_id] = busy(self.conn, pick.task_id, "")
        return self.dispatched[pick.task_id] - (pick.status == _R.DISPATCHING.value)

    def _claim(self, run, attempt, session, pair, now) -> OfferView | object | None:
        conn = self.conn
        offer_id, token_hash = pair
        if attempt.lease_generation is None and run.status == _R.QUEUED.value:
            generation = 1  # never offered (`queued` has no way back from `dispatching`): no lease yet
        else:
            generation = conn.execute(MAX_GENERATION, {"attempt_id": attempt.id}).scalar_one() + 1
        expires = now + self.lease_ttl_ms if self.lease_ttl_ms is not None else None
        projection = dict(offer_id=offer_id, lease_generation=generation, lease_version=1,
                          lease_expires_at_ms=expires, worker_id=session.worker_id,
                          session_id=session.session_id, session_generation=session.generation,
                          log_cap_bytes=self.log_cap_bytes)  # its log chunks are bounded by it (§13)
        try:  # exactly the offer the lease below would grant
            view = build_view(conn, run, attempt, projection, self.log_cap_bytes, self.revisions)
            if self.check is not None:
                self.check(view)
        except ValueError as err:
            self._end_unencodable(run, attempt, now, err)
            return _UNENCODABLE
        if self.budget is not None:
            cost = self.size(view)
            if self.offers and self.used + cost > self.budget:
                return None
            self.used += cost
        if not self.store.insert_new(conn, run_dispatch_leases, dict(
                attempt_id=attempt.id, lease_generation=generation, run_id=run.id,
                status=_L.LEASED.value, version=1, worker_id=session.worker_id,
                session_id=session.session_id, session_generation=session.generation,
                token_hash=token_hash, offer_id=offer_id, expires_at_ms=expires,
                release_reason=None, created_at_ms=now, updated_at_ms=now)):
            # The offer id was used meanwhile (a concurrent pull with the same pair): not ours.
            if self.budget is not None:
                self.used -= cost
            return _TAKEN
        # A new lease: whatever was known about an earlier one says nothing about it.
        if run.status == _R.QUEUED.value:
            apply_plan(conn, plan_offer(run_snapshot(run), attempt_snapshot(attempt)), now,
                       actor_type=ACTOR, expected_callback_sequence=attempt.callback_sequence,
                       attempt_values=dict(projection, **NO_EVIDENCE))
        else:  # a re-offer of a declined claim: the run is already `dispatching`, no status change
            changed = conn.execute(CLAIMED_ATTEMPT_UPDATE, dict(
                projection, **NO_EVIDENCE, updated_at_ms=now, w_id=attempt.id)).rowcount
            if changed != 1:
                raise Conflict(f"attempt {attempt.id} changed meanwhile")
        return view

    def _end_unencodable(self, run, attempt, now: int, err: ValueError) -> None:
        """Attempt and run `failed` (OFFER_UNENCODABLE): the pick is offered through `dispatching`
        (the run table's only way out of `queued` but a cancel) and ends there, with no lease."""
        conn = self.conn
        if run.status == _R.QUEUED.value:
            apply_plan(conn, plan_offer(run_snapshot(run), attempt_snapshot(attempt)), now,
                       actor_type=ACTOR, expected_callback_sequence=attempt.callback_sequence)
            run = load_run(conn, run.id)
        summary = f"no offer can carry this task revision: {err}"[:MAX_ERROR_SUMMARY]
        # The reason names the rule that failed, never a value (codec and posix errors never echo one).
        log.error("event=offer_unencodable run=%s attempt=%s task=%s revision=%s error=%s",
                  run.id, attempt.id, run.task_id, run.task_revision, err)
        apply_plan(conn, plan_offer_unencodable(run_snapshot(run), attempt_snapshot(attempt)), now,
                   actor_type=ACTOR, expected_callback_sequence=attempt.callback_sequence,
                   run_values={"error_summary": summary}, attempt_values={"error_summary": summary})

    def _replay(self, lease, token_hash) -> OfferView | None:
        """The same pull again (its answer was lost): the same offer, or None if it is no longer live."""
        if (lease.session_id != self.session_id or lease.status != _L.LEASED.value
                or not same_hash(lease.token_hash, token_hash)):
            return None
        attempt = load_attempt(self.conn, lease.attempt_id)
        run = load_run(self.conn, lease.run_id)
        if attempt.status != _A.CLAIMED.value or run.cancel_reason is not None:
            return None
        cap = attempt.log_cap_bytes if attempt.log_cap_bytes is not None else self.log_cap_bytes
        return build_view(self.conn, run, attempt, {n: getattr(attempt, n) for n in _PROJECTION}, cap)


def build_view(conn: Connection, run, attempt, projection: dict, log_cap_bytes: int,
               revisions: dict | None = None) -> OfferView:
    """The offer of `attempt` under the lease `projection`; ValueError when the revision cannot
    be read. `revisions` keeps the revisions read (a batch's), by task id and revision."""
    key = (run.task_id, run.task_revision)
    rev = revisions.get(key) if revisions is not None else None
    if rev is None:
        rev = conn.execute(OFFER_REVISION, {"task_id": run.task_id, "revision": run.task_revision}).one()
        if revisions is not None:
            revisions[key] = rev
    return OfferView(
        run_id=run.id, attempt_id=attempt.id, attempt_number=attempt.number,
        **{name: projection[name] for name in _PROJECTION},
        task=rev.task_name, argv=command_argv(rev.command_json), cwd=cwd_from_column(rev.cwd),
        env=env_from_json(json.loads(rev.env_json)),
        timeout_ms=rev.timeout_ms, stop_grace_ms=rev.stop_grace_ms, log_cap_bytes=log_cap_bytes,
        keep_leftovers=bool(rev.keep_leftovers))
