"""Shared: the one wall clock (ms) and monotonic clock of a process.

Every part reads the time here (it sits at the top, since store/ may not import runtime/). The
wall clock is the system's and may step: it stamps what a person or the other side reads (ids,
a worker's clock in its heartbeat, local keep-until times); intervals and deadlines inside a
process use the monotonic clock. Database time is not this: every expiry the store decides is
`Store.now_ms` (statement_timestamp() on PostgreSQL, the store's own clock on SQLite).
"""

from __future__ import annotations

import time


def wall_ms() -> int:
    """Milliseconds since the epoch (UTC) by the system clock."""
    return time.time_ns() // 1_000_000


def monotonic() -> float:
    """Seconds by a clock that never steps back (for intervals and deadlines)."""
    return time.monotonic()
