"""Executor side: what differs between a local session and a remote one, behind one Executor code
path — the mirror of the Gateway's `control/session_policy.py`.

Local (edge): the built-in session of this process, whose Welcome has no session lease; leases
live with the process, so nothing is journalled for a resume, renewed by heartbeats, re-bound,
drained or declined by pair; an offer it did not wait for is given back, and recovery judges
every ended attempt by its own records. Remote (a cluster worker): a session the replicas lease,
with heartbeats, journalled Pulls, re-attestation of survivors, a deadline on this worker's own
clock, log shipping and a drain at SIGTERM.

The policy is that of the session spoken from now, chosen when a Welcome opens it by its
`session_lease_ms` (a replica's Welcome carries one, edge's does not), and local again while there
is none: a worker between sessions has always been treated so (a late Offers or Activated then).
"""

from __future__ import annotations

from typing import Any, Callable

from ..clock import wall_ms
from ..domain.receipt import token_hash
from ..runtime.signals import ShipLog
from ..wire import messages as m
from .journal.records import LeaseFacts
from .slots import Local


class CurrentSession:
    """The session this executor speaks from now (its Welcome, None between sessions), its worker
    id, and that session's policy."""

    def __init__(self, worker_id: str) -> None:
        self.welcome: m.Welcome | None = None
        self.worker_id = worker_id  # edge: the local session's; a worker learns its own in Welcome
        self._local = LocalSession()
        self.policy: LocalSession | RemoteSession = self._local

    def open(self, welcome: m.Welcome, remote: "RemoteSession") -> None:
        self.welcome = welcome
        self.worker_id = welcome.worker_id
        self.policy = self._local if welcome.session_lease_ms is None else remote

    def end(self) -> None:
        self.welcome = None
        self.policy = self._local

    def holds(self, lease: LeaseFacts | None) -> bool:
        """Whether `lease` is the current session's (only those are renewed)."""
        s = self.welcome
        return (s is not None and lease is not None
                and (lease.session_id, lease.session_generation) == (s.session_id, s.session_generation))


class LocalSession:
    """Edge: the session lives and ends with this process (see the module docstring)."""

    heartbeats = False
    drains = False  # a SIGTERM ends the process and its session together
    judged_by_own_records = True  # edge recovery judges an ended attempt by its records (§6)
    rebinds = False  # leases live with the process: a survivor is never re-bound

    def opened(self, welcome: m.Welcome) -> None:
        """Nothing is kept for a resume."""

    def pull_sent(self, pull_id: str, pairs: dict[str, str]) -> None:
        """The Pull goes to the Gateway in-process: nothing journalled."""

    def pull_answered(self, pull_id: str) -> None:
        pass

    def activated(self, local: Local) -> None:
        """One clock on edge: the store judges "finished in time" itself."""

    def launched(self, local: Local, worker_id: str) -> None:
        """Logs stay in local files."""


class RemoteSession:
    """A cluster worker's session, leased by the replicas (see the module docstring)."""

    heartbeats = True
    drains = True
    judged_by_own_records = False  # a replica decides on the fact attested
    rebinds = True  # a survivor of an older session is attested `running` and re-bound; an unknown
    # lease the Welcome lists as never activated is declined

    def __init__(self, *, journal: Any, boot_id: Callable[[], str], logs: Any,
                 tell: Callable[[str, Any], Any]) -> None:
        self.journal, self.boot_id, self.logs, self.tell = journal, boot_id, logs, tell

    def opened(self, welcome: m.Welcome) -> None:
        """Kept for a resume (the Executor starts the heartbeats: `heartbeats`)."""
        self.journal.save_session(welcome.worker_id, welcome.session_id, welcome.session_generation,
                                  welcome.resume_secret, self.boot_id())

    def pull_sent(self, pull_id: str, pairs: dict[str, str]) -> None:
        """Journalled before it is sent (SEMANTICS.md §9 Offers)."""
        self.journal.journal_pull(pull_id, list(pairs.items()))

    def pull_answered(self, pull_id: str) -> None:
        self.journal.clear_pull(pull_id)

    def activated(self, local: Local) -> None:
        """"Finished in time" is judged on this worker's own clock (§5)."""
        offer = local.offer
        started = wall_ms()
        local.deadline_ms = None if offer.timeout_ms is None else started + offer.timeout_ms
        self.journal.activated(offer.attempt_id, started, local.deadline_ms)

    def launched(self, local: Local, worker_id: str) -> None:
        """Its log is shipped to the control side."""
        self.tell("logs", ShipLog(local.run_id, local.attempt_id, token_hash(local.token),
                                  str(self.logs.path_for(local.run_id, local.attempt_id)), worker_id=worker_id))
