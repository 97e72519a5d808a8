"""Store: the executor-facing dispatch services, one collaborator each (SEMANTICS.md §4 and §9).

`Dispatch` is a record of parts, composed like `Repository`, none inheriting another, each
constructed with the `Store` it writes through:

- `sessions` (`sessions.py`): `register`, `resume`, `end`, `unactivated_leases`;
- `heartbeats` (`heartbeats.py`): `apply` one numbered heartbeat and the renewals it quotes;
- `attestations` (`attestations.py`): `apply` one attestation;
- `offers` (`offers.py`): `batch`, `one`;
- `reports` (`fenced_reports.py`): `check_fence`, `activate`, `started`, `start_failed`,
  `decline` (each with its `*_in` form for a batch), `release_unactivated`.

Every operation is one short transaction; a pull whose session is dead raises `Fenced`; a report
answers an `Outcome` (`applied`, `fenced`, `refused`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine import Store
from .attestations import Attestations
from .fenced_reports import FencedReports
from .heartbeats import Heartbeats
from .offers import Offers
from .sessions import Sessions


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Sessions, heartbeats, attestations, offers and fenced reports, side by side."""

    store: Store
    sessions: Sessions
    heartbeats: Heartbeats
    attestations: Attestations
    offers: Offers
    reports: FencedReports

    @classmethod
    def open(cls, store: Store) -> "Dispatch":
        """Every part on the same `store`."""
        return cls(store=store, sessions=Sessions(store), heartbeats=Heartbeats(store),
                   attestations=Attestations(store), offers=Offers(store), reports=FencedReports(store))
