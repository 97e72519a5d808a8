"""Executor side: launching and stopping an attempt — accept an offer (journal first, then the log
file, then Activate), launch on `Activated` (the launcher spawned, its identity read before
anything can reap it, Started owed), and stop a launched one by its exact identity (TERM, then
KILL after its grace). Answers to Activate that refuse it give the attempt back, never launched.

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
from ..domain.results import SETTLED
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
from .slots import Local, Slots

log = logging.getLogger("qlactors.executor")


class Launching:
    """Accept, activate, launch and stop (see the module docstring)."""

    def __init__(self, *, config: Config, journal: Journal, receipts: ReceiptStore, logs: LogStore,
                 local_receipts: LocalReceipts, boot_id: Callable[[], str], launcher_shell: str, bridge: Bridge,
                 me: Named, current: CurrentSession, slots: Slots, owed: OwedReports, send: Callable[[Any], None],
                 pull: Callable[[], None], draining: Callable[[], bool]) -> None:
        self.config, self.journal, self.receipts, self.logs = config, journal, receipts, logs
        self.local_receipts, self.boot_id, self.launcher_shell = local_receipts, boot_id, launcher_shell
        self.bridge, self.me, self.current, self.slots = bridge, me, current, slots
        self.owed, self.send, self.pull, self.draining = owed, send, pull, draining

    # -- accept -------------------------------------------------------------------------------

    def accept(self, offer: m.Offer, lease_token: str, batch: m.Offers) -> None:
        held = self.slots.get(offer.attempt_id)
        if held is not None and held.identity is not None:  # launched here: never twice
            log.error("event=offer_of_a_launched_attempt attempt=%s", offer.attempt_id)
            return
        token = secrets.token_urlsafe(32)
        # Accept: journal first, then the log file, then ask for activation (SEMANTICS.md §4).
        # The same attempt offered again (its earlier lease released before activation) keeps
        # its journal row, with the new token hash, and its emptied log file.
        log_path = self.logs.path_for(offer.run_id, offer.attempt_id)
        receipt_path = self.receipts.final_path(offer.attempt_id)
        lease = LeaseFacts(offer.offer_id, offer.lease_generation, lease_token, batch.session_id,
                           batch.session_generation)  # quoted in an Attest after a restart
        if not self.journal.accept(offer.attempt_id, offer.run_id, str(log_path), str(receipt_path),
                                   token_hash(token), lease):
            log.error("event=offer_of_a_launched_attempt attempt=%s journal=launched", offer.attempt_id)
            return
        local = Local(run_id=offer.run_id, attempt_id=offer.attempt_id, offer=offer,
                      lease_token=lease_token, token=token, grace_ms=offer.stop_grace_ms,
                      session_id=batch.session_id, session_generation=batch.session_generation, lease=lease)
        self.slots.hold(local)
        raise_point("executor_after_accept")
        self.logs.create(offer.run_id, offer.attempt_id)
        self.send_activate(local)

    def send_activate(self, local: Local) -> None:
        """Ask for activation (sent again each heartbeat interval until answered: session_reports.py)."""
        local.activate_sent_at = time.monotonic()
        if not local.activate_request_id:
            local.activate_request_id = new_id()
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

    # -- launch -------------------------------------------------------------------------------

    def on_activated(self, msg: m.Activated, _peer: bytes) -> None:
        local = self.slots.get(msg.attempt_id)
        if local is None or local.offer is None or local.identity is not None:
            return  # not ours (an instance that died asked for it), or already launched
        if local.offer.offer_id != msg.offer_id or msg.answer_to != local.activate_request_id:
            return  # the answer to an earlier offer of the same attempt
        if local.activation_refused:
            return  # a late answer to an earlier copy: refused since, given back (never launched)
        local.activate_sent_at = None  # answered
        if self.draining():
            return  # draining: never launched, its Decline is answered `refused` and it is given back
        offer = local.offer
        self.current.policy.activated(local)
        # The offer names the cap; this executor's own setting bounds it (a worker's config).
        log_cap = min(offer.log_cap_bytes, self.config.runtime.log_cap_bytes)
        self.journal.set_state(offer.attempt_id, "launching")
        boot_id = self.boot_id()
        receipt_dir = str(self.receipts.shard_dir(offer.attempt_id))  # made (0700) before anything else
        if offer.cwd and not os.path.isdir(offer.cwd):
            # Checked by `task add` when it could be; a directory gone since then is a start
            # failure, not a job that "exited 126" (the launcher's own check stays, for a race).
            log.error("event=start_failed run=%s attempt=%s reason=cwd_not_a_directory",
                      offer.run_id, offer.attempt_id)
            self._start_failed(local, msg, f"working directory {offer.cwd} is not a directory "
                                           f"(or is gone)")
            return
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
            self._start_failed(local, msg, f"spawn failed: {err.strerror or err}")
            return
        crash_point("after_spawn")
        self._launched(local, msg, pid, boot_id)

    def _launched(self, local: Local, msg: m.Activated, pid: int, boot_id: str) -> None:
        """Spawned: its identity before anything can reap it (we are the only reaper, and only of
        our own pids), watched, Started owed."""
        offer = local.offer
        local.identity = read_identity(pid, boot_id=boot_id)
        local.pidfd = os.pidfd_open(pid)
        try:
            self.journal.set_state(offer.attempt_id, "started", identity=local.identity)
        except StoreUnavailable as err:  # the launcher runs: go on; its start marker and the
            # Started report carry the identity, and recovery and adoption fall back to the marker
            log.warning("event=journal_identity_unwritten attempt=%s error=%s", offer.attempt_id, err)
        self.bridge.watch(local.pidfd, offer.attempt_id, self.me)
        self.current.policy.launched(local, self.current.worker_id)
        i = local.identity
        self.owed.owe(m.Started(**self.fence(local, msg.lease_version), request_id=new_id(), boot_id=i.boot_id,
                                pid=i.pid, pgid=i.pgid, start_ticks=i.start_ticks), offer.attempt_id)
        log.info("event=launched run=%s attempt=%s pid=%d", offer.run_id, offer.attempt_id, pid)

    def _start_failed(self, local: Local, activated: m.Activated, reason: str) -> None:
        """Nothing was spawned: report the start failure (owed: the row stays until it is answered),
        give the slot back."""
        self.owed.owe(m.StartFailed(**self.fence(local, activated.lease_version), request_id=new_id(),
                                    reason=reason), local.attempt_id)
        self.journal.clear(local.attempt_id)
        self.slots.release(local.attempt_id)
        self.pull()

    # -- answers to Activate and Started ------------------------------------------------------

    def holds_lease_of(self, local: Local, report: Any) -> bool:
        """Whether `local` still holds the lease the owed report was about (offer id, generation)."""
        sent = codec.decode([codec.HEADER, report.body])
        lease = local.lease
        return lease is not None and (lease.offer_id, lease.lease_generation) == (sent.offer_id,
                                                                                  sent.lease_generation)

    def activate_answered(self, msg: m.Ack) -> None:
        local = self.slots.get(msg.attempt_id)
        if msg.result in SETTLED:
            return
        if local is None or local.offer is None or local.offer.offer_id != msg.offer_id \
                or msg.answer_to != local.activate_request_id:
            log.info("event=answer_ignored of=activate attempt=%s result=%s (about another offer)",
                     msg.attempt_id, msg.result)
            return
        if local.identity is not None or local.activation_refused:
            # Launched from another copy's `Activated` (or given back already): a late refusal
            # never undoes a launch (SEMANTICS.md §9 Exchange).
            log.warning("event=answer_ignored of=activate attempt=%s result=%s detail=%s (already %s)",
                        msg.attempt_id, msg.result, msg.detail,
                        "launched" if local.identity is not None else "given back")
            return
        log.warning("event=report_%s of=activate attempt=%s detail=%s", msg.result, msg.attempt_id, msg.detail)
        self._activation_refused(local)

    def _activation_refused(self, local: Local) -> None:
        """Never launch it; and since an earlier copy of this Activate (the link re-sends what a
        replica left unanswered) may have been committed, leave the evidence that nothing ran:
        `never_launched`, which recovery trusts, not silence (a `starting` attempt nobody
        attests waits for ever). The give-back is owed: if the session it is sent from has
        ended, it is re-made from the next one. Edge: the slot is freed, nothing more."""
        local.activate_sent_at = None
        local.activation_refused = True
        if self.current.welcome is None:
            return  # between sessions: held, never launched; the next Welcome gives it back
        self.slots.release(local.attempt_id)
        self.current.policy.activation_refused(local)
        self.journal.clear(local.attempt_id)  # kept (hidden) while the give-back is owed
        self.pull()

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
        local.stop_phase = "term"
        self.bridge.call_at(f"stop:{local.attempt_id}", time.monotonic() + local.grace_ms / 1000,
                            self.me, StopCheck(local.attempt_id, "term"))

    def kill(self, local: Local) -> None:
        """The stop grace went by: KILL the job's group; the launcher outlives its job, stops what
        is left (TERM, the task's stop grace, KILL), drains and publishes, and is checked once more
        after that."""
        if self._signal(local, signal.SIGKILL) is not Liveness.RUNNING:
            return  # gone: its exit comes
        local.stop_phase = "kill"
        log.info("event=stop_kill attempt=%s", local.attempt_id)
        runtime = self.config.runtime
        wait_ms = runtime.kill_grace_ms + local.grace_ms + runtime.output_drain_ms
        self.bridge.call_at(f"stop:{local.attempt_id}", time.monotonic() + wait_ms / 1000,
                            self.me, StopCheck(local.attempt_id, "kill"))
