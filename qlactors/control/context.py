"""Control side: the typed context its actors share (the database and the store services).

Who reads what (`self.ctx.<field>` in control/): the Gateway (`dispatch`, `completion`,
`sessions`, `authority`), the Scheduler (`cron`, `control`, `retention`, `authority`,
`cycle_health`), Retry (`lost_retry`), edge's Recovery (`control`, `dispatch`, `completion`,
`local`), ClusterRecovery (`repo`, `recovery_grace_ms`, `drain_grace_ms`); every actor the shared
part (runtime/context.py). The services are thread-safe and shared read-only.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..runtime.context import SharedContext
from ..runtime.ports import LocalEvidence
from ..store.dispatch.completion import CompletionService
from ..store.cadence.control import Control
from ..store.cadence.cron_admission import CronAdmission
from ..store.dispatch.dispatch import Dispatch
from ..store.cadence.lost_retry import LostRetry
from ..store.repository import Repository
from ..store.cadence.retention import Retention
from .cycle_health import CycleHealth
from .session_policy import ClusterSessions, LocalSessions


def _set(event: threading.Event) -> threading.Event:
    event.set()
    return event


@dataclass(kw_only=True)
class ControlContext(SharedContext):
    """The control side of a process: a replica's, or edge's."""

    repo: Repository
    dispatch: Dispatch
    completion: CompletionService
    control: Control
    lost_retry: LostRetry
    cron: CronAdmission
    retention: Retention
    """The Scheduler's retention: on edge it deletes this process's log files with their runs; a
    replica holds no files (each worker's own retention deletes its copies)."""
    sessions: LocalSessions | ClusterSessions
    """The Gateway's policy: LocalSessions (edge) or ClusterSessions (a replica)."""
    authority: threading.Event = field(default_factory=lambda: _set(threading.Event()))
    """Set while the last cadence cycle got through all its steps (or none has failed yet);
    cleared by the Scheduler when a step failed or stayed silent, and set again by the next cycle
    that gets through. The Gateway offers nothing while it is clear: no new work is dispatched
    while recovery's or retry's authority is unknown (SEMANTICS.md §10)."""
    cycle_health: CycleHealth = field(default_factory=CycleHealth)
    """The step the last cycle failed at, its error and since when (None once a cycle gets
    through), written by the Scheduler with `authority`, for `status`: a replica's heartbeat
    copies it into its row; edge's publishes it in the home (`on_change`)."""
    local: LocalEvidence | None = None
    """Edge: the executor side's evidence in this process (runtime/ports.py), which edge's
    Recovery judges from. None on a replica, which decides from the database and attestations."""
    recovery_grace_ms: int | None = None
    drain_grace_ms: int | None = None
    """A replica's windows for ClusterRecovery's idempotent rule (SEMANTICS.md §10 step 1): how long
    after its session ended an idempotent attempt is lost, and how much longer a drained session
    counts as alive. None on edge, whose Recovery judges from its own process's facts."""
