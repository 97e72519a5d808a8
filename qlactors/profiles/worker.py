"""Profile: a cluster executor worker: the Executor, the ReceiptConsumer and the LogSender, its own
SQLite journal in its state directory, and one CurveZMQ socket per control replica. It holds no
database credentials: it learns its worker id (its key's, from the allow-list) in Welcome.

Start: lock the state directory (a second worker on it refuses to start), open the journal,
connect to every replica, start the actors; the Executor registers — resuming its saved session
when it is still valid — and probes and re-attests its journal after every start.
Stop (SIGTERM, SEMANTICS.md §9 Drain): stop pulling; the Executor tells its replica the session
is `draining`, declines every offer it accepted but never launched, then says `offline`
(executor/draining.py) — waited for at most `LEAVE_SHARE` of `shutdown_drain_ms`, never
longer (an unreachable replica lets the session expire instead); then stop the actors. Running
jobs keep running (a restart resumes or re-attests them), their receipts and logs wait in the
state directory.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable

import zmq

from ..config import WorkerConfig
from ..config import Config
from ..executor.context import EXECUTOR_KINDS, ExecutorContext
from ..executor.disk_reserve import DiskReserve
from ..executor.executor import Executor
from ..executor.journal.journal import Journal
from ..executor.local_receipts import LocalReceipts
from ..executor.log_retention import LocalLogRetention
from ..executor.log_sender import LogSender
from ..executor.receipt_consumer import ReceiptConsumer
from ..executor.state_dir import StateDir
from ..process.diskspace import free_space_source
from ..process.identity import boot_id_source
from ..process.logs import LogStore
from ..process.receipts import ReceiptStore
from ..runtime.context import Directory, Fatal
from ..runtime.outage import watch_store
from ..runtime.runner import Runner
from ..runtime.signals import Drain, DrainSession
from ..runtime.supervisor import Supervisor
from ..wire.bridge import Bridge
from ..wire.curve_keys import load_key_pair, load_public_key
from ..wire.links import ReplicaLinks

log = logging.getLogger("qlactors.worker")

ORDER = (("receipts", ReceiptConsumer), ("logs", LogSender), ("executor", Executor))
# How much of the shutdown budget leaving the session may take; stopping the actors has the rest.
LEAVE_SHARE = 0.5


def worker_settings(cfg: WorkerConfig) -> Config:
    """The actors' view of a worker's config: its home is the state directory."""
    return Config(home=cfg.state_dir, profile="worker", database_url="", runtime=cfg.runtime_settings(),
                  launcher_shell=cfg.launcher_shell)


class WorkerFacts:
    """What a worker's Completed adds (SEMANTICS.md §5, §13): the log's final offset, and whether
    the job finished before the deadline this worker derived on its own clock at activation."""

    def __init__(self, journal: Journal, logs: LogStore) -> None:
        self.journal = journal
        self.logs = logs

    def __call__(self, attempt_id: str, receipt: Any) -> tuple[int | None, bool | None]:
        entry = self.journal.get(attempt_id)
        final = None
        try:
            final = os.stat(self.logs.path_for(receipt.run_id, attempt_id)).st_size
        except OSError:
            final = 0  # no log file: nothing was written, nothing is to be shipped
        deadline = getattr(entry, "local_deadline_ms", None) if entry is not None else None
        in_time = None if deadline is None else receipt.finished_at_ms <= deadline
        return final, in_time


class WorkerRuntime(Runner):
    """One executor worker in the foreground until SIGTERM/SIGINT."""

    name = "worker"
    log = log

    def __init__(self, cfg: WorkerConfig, *, boot_id: Callable[[], str] | None = None) -> None:
        super().__init__(worker_settings(cfg))
        self.cfg = cfg
        self.boot_id = boot_id or boot_id_source()
        self.state: StateDir | None = None

    def _acquire(self):
        self.state = StateDir(self.cfg.state_dir)  # exclusive: a second worker here refuses

        def release() -> None:
            self.state.close()
        return release

    def _build_and_start(self) -> ExecutorContext:
        cfg, state = self.cfg, self.state
        public, secret = load_key_pair(cfg.key)
        server_public = load_public_key(cfg.server_key)
        journal = Journal(state.journal)
        receipts = ReceiptStore(state.receipts)
        receipts.ensure()
        logs = LogStore(state.logs)
        logs.ensure()
        zctx = zmq.Context()
        links = ReplicaLinks(zctx, list(cfg.control), server_public=server_public, public=public,
                             secret=secret, request_timeout_s=cfg.request_timeout_ms / 1000,
                             heartbeat_ms=10_000, handshake_failures_max=cfg.handshake_failures_max)
        bridge = Bridge(zctx, control_links=links)
        directory = Directory()
        fatal = Fatal(on_trip=self._poke)
        bridge.on_version_mismatch = lambda why: fatal.trip(f"the control side speaks another protocol: {why}")
        links.on_give_up = fatal.trip
        admitting = threading.Event()
        local_receipts = LocalReceipts(receipts, journal, self.config.runtime.quarantine_retention_ms)
        ctx = ExecutorContext(
            config=self.config, zmq=zctx, bridge=bridge, directory=directory, fatal=fatal,
            admitting=admitting, health=journal.store.health, journal=journal, receipts=receipts, logs=logs,
            local_receipts=local_receipts,
            boot_id=self.boot_id, launcher_shell=self.config.launcher_shell, labels=tuple(cfg.labels),
            log_retention=LocalLogRetention(journal, logs, local_receipts),
            disk_reserve=DiskReserve(self.config, free_space_source(state.logs)),
            completion_facts=WorkerFacts(journal, logs), public_key=public.decode("ascii"))
        self.ctx = ctx
        watch_store(ctx)
        bridge.route_executor(EXECUTOR_KINDS, directory.named("executor"))
        bridge.route_executor(["ack:completed"], directory.named("receipts"))
        bridge.route_executor(["log_ack"], directory.named("logs"))
        # No recovery here: a worker admits what the control side offers from the start.
        self._start_actors(ctx, tuple((name, cls, ctx) for name, cls in ORDER), Supervisor)
        return ctx

    def _started_line(self) -> str:
        return (f"event=worker_started state_dir={self.cfg.state_dir} slots={self.cfg.slots} "
                f"labels={','.join(self.cfg.labels) or '-'} control={','.join(self.cfg.control)}")

    def _shutdown(self, ctx: ExecutorContext) -> None:
        budget_s = ctx.config.runtime.shutdown_drain_ms / 1000
        deadline = time.monotonic() + budget_s
        ctx.admitting.clear()  # no more pulls; running jobs keep running
        self._leave_session(ctx, budget_s * LEAVE_SHARE)
        ctx.directory.tell("supervisor", Drain())
        self._stop_actors(ctx, [n for n, _ in reversed(ORDER)] + ["supervisor"], deadline)
        ctx.bridge.close()
        ctx.zmq.term()
        log.info("event=worker_stopped")

    @staticmethod
    def _leave_session(ctx: ExecutorContext, wait_s: float) -> None:
        """The Executor's drain (decline the unlaunched offers, leave the session), waited for at
        most `wait_s`: past it the worker stops anyway and its session expires on its own."""
        drain = DrainSession(threading.Event())
        started = time.monotonic()
        if not ctx.directory.tell("executor", drain):
            log.warning("event=session_not_left reason=executor_not_running")
            return
        if drain.done.wait(wait_s):
            if drain.no_session.is_set():
                log.info("event=stopped_without_session (this worker had no session to leave: it never "
                         "registered, or its session had ended)")
            else:
                log.info("event=session_drained seconds=%.3f", time.monotonic() - started)
        else:
            log.warning("event=session_not_left reason=no_answer waited_s=%.1f (the session expires "
                        "at its lease; its running jobs are re-attested after the restart)", wait_s)
