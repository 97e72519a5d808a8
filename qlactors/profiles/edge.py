"""Profile: edge, one process, one SQLite file, all six actors, ZeroMQ inproc between them.

Start order: lock the home, migrate, register the local session, start the bridge, the
Supervisor, the Gateway, then Recovery — whose startup pass finishes before anything is admitted — then
Retry, Scheduler, ReceiptConsumer and last the Executor (which starts pulling). Stop order is
the reverse, within the shutdown drain budget. Running jobs are left running unless asked:
they are recovered on the next start.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

import zmq

from ..config import Config, ensure_home
from ..control.context import ControlContext
from ..control.cycle_health import CycleHealth, published_in
from ..control.gateway import Gateway
from ..control.recovery import Recovery
from ..control.retry import Retry
from ..control.scheduler import Scheduler
from ..control.session_policy import LocalSessions
from ..domain.states import CancelReason
from ..errors import QlactorsError
from ..executor.context import EXECUTOR_KINDS, ExecutorContext
from ..executor.disk_reserve import DiskReserve
from ..executor.edge_evidence import EdgeEvidence
from ..executor.edge_files import EdgeFiles
from ..executor.executor import Executor
from ..executor.journal.journal import Journal
from ..executor.local_receipts import LocalReceipts
from ..executor.receipt_consumer import ReceiptConsumer
from ..process.diskspace import free_space_source
from ..process.identity import boot_id_source
from ..process.logs import LogStore
from ..process.malloc import limit_arenas
from ..process.receipts import ReceiptStore
from ..runtime.context import Directory, Fatal, SharedContext
from ..runtime.home import nudge_endpoint
from ..runtime.outage import watch_store
from ..runtime.runner import Runner
from ..runtime.signals import Drain, Tick
from ..runtime.supervisor import Supervisor
from ..store.dispatch.completion import CompletionService
from ..store.cadence.control import Control
from ..store.cadence.cron_admission import CronAdmission
from ..store.dispatch.dispatch import Dispatch
from ..store.cadence.lost_retry import LostRetry
from ..store.repository import Repository
from ..store.cadence.retention import Retention
from ..wire.bridge import Bridge

log = logging.getLogger("qlactors.edge")

CONTROL_ENDPOINT = "inproc://qlactors-control"
# The executor side's worker id on edge (its one built-in local session).
LOCAL_WORKER = "local"
# A small box's runtime: its threads share the one main malloc arena (process/malloc.py).
EDGE_MALLOC_ARENAS = 1

ORDER = (("gateway", Gateway), ("recovery", Recovery), ("retry", Retry), ("scheduler", Scheduler),
         ("receipts", ReceiptConsumer), ("executor", Executor))
"""The start order: four control-side actors, then two executor-side ones."""


@dataclass(kw_only=True)
class EdgeContext(SharedContext):
    """Both sides in one process (edge): the shared part, and each side's own context built over
    it (the same config, bridge, directory, fatal switch, admission and health: one SQLite file
    holds the runs and the journal). Held side by side, never merged: a control-side actor gets
    `control_side`, an executor-side one `executor_side`."""

    control_side: ControlContext
    executor_side: ExecutorContext

    @classmethod
    def over(cls, shared: SharedContext, *, control: dict, executor: dict) -> "EdgeContext":
        common = shared.shared()
        return cls(**common, control_side=ControlContext(**common, **control),
                   executor_side=ExecutorContext(**common, **executor))

    def side_of(self, actor: type) -> SharedContext:
        """The context an actor class takes: its side's, by the package it lives in (control/ or
        executor/); the shared part for a runtime/ one (the Supervisor)."""
        home = next((c.__module__ for c in actor.__mro__ if c.__module__.startswith("qlactors.")), "")
        if home.startswith("qlactors.control."):
            return self.control_side
        if home.startswith("qlactors.executor."):
            return self.executor_side
        return self

    def order(self, order: tuple[tuple[str, type], ...]) -> tuple[tuple[str, type, SharedContext], ...]:
        return tuple((name, actor, self.side_of(actor)) for name, actor in order)


class EdgeRuntime(Runner):
    """Both sides in this process: the control side and the executor side meet over inproc."""

    name = "edge"
    log = log

    def __init__(self, config: Config, *, cancel_running: bool = False, launcher_shell: str = "/bin/sh",
                 boot_id: Callable[[], str] | None = None, free_bytes: Callable[[], int] | None = None) -> None:
        super().__init__(config)
        self.free_bytes = free_bytes or free_space_source(config.logs_dir)
        self.cancel_running = cancel_running
        self.launcher_shell = launcher_shell
        self.boot_id = boot_id or boot_id_source()

    # -- start --------------------------------------------------------------------------------

    def _build_and_start(self) -> EdgeContext:
        limit_arenas(EDGE_MALLOC_ARENAS)  # before any actor or bridge thread exists
        ensure_home(self.config)
        repo = Repository.open(self.config.database_url)
        store = repo.store
        receipts = ReceiptStore(self.config.receipts_dir)
        receipts.ensure()
        logs = LogStore(self.config.logs_dir)
        logs.ensure()
        journal = Journal(store)
        zctx = zmq.Context()
        bridge = Bridge(zctx, control_bind=CONTROL_ENDPOINT, control_connect=CONTROL_ENDPOINT,
                        nudge_bind=nudge_endpoint(self.config.home))
        directory = Directory()
        fatal = Fatal(on_trip=self._poke)
        admitting = threading.Event()
        dispatch = Dispatch.open(store)
        session = dispatch.sessions.register(LOCAL_WORKER, self.config.runtime.slots)
        local_receipts = LocalReceipts(receipts, journal, self.config.runtime.quarantine_retention_ms)
        shared = SharedContext(config=self.config, zmq=zctx, bridge=bridge, directory=directory, fatal=fatal,
                               admitting=admitting, health=store.health)
        ctx = EdgeContext.over(
            shared,
            control=dict(
                repo=repo, dispatch=dispatch, completion=CompletionService(store), control=Control.open(store),
                lost_retry=LostRetry(store), cron=CronAdmission(store),
                retention=Retention(store, EdgeFiles(journal, logs, receipts)),
                sessions=LocalSessions(session, self.config.runtime.cadence_tick_ms,
                                       DiskReserve(self.config, self.free_bytes)),
                local=EdgeEvidence(journal, receipts, local_receipts, self.boot_id, session),
                cycle_health=CycleHealth(on_change=published_in(self.config.home))),
            executor=dict(journal=journal, receipts=receipts, logs=logs, local_receipts=local_receipts,
                          session=session, boot_id=self.boot_id, launcher_shell=self.launcher_shell))
        self.ctx = ctx
        watch_store(ctx)
        bridge.route_control(directory.named("gateway"))
        bridge.route_executor(EXECUTOR_KINDS, directory.named("executor"))
        bridge.route_executor(["ack:completed"], directory.named("receipts"))
        bridge.route_nudge(directory.named("supervisor"))
        self._start_actors(ctx, ctx.order(ORDER), Supervisor)
        return ctx

    def _started_line(self) -> str:
        return f"event=edge_started home={self.config.home} slots={self.config.runtime.slots}"

    # -- shutdown -----------------------------------------------------------------------------

    def _shutdown(self, ctx: EdgeContext) -> None:
        budget_s = ctx.config.runtime.shutdown_drain_ms / 1000
        deadline = time.monotonic() + budget_s
        ctx.admitting.clear()
        ctx.directory.tell("supervisor", Drain(cancel_running=self.cancel_running))
        if self.cancel_running:
            try:
                self._cancel_running(ctx, deadline)
            except QlactorsError as err:  # the database fails (maybe why we stop): stop anyway
                if err.exit_status is None:  # a bug (InvalidTransition...) is not a failing database
                    raise
                log.error("event=cancel_running_failed error=%s (the jobs not cancelled are left running "
                          "and recovered on the next start)", err)
        self._stop_actors(ctx, [n for n, _ in reversed(ORDER)] + ["supervisor"], deadline)
        alive = [name for name in ctx.directory.names() if ctx.directory.get(name).is_alive()]
        if alive:
            log.error("event=actors_still_alive actors=%s", alive)
        ctx.bridge.close()
        ctx.zmq.term()
        ctx.control_side.repo.close()
        log.info("event=edge_stopped")

    def _cancel_running(self, ctx: EdgeContext, deadline: float) -> None:
        """`edge --cancel-running`: commit a `shutdown` intent (never over another reason), stop, wait."""
        control = ctx.control_side
        for run_id in control.control.status.active_run_ids():
            control.repo.runs.cancel(run_id, CancelReason.SHUTDOWN, actor_type="system")
        ctx.directory.tell("scheduler", Tick("shutdown"))
        while time.monotonic() < deadline and control.control.status.active_run_ids():
            time.sleep(0.05)
