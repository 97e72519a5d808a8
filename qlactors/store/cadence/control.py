"""Store: the control-side services of the cadence, one collaborator each: timeouts and stops, lost
attempts, recovery candidates and re-binding survivors, status (SEMANTICS.md §6, §7, §10); the
retry of lost runs is in lost_retry.py.

`Control` is a record of parts, composed like `Repository`, none inheriting another, each
constructed with the `Store`:

- `stops` (`stops.py`): `next_deadline_ms`, `next_due_ms`, `commit_timeouts`, `pending`,
  `end_by_intent`;
- `recovery` (`recovery_cases.py`): `mark_lost`, `candidates`, `candidates_for`, `candidate`,
  `rebind`;
- `status` (`control_status.py`): `queued_waiting`, `active_run_ids`, `lost_count`, `counts`.

The records they answer and the row loaders are in `control_rows.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine import Store
from .control_rows import DEFAULT_PAGE, MAX_PAGE, MAX_STOP_PAGE, Candidate, StopOrder, page_size
from .control_status import ControlStatus, StatusCounts
from .recovery_cases import RecoveryCases
from .stops import Stops

__all__ = ["Control", "Candidate", "StatusCounts", "StopOrder", "page_size",
           "DEFAULT_PAGE", "MAX_PAGE", "MAX_STOP_PAGE"]


@dataclass(frozen=True, slots=True)
class Control:
    """Timeouts and stops, recovery cases and status, side by side."""

    store: Store
    stops: Stops
    recovery: RecoveryCases
    status: ControlStatus

    @classmethod
    def open(cls, store: Store) -> "Control":
        """Every part on the same `store`."""
        return cls(store=store, stops=Stops(store), recovery=RecoveryCases(store), status=ControlStatus(store))
