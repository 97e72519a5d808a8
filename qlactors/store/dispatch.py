"""Executor-facing dispatch: worker sessions, offers (claim + run lease) and fenced executor reports.

SEMANTICS.md §4 and §9. `Dispatch` combines the concerns, each in its own module: sessions
(`sessions.py`: register, resume, end, heartbeats with renewals, attestations), offers
(`offers.py`: `offer_batch`, `offer`) and fenced reports (`fenced_reports.py`: `check_fence`,
`activate`, `started`, `start_failed`, `decline`, `release_unactivated`). Every method is one
short transaction; a pull whose session is dead raises `Fenced`; a report answers an `Outcome`
(`applied`, `fenced`, `refused`).
"""

from __future__ import annotations

from .engine import Store
from .fenced_reports import FencedReports
from .offers import Offers
from .sessions import Sessions


class Dispatch(Sessions, Offers, FencedReports):
    """Sessions, offers and the fenced executor reports, each one short transaction."""

    def __init__(self, store: Store) -> None:
        self.store = store
