"""Fresh identifiers for new rows: UUIDv7 from the system clock and the OS random source."""

from __future__ import annotations

import hashlib
import os
import threading

from .clock import wall_ms
from .domain.ids import uuid7_after

_lock = threading.Lock()
_last: str | None = None


def new_id() -> str:
    """A new UUIDv7, greater than every id this process made before (`uuid7_after`): two runs
    admitted within one millisecond list in the order they were admitted (`runs`' keyset is the
    creation time, then the id)."""
    global _last
    with _lock:
        _last = uuid7_after(_last, wall_ms(), os.urandom(10))
        return _last


def completion_request_id(attempt_id: str) -> str:
    """The request id of an attempt's `Completed`: the same on every copy, from every session and
    every restart of the worker (its receipt file is the report's journal: SEMANTICS.md §9 Owed
    reports), and unlike any random id (a UUID has no dash in its second place); 36 characters."""
    return "c-" + hashlib.sha256(attempt_id.encode("utf-8", "surrogateescape")).hexdigest()[:34]
