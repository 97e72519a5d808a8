"""Executor side: launching and stopping an attempt, the effects the attempt machine
(executor/attempt.py) asks for — journal an accepted offer, make its log file, send its Activate;
journal `launching`, spawn the launcher (its identity read before anything can reap it), journal
its identity, watch it, owe its Started (or its StartFailed); and stop a launched one by its exact
identity (TERM, then KILL after its grace). Which of them happen, and when, is the machine's.

A part the Executor holds (executor/executor.py).
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import time
from typing import Any, Callable

from ..clock import wall_ms
from ..config import Config
from ..domain.receipt import token_hash
from ..errors import StoreUnavailable
from ..faults import crash_point, raise_point
from ..ids import new_id
from ..process.identity import Liveness, read_identity
from ..process.launch import LaunchFiles, launcher_environment, signal_job, spawn, uptime_ms
from ..process.logs import LogStore
from ..process.receipts import ReceiptStore
from ..runtime.context import Named
from ..runtime.signals import StopCheck
from ..wire import codec
from ..wire import messages as m
from ..wire.bridge import Bridge
from .journal.journal import Journal
from .journal.records import LeaseFacts
from .local_receipts import LocalReceipts
from .owed_reports import OwedReports
from .session_policy import CurrentSession
from .slots import Local

log = logging.getLogger("qlactors.executor")


class Launching:
    """Accept, activate, launch and stop (see the module docstring)."""

    def __init__(self, *, config: Config, journal: Journal, receipts: ReceiptStore, logs: LogStore,
                 local_receipts: LocalReceipts, boot_id: Callable[[], str], launcher_shell: str, bridge: Bridge,
                 me: Named, current: CurrentSession, owed: OwedReports, send: Callable[[Any], None]) -> None:
        self.config, self.journal, self.receipts, self.logs = config, journal, receipts, logs
        self.local_receipts, self.boot_id, self.launcher_shell = local_receipts, boot_id, launcher_shell
        self.bridge, self.me, self.current = bridge, me, current
        self.owed, self.send = owed, send

    # -- accept -------------------------------------------------------------------------------

    @staticmethod
    def offered(offer: m.Offer, lease_token: str | None, batch: m.Offers) -> Local:
        """An offer, not journalled yet (OFFERED), with the token its launcher will present. Its
        lease (quoted in an Attest after a restart) needs the pair's token: None when unknown."""
        lease = None if not lease_token else LeaseFacts(offer.offer_id, offer.lease_generation, lease_token,
                                                        batch.session_id, batch.session_generation)
        return Local(run_id=offer.run_id, attempt_id=offer.attempt_id, offer=offer, lease_token=lease_token or "",
                     token=secrets.token_urlsafe(32), grace_ms=offer.stop_grace_ms, session_id=batch.session_id,
                     session_generation=batch.session_generation, lease=lease)

    def journal_accept(self, local: Local) -> bool:
        """Journal first, then the log file, then the Activate (SEMANTICS.md §4). The same attempt
        offered again (its earlier lease released before activation) keeps its journal row, with
        the new token hash, and its emptied log file. False when the journal has it launched."""
        log_path = self.logs.path_for(local.run_id, local.attempt_id)
        receipt_path = self.receipts.final_path(local.attempt_id)
        if not self.journal.accept(local.attempt_id, local.run_id, str(log_path), str(receipt_path),
                                   token_hash(local.token), local.lease):
            log.error("event=offer_of_a_launched_attempt attempt=%s journal=launched", local.attempt_id)
            return False
        return True

    def create_log(self, local: Local) -> None:
        raise_point("executor_after_accept")
        self.logs.create(local.run_id, local.attempt_id)

    def send_activate(self, local: Local) -> None:
        """Ask for activation (sent again each heartbeat interval until answered: ACTIVATE_DUE)."""
        if local.activate_request_id:
            log.warning("event=activate_repeated run=%s attempt=%s", local.run_id, local.attempt_id)
        else:
            local.activate_request_id = new_id()
        local.activate_sent_at = time.monotonic()
        self.send(m.Activate(**self.fence(local), request_id=local.activate_request_id,
                             callback_token_hash=token_hash(local.token),
                             log_artifact_id=self.logs.artifact_id(local.run_id, local.attempt_id)))

    def fence(self, local: Local, lease_version: int | None = None) -> dict[str, Any]:
        o = local.offer
        return dict(worker_id=self.current.worker_id, session_id=local.session_id,
                    session_generation=local.session_generation,
                    run_id=o.run_id, attempt_id=o.attempt_id, offer_id=o.offer_id,
                    lease_generation=o.lease_generation, lease_token=local.lease_token,
                    lease_version=o.lease_version if lease_version is None else lease_version)

    def answers_activate(self, local: Local | None, msg: Any) -> bool:
        """Whether `msg` (an Activated, an Ack of an Activate) answers the Activate of the offer held."""
        return (local is not None and local.offer is not None and local.offer.offer_id == msg.offer_id
                and msg.answer_to == local.activate_request_id)

    # -- launch -------------------------------------------------------------------------------

    def journal_launching(self, local: Local) -> None:
        """The activation on this clock (a worker's), then `launching`: journalled before the spawn,
        so that a restart never spawns it again (a row `launching` with no identity is
        `launch_unknown`)."""
        self.current.policy.activated(local)
        self.journal.set_state(local.attempt_id, "launching")

    def spawn(self, local: Local) -> str:
        """Spawn the launcher and read its identity before anything can reap it (we are the only
        reaper, and only of our own pids). Returns "" when it runs, else why nothing was spawned."""
        offer = local.offer
        # The offer names the cap; this executor's own setting bounds it (a worker's config).
        log_cap = min(offer.log_cap_bytes, self.config.runtime.log_cap_bytes)
        boot_id = self.boot_id()
        receipt_dir = str(self.receipts.shard_dir(offer.attempt_id))  # made (0700) before anything else
        if offer.cwd and not os.path.isdir(offer.cwd):
            # Checked by `task add` when it could be; a directory gone since then is a start
            # failure, not a job that "exited 126" (the launcher's own check stays, for a race).
            log.error("event=start_failed run=%s attempt=%s reason=cwd_not_a_directory",
                      offer.run_id, offer.attempt_id)
            return f"working directory {offer.cwd} is not a directory (or is gone)"
        # The log-cap FIFO is made here, not by the launcher (mkdir + mkfifo + rm would cost it
        # three execs). Without one the launcher runs the job uncapped rather than not at all.
        fifo = self.local_receipts.make_fifo(offer.attempt_id) if log_cap > 0 else None
        files = LaunchFiles(receipt_dir=receipt_dir, marker=str(self.receipts.marker_path(offer.attempt_id)),
                            log=str(self.logs.path_for(offer.run_id, offer.attempt_id)),
                            dropped=str(self.local_receipts.dropped_path(offer.attempt_id)),
                            fifo=None if fifo is None else str(fifo))
        env = launcher_environment(os.environ, offer.env, run_id=offer.run_id, attempt_id=offer.attempt_id,
                                   files=files, log_cap=log_cap, clock_base_ms=wall_ms() - uptime_ms(),
                                   stop_grace_ms=offer.stop_grace_ms, drain_ms=self.config.runtime.output_drain_ms,
                                   cwd=offer.cwd, keep_leftovers=offer.keep_leftovers)
        try:
            pid = spawn(list(offer.argv), env, token=local.token, shell=self.launcher_shell)
        except OSError as err:
            log.error("event=spawn_failed run=%s attempt=%s error=%s", offer.run_id, offer.attempt_id, err)
            self.local_receipts.remove_fifo(offer.attempt_id)
            return f"spawn failed: {err.strerror or err}"
        crash_point("after_spawn")
        local.identity = read_identity(pid, boot_id=boot_id)
        local.pidfd = os.pidfd_open(pid)
        return ""

    def journal_started(self, local: Local) -> None:
        try:
            self.journal.set_state(local.attempt_id, "started", identity=local.identity)
        except StoreUnavailable as err:  # the launcher runs: go on; its start marker and the
            # Started report carry the identity, and recovery and adoption fall back to the marker
            log.warning("event=journal_identity_unwritten attempt=%s error=%s", local.attempt_id, err)

    def watch(self, local: Local) -> None:
        self.bridge.watch(local.pidfd, local.attempt_id, self.me)
        self.current.policy.launched(local, self.current.worker_id)

    def owe_started(self, local: Local, lease_version: int | None) -> None:
        i = local.identity
        self.owed.owe(m.Started(**self.fence(local, lease_version), request_id=new_id(), boot_id=i.boot_id,
                                pid=i.pid, pgid=i.pgid, start_ticks=i.start_ticks), local.attempt_id)
        log.info("event=launched run=%s attempt=%s pid=%d", local.run_id, local.attempt_id, i.pid)

    def owe_start_failed(self, local: Local, lease_version: int | None, reason: str) -> None:
        """Nothing was spawned: the start failure is owed (the row stays until it is answered)."""
        self.owed.owe(m.StartFailed(**self.fence(local, lease_version), request_id=new_id(), reason=reason),
                      local.attempt_id)

    def holds_lease_of(self, local: Local, report: Any) -> bool:
        """Whether `local` still holds the lease the owed report was about (offer id, generation)."""
        sent = codec.decode([codec.HEADER, report.body])
        lease = local.lease
        return lease is not None and (lease.offer_id, lease.lease_generation) == (sent.offer_id,
                                                                                  sent.lease_generation)

    # -- stop ---------------------------------------------------------------------------------

    def _signal(self, local: Local, sig: signal.Signals) -> Liveness:
        """Signal the job's process group by exact identity (launch.signal_job); note what it got."""
        marker = self.receipts.marker_path(local.attempt_id)
        liveness = signal_job(local.identity, marker, sig, current_boot_id=self.boot_id())
        if liveness is Liveness.RUNNING:
            local.sent = "kill" if sig == signal.SIGKILL else "term"
        return liveness

    def begin_stop(self, local: Local, reason: str) -> None:
        liveness = self._signal(local, signal.SIGTERM)
        log.info("event=stop_term attempt=%s reason=%s liveness=%s", local.attempt_id, reason, liveness.name)
        self.bridge.call_at(f"stop:{local.attempt_id}", time.monotonic() + local.grace_ms / 1000,
                            self.me, StopCheck(local.attempt_id, "term"))

    def kill(self, local: Local) -> None:
        """The stop grace went by: KILL the job's group; the launcher outlives its job, stops what
        is left (TERM, the task's stop grace, KILL), drains and publishes, and is checked once more
        after that."""
        if self._signal(local, signal.SIGKILL) is not Liveness.RUNNING:
            return  # gone: its exit comes
        log.info("event=stop_kill attempt=%s", local.attempt_id)
        runtime = self.config.runtime
        wait_ms = runtime.kill_grace_ms + local.grace_ms + runtime.output_drain_ms
        self.bridge.call_at(f"stop:{local.attempt_id}", time.monotonic() + wait_ms / 1000,
                            self.me, StopCheck(local.attempt_id, "kill"))
