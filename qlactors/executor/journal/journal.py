"""Executor side: the executor's local journal: one row per attempt it launches, written before the
spawn.
Size: one class over the journal's four tables, each write one short transaction.

On edge the tables live in the same SQLite file as everything else; on a cluster worker in a
local SQLite file of its own (executor/journal/file.py). The control plane's state never
references these paths. Beside the attempt rows: the (offer id, lease token) pairs of each Pull,
journalled before it is sent, the worker's current session (SEMANTICS.md §9 Journal), and the
reports it owes the control side, each kept until its own answer (§9 Owed reports). Every write
is committed before the action it records.

A row cleared while a report about its attempt is still owed is not deleted: it is marked
`clear_pending`, invisible to every reader (`get`, `list`, `walk`), and deleted in the
transaction that settles the last report owed about it.
"""

from __future__ import annotations

import builtins
from typing import Any, Iterable, Iterator, Sequence

from sqlalchemy import and_, bindparam, func, select
from sqlalchemy.engine import Connection

from ...errors import BadInput, Conflict
from ...store.engine import Store
from ...store.records import Identity, check_hash, check_id
from .records import (ACCEPTED, COMPLETED, IN_FLIGHT, LEASE_FACTS, MAX_PAGE, MAX_WORKER_ID, QUARANTINED,
                      JournaledPull, JournalEntry, LeaseFacts, OwedReport, SavedSession, limit_checked,
                      ms_checked, offset_checked, path_checked, positive_checked, secret_checked,
                      state_checked)
from .schema import executor_journal, executor_owed, executor_pulls, executor_session

_J = executor_journal
_O = executor_owed
_VISIBLE = _J.c.clear_pending.is_(False)
# Built once (see store/plans.py): the executor writes its journal several times per job.
_ROW = select(_J).where(_J.c.attempt_id == bindparam("attempt_id")).where(_VISIBLE)
_UPDATE = _J.update().where(_J.c.attempt_id == bindparam("w_attempt_id")).returning(*_J.c)
_UPDATE_FROM = _UPDATE.where(_J.c.state == bindparam("w_state"))
_REBIND = _UPDATE.where(_VISIBLE)
_DELETE = _J.delete().where(_J.c.attempt_id == bindparam("attempt_id"))
_MARK_CLEARED = _J.update().where(_J.c.attempt_id == bindparam("w_attempt_id")).values(clear_pending=True)
_OWED_ABOUT = select(func.count()).select_from(_O).where(_O.c.attempt_id == bindparam("attempt_id"))
_OWED_ONE = select(_O).where(_O.c.request_id == bindparam("request_id"))
_OWED_OF = (select(_O).where(_O.c.attempt_id == bindparam("attempt_id"))
            .order_by(_O.c.created_at_ms, _O.c.request_id).limit(bindparam("limit")))
_OWED_PAGE = select(_O).order_by(_O.c.created_at_ms, _O.c.request_id).limit(bindparam("limit"))
_SETTLE = _O.delete().where(_O.c.request_id == bindparam("request_id"))
_DELETE_CLEARED = _J.delete().where(and_(_J.c.attempt_id == bindparam("attempt_id"), _J.c.clear_pending.is_(True)))
# A shipped offset moves forward only, never past a recorded final offset; the first timeout
# intent sticks.
_SHIP_FORWARD = _UPDATE.where(_J.c.shipped_offset < bindparam("w_offset")).where(
    _J.c.final_offset.is_(None) | (_J.c.final_offset >= bindparam("w_offset")))
_FIRST_INTENT = _UPDATE.where(_J.c.timeout_intent_at_ms.is_(None))
_P = executor_pulls
_S = executor_session


class Journal:
    """Accept, advance, quarantine and clear journal rows; bounded keyset reads."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def accept(self, attempt_id: str, run_id: str, log_path: str, receipt_path: str,
               callback_token_hash: str, lease: LeaseFacts | None = None) -> bool:
        """Journal an accepted offer (`accepted`); False when this attempt is journaled past `accepted`.

        `lease` is the offer's fence (a cluster worker records it to quote it in an Attest after
        a restart). A row still `accepted` is an earlier offer of the same attempt that was never
        activated here (its lease was released and it was offered again): it takes the new token
        hash and lease, and the call answers True. A row `launching` or later means this executor
        may have started it: never accept it twice.
        """
        check_id("attempt id", attempt_id)
        check_id("run id", run_id)
        check_hash("callback token hash", callback_token_hash)
        facts = _lease_columns(lease)
        values = dict(attempt_id=attempt_id, run_id=run_id, state=ACCEPTED,
                      log_path=path_checked("log path", log_path),
                      receipt_path=path_checked("receipt path", receipt_path),
                      callback_token_hash=callback_token_hash, **facts)
        with self.store.write(durable=False) as conn:
            now = self.store.now_ms(conn)
            if self.store.insert_new(conn, _J, dict(values, created_at_ms=now, updated_at_ms=now)):
                return True
            again = conn.execute(_UPDATE_FROM, dict(
                callback_token_hash=callback_token_hash, updated_at_ms=now, w_attempt_id=attempt_id,
                w_state=ACCEPTED, clear_pending=False, **facts)).first()
            return again is not None

    def rebind(self, attempt_id: str, lease_generation: int, offer_id: str, lease_token: str,
               session_id: str, session_generation: int, *, settle: str | None = None) -> JournalEntry:
        """Record the lease an accepted `Attest` (running) re-bound the attempt to (§9 Re-attest);
        with `settle`, that Attest's owed row goes in the same transaction (no restart finds it
        answered and the re-bind unrecorded)."""
        facts = LeaseFacts(offer_id, lease_generation, lease_token, session_id, session_generation)
        with self.store.write(durable=False) as conn:
            updated = conn.execute(_REBIND, dict(facts.columns(), updated_at_ms=self.store.now_ms(conn),
                                                 w_attempt_id=attempt_id)).first()
            if updated is None:  # none, or cleared (the attempt ended): `settle` goes the usual way
                raise Conflict(f"no journal row for attempt {attempt_id}")
            if settle is not None:
                conn.execute(_SETTLE, {"request_id": settle})
            return JournalEntry.from_row(updated)

    def activated(self, attempt_id: str, activated_at_ms: int, local_deadline_ms: int | None) -> JournalEntry:
        """Record the activation on this executor's own clock and the deadline it derives from it
        (activation + timeout; None without a timeout): "finished in time" is judged on it (§5)."""
        ms_checked("activated_at_ms", activated_at_ms)
        if local_deadline_ms is not None and ms_checked("local_deadline_ms", local_deadline_ms) < activated_at_ms:
            raise BadInput("local_deadline_ms must not be before activated_at_ms")
        with self.store.write(durable=False) as conn:
            return self._update(conn, attempt_id, {"activated_at_ms": activated_at_ms,
                                                   "local_deadline_ms": local_deadline_ms}, None)

    def timeout_intent(self, attempt_id: str, at_ms: int) -> JournalEntry:
        """Commit a local timeout intent before stopping the job (no replica reachable, §7).

        The first intent sticks: a repeat keeps the earlier time and answers the row as it is.
        """
        ms_checked("at_ms", at_ms)
        with self.store.write() as conn:
            updated = conn.execute(_FIRST_INTENT, dict(
                timeout_intent_at_ms=at_ms, updated_at_ms=self.store.now_ms(conn),
                w_attempt_id=attempt_id)).first()
            return JournalEntry.from_row(updated) if updated is not None else self._row(conn, attempt_id)

    def shipped(self, attempt_id: str, offset: int) -> JournalEntry:
        """Record that the control side acknowledged the log up to `offset` (it only moves forward,
        never past a recorded final offset); an older acknowledgement changes nothing."""
        offset_checked(offset)
        with self.store.write(durable=False) as conn:
            updated = conn.execute(_SHIP_FORWARD, dict(shipped_offset=offset, updated_at_ms=self.store.now_ms(conn),
                                                       w_attempt_id=attempt_id, w_offset=offset)).first()
            if updated is not None:
                return JournalEntry.from_row(updated)
            entry = self._row(conn, attempt_id)
            if entry.final_offset is not None and offset > entry.final_offset:
                raise Conflict(f"attempt {attempt_id}: shipped offset {offset} is past its final offset "
                               f"{entry.final_offset}")
            return entry

    def final_offset(self, attempt_id: str, offset: int) -> JournalEntry:
        """Record the log's final length before `Completed` carries it (§13); set once."""
        offset_checked(offset)
        with self.store.write() as conn:
            entry = self._row(conn, attempt_id)
            if entry.final_offset == offset:
                return entry
            if entry.final_offset is not None:
                raise Conflict(f"attempt {attempt_id} already has the final offset {entry.final_offset}")
            if offset < entry.shipped_offset:
                raise Conflict(f"attempt {attempt_id}: final offset {offset} is before the shipped "
                               f"offset {entry.shipped_offset}")
            return self._update(conn, attempt_id, {"final_offset": offset}, None)

    def complete(self, attempt_id: str, purge_after_ms: int) -> JournalEntry:
        """The control side answered the completion: keep the row `completed` while the log's tail
        is shipped, and its local log until `purge_after_ms` (executor/log_retention.py)."""
        ms_checked("purge_after_ms", purge_after_ms)
        with self.store.write() as conn:
            return self._update(conn, attempt_id, {"state": COMPLETED, "purge_after_ms": purge_after_ms}, None)

    def set_state(self, attempt_id: str, state: str, *, identity: Any = None,
                  expected: str | None = None) -> JournalEntry:
        """Move a row to `state` (recording the identity when given), only from `expected` when given.

        Raises Conflict when there is no row, or when its state is not `expected`.
        """
        state_checked(state)
        if expected is not None:
            state_checked(expected)
        values: dict[str, Any] = {"state": state}
        if identity is not None:
            ident = Identity.of(identity)
            values.update(boot_id=ident.boot_id, pid=ident.pid, pgid=ident.pgid,
                          start_ticks=ident.start_ticks)
        with self.store.write(durable=False) as conn:
            return self._update(conn, attempt_id, values, expected)

    def quarantine(self, attempt_id: str, purge_after_ms: int) -> JournalEntry:
        """Commit the row as `quarantined` before its receipt file is moved (SEMANTICS.md §3, §5)."""
        if type(purge_after_ms) is not int or purge_after_ms < 0:
            raise BadInput("purge_after_ms must be a non-negative integer")
        with self.store.write() as conn:
            return self._update(conn, attempt_id, {"state": QUARANTINED, "purge_after_ms": purge_after_ms}, None)

    def clear(self, attempt_id: str) -> bool:
        """Delete the row (after its completion committed and its receipt was removed); True when
        it is gone now. While a report about the attempt is owed the row only waits (hidden) for
        the answer to the last one (`settle`), so it is never lost before that answer."""
        with self.store.write(durable=False) as conn:
            if conn.execute(_OWED_ABOUT, {"attempt_id": attempt_id}).scalar_one():
                conn.execute(_MARK_CLEARED, {"w_attempt_id": attempt_id})
                return False
            return conn.execute(_DELETE, {"attempt_id": attempt_id}).rowcount == 1

    def get(self, attempt_id: str) -> JournalEntry | None:
        with self.store.read() as conn:
            row = conn.execute(_ROW, {"attempt_id": attempt_id}).first()
            return JournalEntry.from_row(row) if row is not None else None

    def entries(self, attempt_ids: Sequence[str]) -> dict[str, JournalEntry]:
        """The rows of those of `attempt_ids` that have one (not cleared ones), by attempt id."""
        found: dict[str, JournalEntry] = {}
        with self.store.read() as conn:
            for chunk in _chunks(attempt_ids):
                for row in conn.execute(select(_J).where(_J.c.attempt_id.in_(chunk)).where(_VISIBLE)):
                    found[row.attempt_id] = JournalEntry.from_row(row)
        return found

    def held(self, attempt_ids: Sequence[str]) -> set[str]:
        """Those of `attempt_ids` with a row, cleared ones included (a row whose clearing waits for
        an owed report's answer still holds its run back from retention)."""
        found: set[str] = set()
        with self.store.read() as conn:
            for chunk in _chunks(attempt_ids):
                found.update(conn.execute(select(_J.c.attempt_id).where(_J.c.attempt_id.in_(chunk))).scalars())
        return found

    def list(self, states: Iterable[str] | None = None, limit: int = 64,
             after: str | None = None, *, unretained: bool = False) -> builtins.list[JournalEntry]:
        """Rows in `states` (all when None), ascending attempt id, after `after`; at most `limit`.

        `unretained`: only rows not handed to retention yet (no `purge_after_ms`): a `completed`
        row with one is a cluster worker's finished attempt whose log is kept a while.
        """
        query = select(_J).where(_VISIBLE)
        if unretained:
            query = query.where(_J.c.purge_after_ms.is_(None))
        if states is not None:
            wanted = [state_checked(s) for s in states]
            query = query.where(_J.c.state.in_(wanted))
        if after is not None:
            query = query.where(_J.c.attempt_id > after)
        query = query.order_by(_J.c.attempt_id).limit(limit_checked(limit))
        with self.store.read() as conn:
            return [JournalEntry.from_row(r) for r in conn.execute(query)]

    def due_purge(self, now_ms: int, limit: int = 32) -> builtins.list[JournalEntry]:
        """Quarantined rows whose retention ended by `now_ms`, oldest first."""
        if type(now_ms) is not int:
            raise BadInput("now_ms must be an integer")
        query = (select(_J).where(and_(_VISIBLE, _J.c.state == QUARANTINED, _J.c.purge_after_ms.is_not(None),
                                       _J.c.purge_after_ms <= now_ms))
                 .order_by(_J.c.purge_after_ms, _J.c.attempt_id).limit(limit_checked(limit)))
        with self.store.read() as conn:
            return [JournalEntry.from_row(r) for r in conn.execute(query)]

    def walk(self, states: Iterable[str] = IN_FLIGHT, page: int = 64) -> Iterator[JournalEntry]:
        """Every row in `states`, ascending attempt id, page after page (a short read per page, each
        after the caller handled the one before, so it may clear rows as it goes): the post-start
        probe, log shipping's restart."""
        wanted = tuple(states)
        after = None
        while True:
            rows = self.list(wanted, page, after)
            yield from rows
            if len(rows) < page:
                return
            after = rows[-1].attempt_id

    def due_logs(self, now_ms: int, limit: int = 32) -> builtins.list[JournalEntry]:
        """`completed` rows whose log was acknowledged to its final offset and whose retention
        ended by `now_ms`, oldest first (executor/log_retention.py)."""
        ms_checked("now_ms", now_ms)
        query = (select(_J).where(and_(_VISIBLE, _J.c.state == COMPLETED, _J.c.final_offset.is_not(None),
                                       _J.c.shipped_offset >= _J.c.final_offset,
                                       _J.c.purge_after_ms.is_not(None), _J.c.purge_after_ms <= now_ms))
                 .order_by(_J.c.purge_after_ms, _J.c.attempt_id).limit(limit_checked(limit)))
        with self.store.read() as conn:
            return [JournalEntry.from_row(r) for r in conn.execute(query)]

    # -- pulls (§9 Offers) --------------------------------------------------------------------

    def journal_pull(self, pull_id: str, pairs: Sequence[tuple[str, str]]) -> None:
        """Journal a Pull's (offer id, lease token) pairs before it is sent. Repeating the same
        pull is a no-op; an offer id already journalled for another pull or token is a Conflict."""
        check_id("pull id", pull_id)
        if not 1 <= len(pairs) <= MAX_PAGE:
            raise BadInput(f"a pull journals 1 to {MAX_PAGE} (offer id, lease token) pairs")
        for offer_id, lease_token in pairs:
            check_id("offer id", offer_id)
            secret_checked("lease token", lease_token)
        with self.store.write(durable=False) as conn:
            now = self.store.now_ms(conn)
            for offer_id, lease_token in pairs:
                row = dict(offer_id=offer_id, pull_id=pull_id, lease_token=lease_token, created_at_ms=now)
                if self.store.insert_new(conn, _P, row):
                    continue
                held = conn.execute(select(_P).where(_P.c.offer_id == offer_id)).one()
                if (held.pull_id, held.lease_token) != (pull_id, lease_token):
                    raise Conflict(f"offer id {offer_id} is already journalled for another pull")

    def open_pulls(self) -> builtins.list[JournaledPull]:
        """The journalled pulls with pairs still unanswered, oldest first (to repeat them)."""
        query = select(_P).order_by(_P.c.created_at_ms, _P.c.pull_id, _P.c.offer_id).limit(MAX_PAGE)
        pulls: dict[str, JournaledPull] = {}
        with self.store.read() as conn:
            for row in conn.execute(query):
                held = pulls.get(row.pull_id)
                pairs = (held.pairs if held else ()) + ((row.offer_id, row.lease_token),)
                pulls[row.pull_id] = JournaledPull(row.pull_id, pairs, held.created_at_ms if held
                                                   else row.created_at_ms)
        return builtins.list(pulls.values())

    def clear_pull(self, pull_id: str) -> int:
        """Forget a pull once answered (its offers journalled or declined); the pairs removed."""
        with self.store.write(durable=False) as conn:
            return conn.execute(_P.delete().where(_P.c.pull_id == pull_id)).rowcount

    def clear_offer(self, offer_id: str) -> bool:
        """Forget one pair of a pull once its offer was answered (journalled, or declined)."""
        with self.store.write(durable=False) as conn:
            return conn.execute(_P.delete().where(_P.c.offer_id == offer_id)).rowcount == 1

    # -- owed reports (§9 Owed reports) -------------------------------------------------------

    def owe(self, request_id: str, kind: str, attempt_id: str | None, body: bytes) -> None:
        """Journal a report before it is first sent (its encoded body, re-sent unchanged until its
        own answer); the same request again is a no-op."""
        check_id("request id", request_id)
        if attempt_id is not None:
            check_id("attempt id", attempt_id)
        if type(body) is not bytes or not body:
            raise BadInput("an owed report's body is the encoded message")
        with self.store.write() as conn:
            self.store.insert_new(conn, _O, dict(request_id=request_id, kind=kind, attempt_id=attempt_id,
                                                 body=body, created_at_ms=self.store.now_ms(conn)))

    def settle(self, request_id: str) -> OwedReport | None:
        """The report's own answer came: forget it (and delete its attempt's row if that was cleared
        meanwhile and nothing more is owed about it). None when it was not owed (any more)."""
        with self.store.write(durable=False) as conn:
            row = conn.execute(_OWED_ONE, {"request_id": request_id}).first()
            if row is None:
                return None
            conn.execute(_SETTLE, {"request_id": request_id})
            if row.attempt_id is not None and not conn.execute(
                    _OWED_ABOUT, {"attempt_id": row.attempt_id}).scalar_one():
                conn.execute(_DELETE_CLEARED, {"attempt_id": row.attempt_id})
            return OwedReport.from_row(row)

    def owed(self, limit: int = MAX_PAGE, *, about: str | None = None) -> builtins.list[OwedReport]:
        """The reports still owed (`about` one attempt), oldest first (re-sent at every heartbeat and
        after a Welcome)."""
        query = _OWED_PAGE if about is None else _OWED_OF
        with self.store.read() as conn:
            rows = conn.execute(query, {"limit": limit_checked(limit), "attempt_id": about})
            return [OwedReport.from_row(r) for r in rows]

    def owes(self, request_id: str) -> OwedReport | None:
        with self.store.read() as conn:
            row = conn.execute(_OWED_ONE, {"request_id": request_id}).first()
        return None if row is None else OwedReport.from_row(row)

    # -- the session (§9 Sessions) ------------------------------------------------------------

    def save_session(self, worker_id: str, session_id: str, generation: int, resume_secret: str,
                     boot_id: str) -> None:
        """Record the session a Welcome gave (or a resume rotated), before using it; it replaces
        any earlier one (one executor per journal: a state directory is one worker's)."""
        check_id("worker id", worker_id, MAX_WORKER_ID)
        values = dict(worker_id=worker_id, session_id=check_id("session id", session_id),
                      generation=positive_checked("session generation", generation),
                      resume_secret=secret_checked("resume secret", resume_secret),
                      boot_id=check_id("boot id", boot_id, 64))
        with self.store.write() as conn:
            values["updated_at_ms"] = self.store.now_ms(conn)
            conn.execute(_S.delete())
            conn.execute(_S.insert().values(values))

    def saved_session(self) -> SavedSession | None:
        """The session last saved here, to resume after a restart (a worker learns its id in Welcome,
        so it asks before it knows it); None when there is none (edge never saves one)."""
        with self.store.read() as conn:
            row = conn.execute(select(_S).order_by(_S.c.updated_at_ms.desc()).limit(1)).first()
        return None if row is None else SavedSession(row.worker_id, row.session_id, row.generation,
                                                     row.resume_secret, row.boot_id, row.updated_at_ms)

    # -- helpers ------------------------------------------------------------------------------

    def _row(self, conn: Connection, attempt_id: str) -> JournalEntry:
        row = conn.execute(_ROW, {"attempt_id": attempt_id}).first()
        if row is None:
            raise Conflict(f"no journal row for attempt {attempt_id}")
        return JournalEntry.from_row(row)

    def _update(self, conn: Connection, attempt_id: str, values: dict[str, Any],
                expected: str | None) -> JournalEntry:
        values.update(updated_at_ms=self.store.now_ms(conn), w_attempt_id=attempt_id)
        statement = _UPDATE
        if expected is not None:
            statement, values["w_state"] = _UPDATE_FROM, expected
        updated = conn.execute(statement, values).first()  # the row as written (RETURNING)
        if updated is None:
            entry = self._row(conn, attempt_id)
            raise Conflict(f"journal row of attempt {attempt_id} is {entry.state}, not {expected}")
        return JournalEntry.from_row(updated)


def _lease_columns(lease: LeaseFacts | None) -> dict[str, Any]:
    if lease is None:
        return dict.fromkeys(LEASE_FACTS)
    if not isinstance(lease, LeaseFacts):
        raise BadInput("lease must be LeaseFacts")
    return lease.columns()


def _chunks(attempt_ids: Sequence[str], size: int = 500) -> Iterator[list[str]]:
    """`attempt_ids` in lists of at most `size`: SQLite's bound on a statement's parameters."""
    return (list(attempt_ids[start:start + size]) for start in range(0, len(attempt_ids), size))
