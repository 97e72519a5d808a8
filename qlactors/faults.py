"""Crash points for the crash-window tests: `QLACTORS_FAULT=<point>` makes the runtime die there.

The runtime exits with `os._exit(FAULT_EXIT)` — no cleanup, no flush — which is what a power
cut or `kill -9` at that instant looks like. Unset (the normal case) it costs one comparison.
"""

from __future__ import annotations

import os

from .errors import QlactorsError

FAULT_EXIT = 86
POINTS = frozenset({
    "before_completion_commit",  # a receipt is published and read, its completion not committed
    "after_completion_commit",  # the completion is committed, the receipt not yet deleted
    "after_spawn",  # the launcher runs, its identity is not yet recorded anywhere but its marker
    "bridge_loop_on_nudge",  # raise_point: the bridge loop dies on the next nudge (it must stop the runtime)
    "executor_after_accept",  # raise_point: the Executor dies with an offer journaled, not activated
    "gateway_drop_offers",  # drop_point: the first Offers answer is committed but never sent
    "gateway_drop_heartbeat_ack",  # drop_point: the first HeartbeatAck that renewed a lease is never sent
})
_ACTIVE = os.environ.get("QLACTORS_FAULT")


def crash_point(name: str) -> None:
    if _ACTIVE == name:
        os._exit(FAULT_EXIT)


class InjectedFault(QlactorsError, RuntimeError):
    """Raised by `raise_point`: a bug at that instant, as opposed to a crash. Like a bug it has
    no exit status (a command lets it through) and is no PeerFault (nothing answers it)."""

    exit_status = None


_raised: set[str] = set()


def raise_point(name: str) -> None:
    """Like `crash_point`, but raise instead of exiting, the first time only: a bug the code
    around it must survive (a restarted actor passes the point again without failing)."""
    if _ACTIVE == name and name not in _raised:
        _raised.add(name)
        raise InjectedFault(f"fault injected at {name}")


def drop_point(name: str) -> bool:
    """True the first time only when `name` is active: the caller drops what it would send (a
    message lost on the network after its transaction committed)."""
    if _ACTIVE == name and name not in _raised:
        _raised.add(name)
        return True
    return False
