"""Profile: the cluster's control replica: PostgreSQL, the Supervisor, the Gateway to workers over
tcp + CurveZMQ, Scheduler, Recovery and Retry (SEMANTICS.md §9, §10). It holds no process and
reads no worker's files: every decision is the database's, from what workers attest.

Start: open the database and migrate it under an advisory lock (a newer schema is refused),
load the allow-list, start the CURVE authenticator on the server socket's context before the
bridge binds, register this replica for `status`, start the actors; admission opens once the
first recovery page is done. Every cycle checks the authenticator is running (else the replica
stops, exit 1), then refreshes the allow-list cache and the replica's row.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import socket
import threading
import time
from typing import Any

import zmq

from ..config import ControlConfig
from ..config import Config
from ..control.cluster_recovery import ClusterRecovery
from ..control.context import ControlContext
from ..control.gateway import Gateway
from ..control.retry import Retry
from ..control.scheduler import Scheduler
from ..control.session_policy import ClusterSessions
from ..domain.resume_secret import resume_secret
from ..runtime.context import Directory, Fatal
from ..runtime.outage import watch_store
from ..runtime.runner import Runner
from ..runtime.signals import Drain
from ..runtime.supervisor import Supervisor
from ..store.dispatch.completion import CompletionService
from ..store.cadence.control import Control
from ..store.cadence.cron_admission import CronAdmission
from ..store.dispatch.dispatch import Dispatch
from ..store.dispatch.log_chunks import LogChunks
from ..store.cadence.lost_retry import LostRetry
from ..store.admin.replicas import Replicas
from ..store.repository import Repository
from ..store.cadence.retention import Retention
from ..store.admin.worker_keys import WorkerKeys
from ..wire.bridge import Bridge
from ..wire.curve import AllowList, CurveServer, start_authenticator
from ..wire.curve_keys import load_key_pair

log = logging.getLogger("qlactors.control")

ORDER = (("gateway", Gateway), ("recovery", ClusterRecovery), ("retry", Retry), ("scheduler", Scheduler))


def control_settings(cfg: ControlConfig) -> Config:
    """The actors' view of a replica's config (SEMANTICS.md §11, cluster column). A replica is a
    server: its cadence does not slow down when idle (workers learn of new runs from its nudges)."""
    runtime = dataclasses.replace(cfg.runtime_settings(), idle_tick_ms=cfg.cadence_tick_ms)
    return Config(home=cfg.path.parent, profile="control", database_url=cfg.database.url, runtime=runtime)


class ControlRuntime(Runner):
    """One control replica in the foreground until SIGTERM/SIGINT."""

    name = "control"
    log = log

    def __init__(self, cfg: ControlConfig) -> None:
        super().__init__(control_settings(cfg))
        self.cfg = cfg
        self.replica_id: str | None = None
        self.authenticator: Any = None  # the CURVE authenticator, kept referenced while the replica serves

    def _acquire(self):
        return lambda: None  # replicas share nothing on a host: each binds its own port

    def _build_and_start(self) -> ControlContext:
        cfg = self.cfg
        public, secret = load_key_pair(cfg.key)
        repo = Repository.open(cfg.database.url, **cfg.database.store_options())
        store = repo.store
        keys = WorkerKeys(store)
        allow = AllowList(keys.all())
        self.replicas = replicas = Replicas(store)
        zctx = zmq.Context()
        # Before the bridge binds, kept referenced while it serves: without it the replica refuses to serve.
        self.authenticator = authenticator = start_authenticator(zctx, allow)
        bridge = Bridge(zctx, control_bind=cfg.bind, curve=CurveServer(secret, allow, authenticator),
                        heartbeat_ms=cfg.heartbeat_ms)
        directory = Directory()
        fatal = Fatal(on_trip=self._poke)
        dispatch = Dispatch.open(store)
        control = Control.open(store)
        self.replica_id = replicas.register(socket.gethostname(), os.getpid(), cfg.bind)

        def authenticator_running() -> None:
            # Its frames are checked as they come; an idle replica would go on looking healthy
            # (its row in `status`, its cron admission) while no worker can connect: stop it, so
            # its service manager restarts it with a new one (SEMANTICS.md §9 Identity).
            if not authenticator.is_alive():
                log.error("event=curve_authenticator_down action=stop_replica")
                fatal.trip("the CurveZMQ authenticator is not running, so no worker can be "
                           "authenticated; the replica stops (a restart starts a new one)")

        def refresh_allow_list() -> None:
            allow.replace(keys.all())

        def replica_heartbeat() -> None:
            replicas.heartbeat(self.replica_id, store.health.tally(), self.ctx.cycle_health.current)

        sessions = ClusterSessions(dispatch, LogChunks(store), control, heartbeat_ms=cfg.heartbeat_ms,
                                   session_lease_ms=cfg.session_lease_ms, run_lease_ms=cfg.run_lease_ms,
                                   # every replica loads the same key pair: one secret per Register
                                   resume_secret=functools.partial(resume_secret, secret))
        ctx = ControlContext(
            config=self.config, zmq=zctx, bridge=bridge, directory=directory, fatal=fatal,
            admitting=threading.Event(), health=store.health, repo=repo, dispatch=dispatch,
            completion=CompletionService(store), control=control, lost_retry=LostRetry(store),
            cron=CronAdmission(store), retention=Retention(store, None), sessions=sessions,
            each_cycle=(authenticator_running, refresh_allow_list, replica_heartbeat, sessions.ledger.prune_due),
            recovery_grace_ms=cfg.recovery_grace_ms, drain_grace_ms=cfg.drain_grace_ms)
        self.ctx = ctx
        watch_store(ctx)
        bridge.route_control(directory.named("gateway"))
        self._start_actors(ctx, tuple((name, cls, ctx) for name, cls in ORDER), Supervisor)
        return ctx

    def _started_line(self) -> str:
        return (f"event=control_started replica={self.replica_id} bind={self.cfg.bind} "
                f"database={self.ctx.repo.store.describe()}")

    def _shutdown(self, ctx: ControlContext) -> None:
        deadline = time.monotonic() + ctx.config.runtime.shutdown_drain_ms / 1000
        ctx.admitting.clear()
        ctx.directory.tell("supervisor", Drain())
        self._stop_actors(ctx, [n for n, _ in reversed(ORDER)] + ["supervisor"], deadline)
        ctx.bridge.close()
        if self.authenticator is not None:
            self.authenticator.stop()
        if self.replica_id is not None:
            try:
                self.replicas.stopped(self.replica_id)
            except Exception as err:  # the database is gone: `status` sees the heartbeat age out
                log.warning("event=replica_stop_unrecorded error=%r", err)
        ctx.zmq.term()
        ctx.repo.close()
        log.info("event=control_stopped")
