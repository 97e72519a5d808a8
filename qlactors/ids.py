"""Fresh identifiers for new rows: UUIDv7 from the system clock and the OS random source."""

from __future__ import annotations

import hashlib
import os

from .clock import wall_ms
from .domain.ids import uuid7


def new_id() -> str:
    return uuid7(wall_ms(), os.urandom(10))


def completion_request_id(attempt_id: str) -> str:
    """The request id of an attempt's `Completed`: the same on every copy, from every session and
    every restart of the worker (its receipt file is the report's journal: SEMANTICS.md §9 Owed
    reports), and unlike any random id (a UUID has no dash in its second place); 36 characters."""
    return "c-" + hashlib.sha256(attempt_id.encode("utf-8", "surrogateescape")).hexdigest()[:34]
