"""Crash points for the crash-window tests: `QLACTORS_FAULT=<point>` makes the runtime die there.

The runtime exits with `os._exit(FAULT_EXIT)` — no cleanup, no flush — which is what a power
cut or `kill -9` at that instant looks like. Unset (the normal case) it costs one comparison.
"""

from __future__ import annotations

import os

FAULT_EXIT = 86
POINTS = frozenset({
    "before_completion_commit",  # a receipt is published and read, its completion not committed
    "after_completion_commit",  # the completion is committed, the receipt not yet deleted
    "after_spawn",  # the launcher runs, its identity is not yet recorded anywhere but its marker
})
_ACTIVE = os.environ.get("QLACTORS_FAULT")


def crash_point(name: str) -> None:
    if _ACTIVE == name:
        os._exit(FAULT_EXIT)
