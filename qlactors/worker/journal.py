"""The executor's local journal: one row per attempt it launches, written before the spawn.

On edge the table lives in the same SQLite file as everything else; on a cluster worker in a
local SQLite file of its own. The control plane's state never references these paths.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any, Iterable

from sqlalchemy import and_, bindparam, select
from sqlalchemy.engine import Connection

from ..errors import BadInput, Conflict
from ..store.records import Identity, check_hash, check_id
from ..store.engine import Store
from ..store.schema import executor_journal

ACCEPTED = "accepted"
LAUNCHING = "launching"
STARTED = "started"
COMPLETED = "completed"
QUARANTINED = "quarantined"
STATES = (ACCEPTED, LAUNCHING, STARTED, COMPLETED, QUARANTINED)
MAX_PAGE = 1000
MAX_PATH = 4096

_J = executor_journal
# Built once (see store/plans.py): the executor writes its journal several times per job.
_ROW = select(_J).where(_J.c.attempt_id == bindparam("attempt_id"))
_UPDATE = _J.update().where(_J.c.attempt_id == bindparam("w_attempt_id")).returning(*_J.c)
_UPDATE_FROM = _UPDATE.where(_J.c.state == bindparam("w_state"))
_DELETE = _J.delete().where(_J.c.attempt_id == bindparam("attempt_id"))


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One journal row: what this executor knows about an attempt it accepted."""

    attempt_id: str
    run_id: str
    state: str
    log_path: str
    receipt_path: str
    callback_token_hash: str
    identity: Identity | None
    purge_after_ms: int | None
    created_at_ms: int
    updated_at_ms: int

    @classmethod
    def from_row(cls, row: Any, prefix: str = "") -> "JournalEntry":
        g = lambda name: getattr(row, prefix + name)  # noqa: E731 - a column reader for one row
        return cls(attempt_id=g("attempt_id"), run_id=g("run_id"), state=g("state"),
                   log_path=g("log_path"), receipt_path=g("receipt_path"),
                   callback_token_hash=g("callback_token_hash"),
                   identity=Identity.from_row(row, prefix), purge_after_ms=g("purge_after_ms"),
                   created_at_ms=g("created_at_ms"), updated_at_ms=g("updated_at_ms"))


def _state(state: str) -> str:
    if state not in STATES:
        raise BadInput(f"unknown journal state {state!r}: one of {', '.join(STATES)}")
    return state


def _limit(limit: int) -> int:
    if type(limit) is not int or not 1 <= limit <= MAX_PAGE:
        raise BadInput(f"a journal page holds 1 to {MAX_PAGE} rows")
    return limit


def _path(name: str, value: Any) -> str:
    if type(value) is not str or not 1 <= len(value) <= MAX_PATH or "\0" in value:
        raise BadInput(f"{name} must be a path of 1 to {MAX_PATH} characters without NUL")
    return value


class Journal:
    """Accept, advance, quarantine and clear journal rows; bounded keyset reads."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def accept(self, attempt_id: str, run_id: str, log_path: str, receipt_path: str,
               callback_token_hash: str) -> bool:
        """Journal an accepted offer (`accepted`); False when this attempt is journaled past `accepted`.

        A row still `accepted` is an earlier offer of the same attempt that was never activated
        here (its lease was released and it was offered again): it takes the new token hash and
        the call answers True. A row `launching` or later means this executor may have started
        it: never accept it twice.
        """
        check_id("attempt id", attempt_id)
        check_id("run id", run_id)
        check_hash("callback token hash", callback_token_hash)
        values = dict(attempt_id=attempt_id, run_id=run_id, state=ACCEPTED,
                      log_path=_path("log path", log_path),
                      receipt_path=_path("receipt path", receipt_path),
                      callback_token_hash=callback_token_hash)
        with self.store.write(durable=False) as conn:
            now = self.store.now_ms(conn)
            if self.store.insert_new(conn, _J, dict(values, created_at_ms=now, updated_at_ms=now)):
                return True
            again = conn.execute(_UPDATE_FROM, dict(
                callback_token_hash=callback_token_hash, updated_at_ms=now, w_attempt_id=attempt_id,
                w_state=ACCEPTED)).first()
            return again is not None

    def set_state(self, attempt_id: str, state: str, *, identity: Any = None,
                  expected: str | None = None) -> JournalEntry:
        """Move a row to `state` (recording the identity when given), only from `expected` when given.

        Raises Conflict when there is no row, or when its state is not `expected`.
        """
        _state(state)
        if expected is not None:
            _state(expected)
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
        """Delete the row (after its completion committed and its receipt was removed)."""
        with self.store.write(durable=False) as conn:
            return conn.execute(_DELETE, {"attempt_id": attempt_id}).rowcount == 1

    def get(self, attempt_id: str) -> JournalEntry | None:
        with self.store.read() as conn:
            row = conn.execute(_ROW, {"attempt_id": attempt_id}).first()
            return JournalEntry.from_row(row) if row is not None else None

    def list(self, states: Iterable[str] | None = None, limit: int = 64,
             after: str | None = None) -> builtins.list[JournalEntry]:
        """Rows in `states` (all when None), ascending attempt id, after `after`; at most `limit`."""
        query = select(_J)
        if states is not None:
            wanted = [_state(s) for s in states]
            query = query.where(_J.c.state.in_(wanted))
        if after is not None:
            query = query.where(_J.c.attempt_id > after)
        query = query.order_by(_J.c.attempt_id).limit(_limit(limit))
        with self.store.read() as conn:
            return [JournalEntry.from_row(r) for r in conn.execute(query)]

    def due_purge(self, now_ms: int, limit: int = 32) -> builtins.list[JournalEntry]:
        """Quarantined rows whose retention ended by `now_ms`, oldest first."""
        if type(now_ms) is not int:
            raise BadInput("now_ms must be an integer")
        query = (select(_J).where(and_(_J.c.state == QUARANTINED, _J.c.purge_after_ms.is_not(None),
                                       _J.c.purge_after_ms <= now_ms))
                 .order_by(_J.c.purge_after_ms, _J.c.attempt_id).limit(_limit(limit)))
        with self.store.read() as conn:
            return [JournalEntry.from_row(r) for r in conn.execute(query)]

    def _update(self, conn: Connection, attempt_id: str, values: dict[str, Any],
                expected: str | None) -> JournalEntry:
        values.update(updated_at_ms=self.store.now_ms(conn), w_attempt_id=attempt_id)
        statement = _UPDATE
        if expected is not None:
            statement, values["w_state"] = _UPDATE_FROM, expected
        updated = conn.execute(statement, values).first()  # the row as written (RETURNING)
        if updated is None:
            row = conn.execute(_ROW, {"attempt_id": attempt_id}).first()
            if row is None:
                raise Conflict(f"no journal row for attempt {attempt_id}")
            raise Conflict(f"journal row of attempt {attempt_id} is {row.state}, not {expected}")
        return JournalEntry.from_row(updated)
