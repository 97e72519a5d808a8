"""What the actors of one runtime process share: a control-side and a worker-side context, the part
both sides need, and the names that wire them.

Who reads what (`ctx.<field>` in qlactors/actors):

- every actor (runtime/actor.py) and `watch_store`: `config`, `zmq`, `bridge`, `directory`,
  `fatal`, `health`; the Supervisor runs on every profile and reads that part and `admitting`,
  and `each_cycle` after a cycle (only where a Scheduler runs: the control side).
- control side: the Gateway (`dispatch`, `completion`, `sessions`), the Scheduler (`cron`,
  `control`, `retention`), Retry (`lost_retry`), ClusterRecovery (`repo`, `recovery_grace_ms`,
  `drain_grace_ms`).
- worker side: the Executor (`journal`, `receipts`, `logs`, `local_receipts`, `boot_id`,
  `launcher_shell`, `labels`, `session`), the ReceiptConsumer (`journal`, `receipts`,
  `local_receipts`, `boot_id`, `session`, `completion_facts`, `log_retention`), the LogSender
  (`journal`).
- edge's Recovery judges from the database and from this process's journal and files, so it
  reads both sides: it only runs in an `EdgeContext`.

A control replica builds a `ControlContext`, a worker a `WorkerContext`, and edge (both sides in one
process) an `EdgeContext`, which is both at once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import zmq

from ..config import Config
from ..control.cycle_health import CycleHealth
from ..executor.journal.journal import Journal
from ..executor.local_receipts import LocalReceipts
from ..process.identity import read_boot_id
from ..process.logs import LogStore
from ..process.receipts import ReceiptStore
from ..runtime.actor import Directory, Fatal
from ..store.completion import CompletionService
from ..store.control import Control
from ..store.cron_admission import CronAdmission
from ..store.dispatch import Dispatch
from ..store.lost_retry import LostRetry
from ..store.repository import Repository
from ..store.retention import Retention
from ..wire.bridge import Bridge

# The executor side's worker id on edge (its one built-in local session).
LOCAL_WORKER = "local"
# The wire kinds the bridge routes to the Executor (`ack:completed` goes to the ReceiptConsumer).
EXECUTOR_KINDS = ["welcome", "offers", "activated", "stop_requested", "nudge", "ack", "attested",
                  "heartbeat_ack"]


def _set(event: threading.Event) -> threading.Event:
    event.set()
    return event


@dataclass(kw_only=True)
class SharedContext:
    """The part every actor of a process uses: its config, ZeroMQ context, bridge, directory of
    actors, fatal switch, and whether work may be admitted.

    `admitting` is the one piece of state the two sides share on edge (on a cluster each process
    has its own). Written by the Runner (set once startup recovery is done, or at once where no
    Recovery runs), the Supervisor (cleared on Drain) and the profile's shutdown (cleared); read
    by the Gateway and the Scheduler (control side: no offers, nudges or cron admission before
    startup recovery is done and while draining), by the Executor (worker side: no pulls then),
    and by Recovery and the ReceiptConsumer (whether their start is a restart).
    """

    config: Config
    zmq: zmq.Context
    bridge: Bridge
    directory: Directory
    fatal: Fatal
    admitting: threading.Event

    @property
    def health(self) -> Any:
        """The health of this process's database (the store, or a worker's journal)."""
        raise NotImplementedError


@dataclass(kw_only=True)
class ControlContext(SharedContext):
    """The control side: the database and the store services the cadence and the Gateway use.
    Shared read-only (the services are thread-safe)."""

    repo: Repository
    dispatch: Dispatch
    completion: CompletionService
    control: Control
    lost_retry: LostRetry
    cron: CronAdmission
    retention: Retention
    """The Scheduler's retention: on edge it deletes this process's log files with their runs; a
    replica holds no files (each worker's own retention deletes its copies)."""
    sessions: Any
    """The Gateway's policy: LocalSessions (edge) or ClusterSessions (a replica)."""
    each_cycle: tuple[Callable[[], None], ...] = ()
    """Run by the Supervisor after every cycle (a replica: its allow-list and its row in `status`)."""
    authority: threading.Event = field(default_factory=lambda: _set(threading.Event()))
    """Set while the last cadence cycle got through all its steps (or none has failed yet);
    cleared by the Scheduler when a step failed or stayed silent, and set again by the next cycle
    that gets through. The Gateway offers nothing while it is clear: no new work is dispatched
    while recovery's or retry's authority is unknown (SEMANTICS.md §10)."""
    cycle_health: CycleHealth = field(default_factory=CycleHealth)
    """The step the last cycle failed at, its error and since when (None once a cycle gets
    through), written by the Scheduler with `authority`, for `status`: a replica's heartbeat
    copies it into its row; edge's publishes it in the home (`on_change`)."""
    recovery_grace_ms: int | None = None
    drain_grace_ms: int | None = None
    """A replica's windows for ClusterRecovery's idempotent rule (SEMANTICS.md §10 step 1): how long
    after its session ended an idempotent attempt is lost, and how much longer a drained session
    counts as alive. None on edge, whose Recovery judges from its own process's facts."""

    @property
    def health(self) -> Any:
        return self.repo.store.health


@dataclass(kw_only=True)
class WorkerContext(SharedContext):
    """The worker side: the executor's journal, its files and its identity on this host."""

    journal: Journal
    receipts: ReceiptStore
    logs: LogStore
    local_receipts: LocalReceipts
    session: Any = None
    """Edge: the built-in local session, registered once at start. A worker: None (the Executor
    learns its session in Welcome)."""
    boot_id: Callable[[], str] = read_boot_id
    launcher_shell: str = "/bin/sh"
    labels: tuple[str, ...] = ()
    """The executor's labels (a cluster worker's, from its config)."""
    log_retention: Any = None
    """A worker's LocalLogRetention (its acknowledged local logs); None on edge, whose Scheduler
    deletes log files with their runs."""
    disk_reserve: Any = None
    """A cluster worker's DiskReserve on its logs' file system: the Executor pulls nothing while it
    holds. None on edge, where the Gateway checks the same reserve before it offers."""
    completion_facts: Callable[[str, Any], tuple[int | None, bool | None]] = lambda _a, _r: (None, None)
    """What a Completed adds on a cluster worker: (final log offset, finished in time); edge: none."""
    public_key: str = ""
    """A cluster worker's public CURVE key (Z85 text), named in its refusal lines: the replicas'
    `curve_denied` and `frame_refused` lines name the same text. Edge: none."""

    @property
    def health(self) -> Any:
        return self.journal.store.health


@dataclass(kw_only=True)
class EdgeContext(ControlContext, WorkerContext):
    """Both sides in one process (edge): one SQLite file holds the runs and the journal, so
    `health` is the store's either way."""
