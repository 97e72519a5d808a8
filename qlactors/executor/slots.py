"""Executor side: the live table — the attempts this executor holds, one per slot, from Offer until
its launcher has exited (attempt id -> `Local`), and how many slots are free."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from ..wire import messages as m
from .attempt import AttemptPhase
from .journal.records import LeaseFacts


@dataclass
class Local:
    """One attempt this executor owns, from Offer until its launcher has exited."""

    run_id: str
    attempt_id: str
    offer: m.Offer | None = None  # None for an attempt re-adopted after a restart
    lease_token: str = ""
    token: str = ""
    phase: AttemptPhase = AttemptPhase.OFFERED  # set only from executor/attempt.py's decisions
    identity: Any = None  # ProcessIdentity, or the store's Identity for a re-adopted attempt
    pidfd: int = -1
    sent: str | None = None  # "term" or "kill": the last signal the job's group actually got
    grace_ms: int = 1000
    session_id: str = ""  # the session the lease was granted to (from Offers)
    session_generation: int = 0
    lease: LeaseFacts | None = None  # the lease held now (renewed by heartbeats, re-bound by Attest)
    deadline_ms: int | None = None  # a cluster worker's own deadline (its clock): activation + timeout
    activate_sent_at: float | None = None  # monotonic; when its Activate was last sent
    activate_request_id: str = ""  # the Activate of this offer, the same on every copy

    def holds_offer(self, offer: m.Offer) -> bool:
        """Whether this is `offer` itself, held (accepted here), as opposed to another offer of it."""
        return self.offer is not None and self.offer.offer_id == offer.offer_id


class Slots:
    """The live table of one Executor: `capacity` slots, each holding at most one `Local`."""

    pykka_traversable = True  # tests read `executor.proxy().slots.live` across the actor's thread

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.live: dict[str, Local] = {}

    def free(self) -> int:
        return self.capacity - len(self.live)

    def get(self, attempt_id: str) -> Local | None:
        return self.live.get(attempt_id)

    def __contains__(self, attempt_id: object) -> bool:
        return attempt_id in self.live

    def __iter__(self) -> Iterator[Local]:
        """The held attempts (a snapshot: the loop may release some)."""
        return iter(list(self.live.values()))

    def hold(self, local: Local) -> None:
        self.live[local.attempt_id] = local

    def release(self, attempt_id: str) -> Local | None:
        """Forget an attempt (its slot is free again); None when it was not held."""
        return self.live.pop(attempt_id, None)
