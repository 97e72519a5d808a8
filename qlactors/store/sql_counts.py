"""Store: opt-in SQL accounting for benchmarks: `QLACTORS_COUNT_SQL=PATH` makes every Store of the process
count its statements (per kind: verb and main table) and its transactions (commits, rollbacks)
and write the totals to PATH as JSON, at most every `DUMP_EVERY_S` while it runs and at exit.

The pool does not pre-ping (a dropped connection is a transient error its actor retries), so
these events see every statement and transaction the server runs for the store. Off by
default: without the variable nothing is installed and nothing is imported. The per-connection timeout settings (once per new connection) are not counted.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import threading
import time

from ..clock import wall_ms

ENV = "QLACTORS_COUNT_SQL"
DUMP_EVERY_S = 0.25

_TABLE = re.compile(r"\b(?:FROM|INTO|UPDATE|JOIN)\s+\"?([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)
_CALL = re.compile(r"\bSELECT\s+\(?\s*([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)


def kind_of(statement: str) -> str:
    """'UPDATE run_attempts', 'SELECT runs', 'SELECT pg_advisory_xact_lock', ... for one SQL text."""
    words = statement.lstrip().split(None, 1)
    verb = words[0].upper() if words else "?"
    if verb == "UPDATE":
        table = _TABLE.search(statement)  # "UPDATE t" is matched by the UPDATE alternative
    elif verb in ("INSERT", "DELETE", "SELECT", "WITH"):
        table = _TABLE.search(statement)
        if table is None and verb == "SELECT":
            table = _CALL.search(statement)
    else:
        table = None
    return f"{verb} {table.group(1)}" if table else verb


class SqlCounts:
    """One process's totals, shared by every engine it installs on; written to `path`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.kinds: dict[str, int] = {}
        self.statements = 0
        self.commits = 0
        self.rollbacks = 0
        self.compiled: dict[str, int] = {}
        self._kind_cache: dict[str, str] = {}
        self._dumped_at = 0.0

    def statement(self, text: str, compiled: bool = False) -> None:
        kind = self._kind_cache.get(text)
        if kind is None:
            kind = self._kind_cache[text] = kind_of(text)
        with self.lock:
            self.statements += 1
            self.kinds[kind] = self.kinds.get(kind, 0) + 1
            if compiled:
                self.compiled[kind] = self.compiled.get(kind, 0) + 1
        self._maybe_dump()

    def transaction(self, committed: bool) -> None:
        with self.lock:
            if committed:
                self.commits += 1
            else:
                self.rollbacks += 1
        self._maybe_dump()

    def snapshot(self) -> dict:
        with self.lock:
            return {"pid": os.getpid(), "statements": self.statements, "commits": self.commits,
                    "rollbacks": self.rollbacks, "kinds": dict(self.kinds),
                    "compiled": dict(self.compiled),
                    "written_at": wall_ms() / 1000}  # seconds, as always

    def _maybe_dump(self) -> None:
        if time.monotonic() - self._dumped_at >= DUMP_EVERY_S:
            self.dump()

    def dump(self) -> None:
        self._dumped_at = time.monotonic()
        data = json.dumps(self.snapshot())
        scratch = f"{self.path}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            with open(scratch, "w") as fh:
                fh.write(data)
            os.replace(scratch, self.path)
        except OSError:
            pass  # accounting must never fail the store


_COUNTS: SqlCounts | None = None


def install(engine, path: str) -> SqlCounts:
    """Count `engine`'s statements and transactions into the process's `SqlCounts` for `path`."""
    from sqlalchemy import event
    from sqlalchemy.engine.default import CacheStats

    global _COUNTS
    if _COUNTS is None:
        _COUNTS = SqlCounts(path)
        atexit.register(_COUNTS.dump)
    counts = _COUNTS

    @event.listens_for(engine, "before_cursor_execute")
    def _on_execute(_conn, _cursor, statement, _params, _context, _many):
        compiled = _context is not None and _context.cache_hit is not CacheStats.CACHE_HIT
        counts.statement(statement, compiled)

    @event.listens_for(engine, "commit")
    def _on_commit(_conn):
        counts.transaction(True)

    @event.listens_for(engine, "rollback")
    def _on_rollback(_conn):
        counts.transaction(False)

    return counts
