"""What the actors of one runtime process share: the RuntimeContext, and the names that wire them."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

import zmq

from ..actors.base import Directory, Fatal
from ..worker.receipts import LocalReceipts
from ..config import Config
from ..process.identity import read_boot_id
from ..process.logs import LogStore
from ..process.receipts import ReceiptStore
from ..store.completion import CompletionService
from ..store.control import Control
from ..store.cron_admission import CronAdmission
from ..store.dispatch import Dispatch
from ..worker.journal import Journal
from ..store.lost_retry import LostRetry
from ..store.repository import Repository
from ..wire.bridge import Bridge

# The executor side's worker id on edge (its one built-in local session).
LOCAL_WORKER = "local"
# The wire kinds the bridge routes to the Executor (`ack:completed` goes to the ReceiptConsumer).
EXECUTOR_KINDS = ["welcome", "offers", "activated", "stop_requested", "nudge", "ack", "attested",
                  "heartbeat_ack"]


@dataclass
class RuntimeContext:
    """Everything an actor may use; shared read-only (the repositories are thread-safe)."""

    config: Config
    zmq: zmq.Context
    bridge: Bridge
    directory: Directory
    fatal: Fatal
    admitting: threading.Event
    session: Any
    repo: Repository
    dispatch: Dispatch
    completion: CompletionService
    control: Control
    lost_retry: LostRetry
    cron: CronAdmission
    journal: Journal
    receipts: ReceiptStore
    logs: LogStore
    local_receipts: LocalReceipts
    boot_id: Callable[[], str] = read_boot_id
    launcher_shell: str = "/bin/sh"
    free_bytes: Callable[[], int] | None = None  # free space of the logs file system; None: no disk check
    sessions: Any = None  # the Gateway's policy: LocalSessions (edge) or ClusterSessions
    labels: tuple[str, ...] = ()  # the executor's labels (a cluster worker's, from its config)
    each_cycle: tuple[Callable[[], None], ...] = ()  # run by the Supervisor after every cycle
    authenticator: Any = None  # a replica's CURVE authenticator, kept referenced while it serves
    log_retention: Any = None  # a worker's LocalLogRetention (its acknowledged local logs)

    # What a Completed adds on a cluster worker: (final log offset, finished in time); edge: none.
    completion_facts: Callable[[str, Any], tuple[int | None, bool | None]] = lambda _a, _r: (None, None)

    @property
    def health(self) -> Any:
        """The health of this process's database: the store (edge, control) or a worker's journal."""
        return (self.repo.store if self.repo is not None else self.journal.store).health
