"""Store: the answer ledger: the first answer to each worker request, kept by its request id, so a repeat —
a re-sent copy, or a copy that reached another replica — gets that answer again instead of being
judged anew by its facts (SEMANTICS.md §9 Owed reports, Pull once).

A row holds the store operation's own result (an Outcome's fields, its value's flattened beside
them; a Pull's offer ids), never wire bytes: the caller builds the
answer from it with the code that built the first one. It is looked up and written inside the
transaction of the request's effect, after that transaction's locks, so two copies racing on two
replicas serialise on those locks and the second finds the first's row. Rows older than
`RETENTION_MS` are pruned, a bounded page at a time; a repeat after that is judged by its facts.
Edge has no ledger (one in-process executor sends no copies) and pays no statement for it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from dataclasses import dataclass
from typing import Any, Sequence, get_args, get_origin

from sqlalchemy import bindparam, select, text, tuple_
from sqlalchemy.engine import Connection

from ...domain.results import Outcome
from ..engine import Store
from ..records import check_id
from ..schema import REQUEST_KINDS, worker_requests

# How long a first answer is kept. A worker re-sends what it owes at every heartbeat until it is
# answered, so a repeat comes within seconds of its first copy unless the worker was cut off.
RETENTION_MS = 24 * 3_600_000
# The most rows one prune deletes, and how often a replica prunes (a full page prunes again at
# the next cycle: the ledger gains about four rows per run, so a page per cycle keeps up).
PRUNE_PAGE = 2_000
PRUNE_EVERY_S = 30.0

_W = worker_requests.c
_COLUMNS = ("worker_id", "request_id", "kind", "result_json", "created_at_ms")
_FIND = (select(_W.worker_id, _W.request_id, _W.kind, _W.result_json)
         .where(tuple_(_W.worker_id, _W.request_id).in_(bindparam("keys", expanding=True))))
_OLDEST = (select(_W.worker_id, _W.request_id).where(_W.created_at_ms < bindparam("cutoff"))
           .order_by(_W.created_at_ms).limit(bindparam("page")))
# A Pull's first answer, for the offers' statement under the session row lock (NULL: none kept).
FIRST_PULL_ANSWER = (select(_W.result_json).where(
    _W.worker_id == bindparam("ledger_worker_id"), _W.request_id == bindparam("ledger_request_id"),
    _W.kind == "pull").scalar_subquery())
_PRUNE = worker_requests.delete().where(tuple_(_W.worker_id, _W.request_id).in_(_OLDEST))


@dataclass(frozen=True, slots=True)
class PullAnswer:
    """What a Pull's first answer carried: the offer ids of its offers, in order."""

    offer_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AnswerKey:
    """One request as the ledger knows it: who sent it, its id, its kind, and what its store
    operation returns (the row is read back as one of those): `PullAnswer`, or an `Outcome`
    parametrised by its value's type (`Outcome[Activation]`; `Outcome[None]` for none)."""

    worker_id: str
    request_id: str
    kind: str
    result_type: Any

    def __post_init__(self) -> None:
        check_id("worker id", self.worker_id, 128)
        check_id("request id", self.request_id, 64)
        if self.kind not in REQUEST_KINDS:
            raise ValueError(f"no answer is kept for requests of kind {self.kind!r}")

    @property
    def id(self) -> tuple[str, str]:
        return self.worker_id, self.request_id


# The Outcome's own fields; its value's fields are kept beside them, flat (the rows' form before
# the one Outcome: a row written then reads back the same), and `reason` was a completion's `detail`.
_OUTCOME_FIELDS = ("result", "detail", "run_state")
_LEGACY = {"reason": "detail"}


def encode(result: Any) -> str:
    """A result's fields as JSON (tuples as lists; an Outcome's value flattened beside its own)."""
    if isinstance(result, Outcome):
        values = {name: getattr(result, name) for name in _OUTCOME_FIELDS}
        if result.value is not None:
            values.update(_fields(result.value))
    else:
        values = _fields(result)
    return json.dumps(values, separators=(",", ":"), sort_keys=True)


def decode(result_type: Any, text: str) -> Any:
    """The result `encode` wrote, as `result_type` again."""
    values = {_LEGACY.get(name, name): tuple(v) if isinstance(v, list) else v
              for name, v in json.loads(text).items()}
    if get_origin(result_type) is not Outcome:
        return result_type(**values)
    own = {name: values.pop(name, None) for name in _OUTCOME_FIELDS}
    (value_type,) = get_args(result_type)
    found = any(v is not None for v in values.values())
    return Outcome(**own, value=value_type(**values) if found and value_type is not type(None) else None)


def _fields(record: Any) -> dict[str, Any]:
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}


def first_answers(conn: Connection, keys: Sequence[AnswerKey]) -> dict[tuple[str, str], Any]:
    """The first answers kept for these requests (one statement), by (worker id, request id).
    A row of another kind is not this request's answer (an id reused for another kind)."""
    if not keys:
        return {}
    wanted = {key.id: key for key in keys}
    found = {}
    for row in conn.execute(_FIND, {"keys": sorted(wanted)}):
        key = wanted.get((row.worker_id, row.request_id))
        if key is not None and row.kind == key.kind:
            found[key.id] = decode(key.result_type, row.result_json)
    return found


def keep_answers(conn: Connection, answers: Sequence[tuple[AnswerKey, Any]], now_ms: int) -> None:
    """Keep each result as the first answer to its request, all in one statement; a row already
    there wins (`ON CONFLICT DO NOTHING`: a caught unique error would abort the transaction)."""
    rows = list({key.id: (key, result) for key, result in answers}.values())
    if rows:
        conn.execute(_insert_of(len(rows)), {
            f"{name}_{i}": value for i, (key, result) in enumerate(rows) for name, value in (
                ("worker_id", key.worker_id), ("request_id", key.request_id), ("kind", key.kind),
                ("result_json", encode(result)), ("created_at_ms", now_ms))})


@functools.lru_cache(maxsize=64)
def _insert_of(count: int):
    """One multi-row INSERT of `count` answers, as text built once per count (SQLAlchemy caches
    no multi-VALUES insert; see `plans._events_insert_of`)."""
    rows = ", ".join("(" + ", ".join(f":{name}_{i}" for name in _COLUMNS) + ")" for i in range(count))
    return text(f"INSERT INTO {worker_requests.name} ({', '.join(_COLUMNS)}) VALUES {rows} "
                "ON CONFLICT DO NOTHING")


class RequestAnswers:
    """A replica's ledger: its pruning, paced by the replica's cycles."""

    def __init__(self, store: Store, *, retention_ms: int = RETENTION_MS) -> None:
        self.store = store
        self.retention_ms = retention_ms
        self._next_prune = 0.0  # time.monotonic() of the next prune

    def prune(self, page: int = PRUNE_PAGE) -> int:
        """Delete up to `page` answers older than the retention (database time), oldest first;
        how many went."""
        with self.store.write() as conn:
            cutoff = self.store.now_ms(conn) - self.retention_ms
            return conn.execute(_PRUNE, {"cutoff": cutoff, "page": page}).rowcount

    def prune_due(self) -> None:
        """The replica's cycle hook: `prune` at most every PRUNE_EVERY_S, and at once again while
        pages come back full."""
        now = time.monotonic()
        if now < self._next_prune:
            return
        full = self.prune() >= PRUNE_PAGE
        self._next_prune = now if full else now + PRUNE_EVERY_S
