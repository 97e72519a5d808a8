"""Executor side: the typed context its actors share (the journal, the files, this host's identity).

Who reads what (`self.ctx.<field>` in executor/): the Executor, which hands each of its parts
the fields it uses (`journal`, `receipts`, `logs`, `local_receipts`, `boot_id`, `launcher_shell`,
`labels`, `session`, `disk_reserve`, `public_key`), the ReceiptConsumer (`journal`, `receipts`,
`local_receipts`, `boot_id`, `session`, `completion_facts`, `log_retention`), the LogSender
(`journal`); every actor the shared part (runtime/context.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..process.identity import read_boot_id
from ..process.logs import LogStore
from ..process.receipts import ReceiptStore
from ..runtime.context import SharedContext
from ..store.records import Session
from .disk_reserve import DiskReserve
from .journal.journal import Journal
from .local_receipts import LocalReceipts
from .log_retention import LocalLogRetention

# The wire kinds the bridge routes to the Executor (`ack:completed` goes to the ReceiptConsumer).
EXECUTOR_KINDS = ["welcome", "offers", "activated", "stop_requested", "nudge", "ack", "attested",
                  "heartbeat_ack"]


@dataclass(kw_only=True)
class ExecutorContext(SharedContext):
    """The executor side of a process: a worker's, or edge's."""

    journal: Journal
    receipts: ReceiptStore
    logs: LogStore
    local_receipts: LocalReceipts
    session: Session | None = None
    """Edge: the built-in local session, registered once at start. A worker: None (the Executor
    learns its session in Welcome)."""
    boot_id: Callable[[], str] = read_boot_id
    launcher_shell: str = "/bin/sh"
    labels: tuple[str, ...] = ()
    """The executor's labels (a cluster worker's, from its config)."""
    log_retention: LocalLogRetention | None = None
    """A worker's retention of its acknowledged local logs; None on edge, whose Scheduler deletes
    log files with their runs."""
    disk_reserve: DiskReserve | None = None
    """A cluster worker's reserve on its logs' file system: the Executor pulls nothing while it
    holds. None on edge, where the Gateway checks the same reserve before it offers."""
    completion_facts: Callable[[str, Any], tuple[int | None, bool | None]] = lambda _a, _r: (None, None)
    """What a Completed adds on a cluster worker: (final log offset, finished in time); edge: none."""
    public_key: str = ""
    """A cluster worker's public CURVE key (Z85 text), named in its refusal lines: the replicas'
    `curve_denied` and `frame_refused` lines name the same text. Edge: none."""
