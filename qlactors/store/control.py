"""Control-side store operations of the cadence: timeouts, stops, lost attempts, recovery candidates
and re-binding survivors (SEMANTICS.md §6, §7, §10); the retry of lost runs is in lost_retry.py.

`Control` combines the concerns, each in its own module: deadlines and stops (`stops.py`:
`next_deadline_ms`, `next_due_ms`, `commit_timeouts`, `pending_stops`, `end_by_intent`),
recovery (`recovery_cases.py`: `mark_lost`, `recovery_candidates`, `candidates_for`,
`candidate`, `rebind`) and status (`control_status.py`: `queued_waiting`, `active_run_ids`,
`lost_count`, `status_counts`); the records they answer and the row loaders are in
`control_rows.py`.
"""

from __future__ import annotations

from .control_rows import DEFAULT_PAGE, MAX_PAGE, MAX_STOP_PAGE, Candidate, RebindResult, StopOrder, page_size
from .control_status import ControlStatus, StatusCounts
from .engine import Store
from .recovery_cases import RecoveryCases
from .stops import Stops

__all__ = ["Control", "Candidate", "RebindResult", "StatusCounts", "StopOrder", "page_size",
           "DEFAULT_PAGE", "MAX_PAGE", "MAX_STOP_PAGE"]


class Control(Stops, RecoveryCases, ControlStatus):
    """Timeouts, stops, lost attempts, recovery candidates and re-binding."""

    def __init__(self, store: Store) -> None:
        self.store = store
