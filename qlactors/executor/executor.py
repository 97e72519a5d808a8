"""The Executor: pulls offers for free slots, journals, activates, spawns the launcher, stops by identity.

It talks to the control side only through wire messages (inproc on edge, tcp on a worker), and
keeps its own journal so that after a restart it can re-adopt launchers that are still running.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import time
from dataclasses import dataclass
from typing import Any

from ..clock import wall_ms
from ..domain.receipt import token_hash
from ..faults import crash_point, raise_point
from ..ids import new_id
from ..process.identity import Liveness, read_identity
from ..process.launch import job_environment, signal_job, spawn, uptime_ms
from ..runtime.actor import RuntimeActor
from ..runtime.signals import (Consume, DrainSession, HeartbeatDue, NoReceipt, OwedDue, RegisterDue,
                               SessionOpen, ShipLog, StopCheck)
from ..errors import StoreUnavailable
from ..wire import codec
from ..wire import messages as m
from ..wire.bridge import Inbound, ProcessExited
from ..wire.curve import REFUSED_KEY
from .adoption import Adoption, Rebinding
from .context import ExecutorContext
from .draining import Draining
from .journal.records import LeaseFacts
from .owed_reports import OwedReports, register_pacing, session_fence
from .session_reports import SessionReports

log = logging.getLogger("qlactors.executor")

CONSUME_RETRY_S = 0.1  # a ReceiptConsumer restart takes milliseconds


@dataclass
class Local:
    """One attempt this executor owns, from Offer until its launcher has exited."""

    run_id: str
    attempt_id: str
    offer: m.Offer | None = None  # None for an attempt re-adopted after a restart
    lease_token: str = ""
    token: str = ""
    identity: Any = None  # ProcessIdentity, or the store's Identity for a re-adopted attempt
    pidfd: int = -1
    stop_phase: str | None = None  # None, "term" or "kill": how far a stop has gone
    sent: str | None = None  # "term" or "kill": the last signal the job's group actually got
    grace_ms: int = 1000
    session_id: str = ""  # the session the lease was granted to (from Offers)
    session_generation: int = 0
    lease: LeaseFacts | None = None  # the lease held now (renewed by heartbeats, re-bound by Attest)
    deadline_ms: int | None = None  # a cluster worker's own deadline (its clock): activation + timeout
    activate_sent_at: float | None = None  # monotonic; set while its Activate waits for `Activated`
    activation_refused: bool = False  # its Activate was fenced or refused: never launched here
    activate_request_id: str = ""  # the Activate of this offer, the same on every copy


class Executor(OwedReports, SessionReports, Adoption, Draining, RuntimeActor):
    ctx: ExecutorContext
    name = "executor"
    uses_outbox = True

    def __init__(self, ctx: ExecutorContext) -> None:
        super().__init__(ctx)
        self.slots = ctx.config.runtime.slots
        # Edge: the local session's id. A cluster worker learns its id in Welcome (its key's).
        self.worker_id = ctx.session.worker_id if ctx.session is not None else ""
        self.labels = list(getattr(ctx, "labels", ()))
        self.session: m.Welcome | None = None
        self.heartbeat_seq = 0
        self.live: dict[str, Local] = {}
        # The Pull waiting for its answer: its id and its (offer id -> lease token) pairs.
        self.pending_pull: tuple[str, dict[str, str]] | None = None
        self.pull_message: m.Pull | None = None  # the waiting Pull as sent, to repeat it unchanged
        # Survivors attested `running`, their answers pending (executor_adopt.Rebinding).
        self.rebinding: dict[str, Rebinding] = {}
        self.unprobed: set[str] = set()  # journal rows whose /proc was unreadable: probed again
        self.drain_waits: set[str] = set()  # a SIGTERM drain's unanswered requests (executor_drain)
        self.pull_sent_at = 0.0  # monotonic
        # The pairs of the last answered Pulls (offer id -> lease token): an Offers answer that
        # comes again or late is declined at once with them, never left to expire.
        self.answered_pairs: dict[str, str] = {}
        self.owed_sent_at: dict[str, float] = {}  # executor_owed.py
        self.register_backoff, self.key_refused_log = register_pacing()  # executor_owed.py
        self.answered_at = time.monotonic()  # the last message from the control side (any replica)

    def handlers(self):
        return {
            m.Welcome: self.on_welcome, m.Nudge: self.on_nudge, m.Offers: self.on_offers,
            m.Activated: self.on_activated, m.Ack: self.on_ack, m.Attested: self.on_attested,
            m.HeartbeatAck: self.on_heartbeat_ack, m.StopRequested: self.on_stop_requested,
            ProcessExited: self.on_exited, StopCheck: self.on_stop_check, NoReceipt: self.on_no_receipt,
            Consume: self.on_consume, HeartbeatDue: self.on_heartbeat_due, DrainSession: self.on_drain_session,
            OwedDue: self.on_owed_due, RegisterDue: self.on_register_due,
        }

    def on_receive(self, message: Any) -> Any:
        # An answer (it names a request) shows a replica is reachable; a Nudge, a StopRequested or
        # the refusal of a frame it could not read does not (SEMANTICS.md §9 Exchange, §7 cut-off).
        if isinstance(message, Inbound) and getattr(message.message, "answer_to", ""):
            self.answered_at = time.monotonic()
        return super().on_receive(message)

    def started(self) -> None:
        """Register: the Register an earlier instance sent and got no answer to, again (the same
        register id gets the same session), when it still says what this one would (same boot,
        capacity and labels: a Register from before a reboot would hide the reboot); else anew.
        A Leave an earlier instance's drain left owed is moot: that drain is over, and sent now it
        would drain the session this start resumes."""
        for owed in self.ctx.journal.owed():
            if owed.kind == m.Leave.KIND:
                self.ctx.journal.settle(owed.request_id)
            if owed.kind != m.Register.KIND:
                continue
            earlier = codec.decode([codec.HEADER, owed.body])
            if (earlier.boot_id, earlier.capacity, earlier.labels) == (self.ctx.boot_id(), self.slots, self.labels):
                self.register_request = owed.request_id
                self.out.to_control(earlier)
                self._schedule_register()
                return
            self.ctx.journal.settle(owed.request_id)
        self._register(resume=True)

    def _register(self, *, resume: bool) -> None:
        """Open a session; on a worker restarted within its session lease, resume the saved one."""
        saved = self.ctx.journal.saved_session() if resume else None
        register_id = new_id()
        self._send_register(m.Register(
            request_id=register_id, register_id=register_id, worker_id=self.worker_id, capacity=self.slots, boot_id=self.ctx.boot_id(), labels=self.labels,
            protocol_min=codec.PROTOCOL_MIN, protocol_max=codec.PROTOCOL_MAX,
            worker_clock_ms=wall_ms(), resume_session_id=saved.session_id if saved else None,
            resume_generation=saved.generation if saved else None,
            resume_secret=saved.resume_secret if saved else None))

    def _close(self) -> None:
        for local in self.live.values():
            if local.pidfd >= 0:
                self.ctx.bridge.unwatch(local.pidfd)
                os.close(local.pidfd)
                local.pidfd = -1
        super()._close()

    # -- offers -------------------------------------------------------------------------------

    def on_welcome(self, msg: m.Welcome, _peer: bytes) -> None:
        if not self._welcomed(msg):
            return  # the answer to an earlier Register (a session since replaced), or a copy's
        welcomed_at = time.monotonic()
        self.session = msg
        self.worker_id = msg.worker_id
        if msg.session_lease_ms is not None:  # a cluster session: kept for a resume, heartbeats on
            self.ctx.journal.save_session(msg.worker_id, msg.session_id, msg.session_generation,
                                          msg.resume_secret, self.ctx.boot_id())
            self._schedule_heartbeat()
        self.ctx.directory.tell("receipts", SessionOpen(msg.worker_id, msg.session_id, msg.session_generation))
        self._decline_unknown(msg)
        self._reattest_held(msg)  # held attempts first: `_adopt` attests the rows it adopts
        self._adopt()
        self._resend_owed(welcomed_at)  # what was owed before: the old session's come back fenced, re-made
        self._pull()

    def on_nudge(self, _msg: m.Nudge, _peer: bytes) -> None:
        self._pull()

    def _cluster(self) -> bool:
        """A cluster worker's session (leases renewed by heartbeats), as opposed to edge's local one."""
        return self.session is not None and self.session.session_lease_ms is not None

    def _free(self) -> int:
        return self.slots - len(self.live)

    def _pull(self) -> None:
        """One Pull for every free slot: a pair (offer id, lease token) per slot."""
        if self.session is None or self.pending_pull is not None or self._free() <= 0:
            return
        if not self.ctx.admitting.is_set():
            return
        reserve = self.ctx.disk_reserve  # a worker's own disk (edge: the Gateway's check)
        if reserve is not None and not reserve.has_room():
            return  # the next heartbeat or nudge checks again
        pairs = {new_id(): secrets.token_urlsafe(32) for _ in range(self._free())}
        pull_id = new_id()
        if self._cluster():  # journalled before it is sent (SEMANTICS.md §9 Offers)
            self.ctx.journal.journal_pull(pull_id, list(pairs.items()))
        self.pending_pull = (pull_id, pairs)
        s = self.session
        self.pull_message = m.Pull(
            request_id=pull_id, worker_id=self.worker_id, session_id=s.session_id, session_generation=s.session_generation,
            pull_id=pull_id, offers=[m.OfferSlot(offer_id=o, lease_token=t) for o, t in pairs.items()])
        self.pull_sent_at = time.monotonic()
        self.out.to_control(self.pull_message)

    def on_offers(self, msg: m.Offers, _peer: bytes) -> None:
        if not self.pending_pull or self.pending_pull[0] != msg.pull_id or msg.answer_to != msg.pull_id:
            self._decline_unexpected(msg)
            return
        if self.drain_done is not None:  # SIGTERM since this Pull was sent: nothing is accepted
            self._decline_drained_offers(msg)
            return
        pairs = self.pending_pull[1]
        for offer in msg.offers:
            token = pairs.get(offer.offer_id)
            if token is None:
                log.error("event=offer_of_no_pair offer=%s attempt=%s", offer.offer_id, offer.attempt_id)
                continue
            held = self.live.get(offer.attempt_id)
            if held is not None and held.offer is not None and held.offer.offer_id == offer.offer_id:
                continue  # accepted before the database failed on a later offer: this is its retry
            self._accept(offer, token, msg)
        # Only once every offer is journalled: a handler that meets an unavailable database is
        # handled again (base.py), and its retry must still find this Pull waiting.
        if self._cluster():
            self.ctx.journal.clear_pull(msg.pull_id)
        self.answered_pairs = dict(list(self.answered_pairs.items())[-4 * self.slots:] + list(pairs.items()))
        self.pending_pull = self.pull_message = None
        if len(msg.offers) == len(pairs):
            self._pull()  # every slot asked for was filled: there may be more work
        # Fewer offers than pairs: nothing more to offer now; a Nudge brings the next pull.

    def _decline_unexpected(self, msg: m.Offers) -> None:
        """Offers for a Pull this executor no longer waits for (a copy's answer, a late one): any
        it does not hold is declined at once (SEMANTICS.md §9 Pull once), with the pair its Pull
        journalled; one whose pair is unknown here is left to expire (its token cannot be quoted).
        Edge (leases live with the process, nothing expires): given back, judged by its records."""
        for offer in msg.offers:
            held = self.live.get(offer.attempt_id)
            if held is not None and held.offer is not None and held.offer.offer_id == offer.offer_id:
                continue  # the same offer again: held
            if held is not None:
                continue  # another offer of an attempt held here: its own lease decides
            if not self._cluster():
                log.warning("event=offer_unexpected offer=%s attempt=%s action=give_back", offer.offer_id,
                            offer.attempt_id)
                self._give_back(offer.run_id, offer.attempt_id)
                continue
            token = self.answered_pairs.get(offer.offer_id)
            log.warning("event=offer_unexpected offer=%s attempt=%s action=%s", offer.offer_id, offer.attempt_id,
                        "decline" if token else "expire")
            if token is not None:
                self._decline(offer, token, msg.session_id, msg.session_generation, "not_waited_for")

    def _accept(self, offer: m.Offer, lease_token: str, batch: m.Offers) -> None:
        held = self.live.get(offer.attempt_id)
        if held is not None and held.identity is not None:  # launched here: never twice
            log.error("event=offer_of_a_launched_attempt attempt=%s", offer.attempt_id)
            return
        token = secrets.token_urlsafe(32)
        # Accept: journal first, then the log file, then ask for activation (SEMANTICS.md §4).
        # The same attempt offered again (its earlier lease released before activation) keeps
        # its journal row, with the new token hash, and its emptied log file.
        log_path = self.ctx.logs.path_for(offer.run_id, offer.attempt_id)
        receipt_path = self.ctx.receipts.final_path(offer.attempt_id)
        lease = LeaseFacts(offer.offer_id, offer.lease_generation, lease_token, batch.session_id,
                           batch.session_generation)  # quoted in an Attest after a restart
        if not self.ctx.journal.accept(offer.attempt_id, offer.run_id, str(log_path), str(receipt_path),
                                       token_hash(token), lease):
            log.error("event=offer_of_a_launched_attempt attempt=%s journal=launched", offer.attempt_id)
            return
        local = Local(run_id=offer.run_id, attempt_id=offer.attempt_id, offer=offer,
                      lease_token=lease_token, token=token, grace_ms=offer.stop_grace_ms,
                      session_id=batch.session_id, session_generation=batch.session_generation, lease=lease)
        self.live[offer.attempt_id] = local
        raise_point("executor_after_accept")
        self.ctx.logs.create(offer.run_id, offer.attempt_id)
        self._send_activate(local)

    def _send_activate(self, local: Local) -> None:
        """Ask for activation (sent again each heartbeat interval until answered: executor_session)."""
        local.activate_sent_at = time.monotonic()
        if not local.activate_request_id:
            local.activate_request_id = new_id()
        self.out.to_control(m.Activate(**self._fence(local), request_id=local.activate_request_id, callback_token_hash=token_hash(local.token),
                                       log_artifact_id=self.ctx.logs.artifact_id(local.run_id, local.attempt_id)))

    def _fence(self, local: Local, lease_version: int | None = None) -> dict[str, Any]:
        o = local.offer
        return dict(worker_id=self.worker_id, session_id=local.session_id,
                    session_generation=local.session_generation,
                    run_id=o.run_id, attempt_id=o.attempt_id, offer_id=o.offer_id,
                    lease_generation=o.lease_generation, lease_token=local.lease_token,
                    lease_version=o.lease_version if lease_version is None else lease_version)

    # -- launch -------------------------------------------------------------------------------

    def on_activated(self, msg: m.Activated, _peer: bytes) -> None:
        local = self.live.get(msg.attempt_id)
        if local is None or local.offer is None or local.identity is not None:
            return  # not ours (an instance that died asked for it), or already launched
        if local.offer.offer_id != msg.offer_id or msg.answer_to != local.activate_request_id:
            return  # the answer to an earlier offer of the same attempt
        if local.activation_refused:
            return  # a late answer to an earlier copy: refused since, given back (never launched)
        local.activate_sent_at = None  # answered
        if self.drain_done is not None:
            return  # draining: never launched, its Decline is answered `refused` and it is given back
        offer = local.offer
        if self._cluster():  # "finished in time" is judged on this worker's own clock (§5)
            started = wall_ms()
            local.deadline_ms = None if offer.timeout_ms is None else started + offer.timeout_ms
            self.ctx.journal.activated(offer.attempt_id, started, local.deadline_ms)
        # The offer names the cap; this executor's own setting bounds it (a worker's config).
        log_cap = min(offer.log_cap_bytes, self.ctx.config.runtime.log_cap_bytes)
        self.ctx.journal.set_state(offer.attempt_id, "launching")
        boot_id = self.ctx.boot_id()
        env = job_environment(os.environ, offer.env)
        receipts = self.ctx.receipts
        env.update({
            "QLACTORS_RUN_ID": offer.run_id, "QLACTORS_ATTEMPT_ID": offer.attempt_id,
            "QLACTORS_RECEIPT_DIR": str(receipts.shard_dir(offer.attempt_id)),
            "QLACTORS_MARKER": str(receipts.marker_path(offer.attempt_id)),
            "QLACTORS_LOG": str(self.ctx.logs.path_for(offer.run_id, offer.attempt_id)),
            "QLACTORS_LOG_CAP": str(log_cap),
            "QLACTORS_DROPPED": str(self.ctx.local_receipts.dropped_path(offer.attempt_id)),
            "QLACTORS_CLOCK_BASE_MS": str(wall_ms() - uptime_ms()),
            "QLACTORS_STOP_GRACE_MS": str(offer.stop_grace_ms),
            "QLACTORS_DRAIN_MS": str(self.ctx.config.runtime.output_drain_ms),
        })
        if offer.keep_leftovers:
            env["QLACTORS_KEEP_LEFTOVERS"] = "1"
        if offer.cwd:
            # Checked by `task add` when it could be; a directory gone since then is a start
            # failure, not a job that "exited 126" (the launcher's own check stays, for a race).
            if not os.path.isdir(offer.cwd):
                log.error("event=start_failed run=%s attempt=%s reason=cwd_not_a_directory",
                          offer.run_id, offer.attempt_id)
                self._start_failed(local, msg, f"working directory {offer.cwd} is not a directory "
                                               f"(or is gone)")
                return
            env["QLACTORS_CWD"] = offer.cwd
        # The log-cap FIFO is made here, not by the launcher (mkdir + mkfifo + rm would cost it
        # three execs). Without one the launcher runs the job uncapped rather than not at all.
        fifo = self.ctx.local_receipts.make_fifo(offer.attempt_id) if log_cap > 0 else None
        if fifo is not None:
            env["QLACTORS_FIFO"] = str(fifo)
        try:
            pid = spawn(list(offer.argv), env, token=local.token, shell=self.ctx.launcher_shell)
        except OSError as err:
            log.error("event=spawn_failed run=%s attempt=%s error=%s", offer.run_id, offer.attempt_id, err)
            self.ctx.local_receipts.remove_fifo(offer.attempt_id)
            self._start_failed(local, msg, f"spawn failed: {err.strerror or err}")
            return
        crash_point("after_spawn")
        # Identity before anything can reap it (we are the only reaper, and only of our own pids).
        local.identity = read_identity(pid, boot_id=boot_id)
        local.pidfd = os.pidfd_open(pid)
        try:
            self.ctx.journal.set_state(offer.attempt_id, "started", identity=local.identity)
        except StoreUnavailable as err:  # the launcher runs: go on; its start marker and the
            # Started report carry the identity, and recovery and adoption fall back to the marker
            log.warning("event=journal_identity_unwritten attempt=%s error=%s", offer.attempt_id, err)
        self.ctx.bridge.watch(local.pidfd, offer.attempt_id, self.me)
        if self._cluster():
            self.ctx.directory.tell("logs", ShipLog(
                offer.run_id, offer.attempt_id, token_hash(local.token),
                str(self.ctx.logs.path_for(offer.run_id, offer.attempt_id)), worker_id=self.worker_id))
        i = local.identity
        self._owe(m.Started(**self._fence(local, msg.lease_version), request_id=new_id(), boot_id=i.boot_id,
                            pid=i.pid, pgid=i.pgid, start_ticks=i.start_ticks), offer.attempt_id)
        log.info("event=launched run=%s attempt=%s pid=%d", offer.run_id, offer.attempt_id, pid)

    def _start_failed(self, local: Local, activated: m.Activated, reason: str) -> None:
        """Nothing was spawned: report the start failure (owed: the row stays until it is answered),
        give the slot back."""
        self._owe(m.StartFailed(**self._fence(local, activated.lease_version), request_id=new_id(), reason=reason),
                  local.attempt_id)
        self.ctx.journal.clear(local.attempt_id)
        del self.live[local.attempt_id]
        self._pull()

    def on_ack(self, msg: m.Ack, _peer: bytes) -> None:
        """An Ack acts only as the first answer to the request it names (SEMANTICS.md §9 Exchange):
        an owed report still owed, or the Activate of the offer held now, not yet launched. Any
        other Ack (a copy's second answer, a late one about an older lease) is logged, ignored."""
        if msg.of == "unknown":  # the refusal of a frame the control side could not read
            if msg.detail == REFUSED_KEY:
                self._key_refused(msg.detail)
            else:
                log.warning("event=frame_refused_by_control detail=%s", msg.detail)
            return
        if msg.of == "register":
            if msg.answer_to == self.register_request:
                self._register_refused(msg)
            return
        if msg.of == "activate":
            self._activate_answered(msg)
            return
        report = self._owed_answered(msg.answer_to)
        if report is None:
            if msg.result not in ("applied", "already_terminal"):
                log.info("event=answer_ignored of=%s attempt=%s result=%s detail=%s (not the answer waited for)",
                         msg.of, msg.attempt_id, msg.result, msg.detail)
            return
        if self._drain_ack(msg, report):
            return
        if msg.result == "fenced" and session_fence(msg.detail):
            self._fenced_by_session(report, msg)
            return
        self._settle(report)
        if msg.result in ("applied", "already_terminal"):
            return
        log.warning("event=report_%s of=%s attempt=%s detail=%s", msg.result, msg.of, msg.attempt_id, msg.detail)
        local = self.live.get(msg.attempt_id)
        if msg.of == "started" and local is not None and local.identity is not None \
                and self._holds_lease_of(local, report) and local.stop_phase is None:
            # The start was not accepted under the lease it ran under, and it is still that lease
            # here: stop the process by its exact identity. (About an older lease: nothing.)
            self._begin_stop(local, "refused")

    def _holds_lease_of(self, local: Local, report: Any) -> bool:
        """Whether `local` still holds the lease the owed report was about (offer id, generation)."""
        sent = codec.decode([codec.HEADER, report.body])
        lease = local.lease
        return lease is not None and (lease.offer_id, lease.lease_generation) == (sent.offer_id,
                                                                                  sent.lease_generation)

    def _activate_answered(self, msg: m.Ack) -> None:
        local = self.live.get(msg.attempt_id)
        if msg.result in ("applied", "already_terminal"):
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
        self._activation_refused(local, msg)

    def _activation_refused(self, local: Local, msg: m.Ack) -> None:
        """Never launch it; and since an earlier copy of this Activate (the link re-sends what a
        replica left unanswered) may have been committed, leave the evidence that nothing ran:
        `never_launched`, which recovery trusts, not silence (a `starting` attempt nobody
        attests waits for ever). The give-back is owed: if the session it is sent from has
        ended, it is re-made from the next one. Edge: the slot is freed, nothing more."""
        local.activate_sent_at = None
        local.activation_refused = True
        if self.session is None:
            return  # between sessions: held, never launched; the next Welcome gives it back
        cluster = self._cluster()  # edge's Activate goes to the Gateway in-process: no copies
        del self.live[local.attempt_id]
        if cluster:
            self._give_back(local.run_id, local.attempt_id, local.lease)
        self.ctx.journal.clear(local.attempt_id)  # kept (hidden) while the give-back is owed
        self._pull()

    # -- stop ---------------------------------------------------------------------------------

    def on_stop_requested(self, msg: m.StopRequested, _peer: bytes) -> None:
        local = self.live.get(msg.attempt_id)
        if local is None or local.identity is None or local.stop_phase is not None:
            return
        local.grace_ms = msg.grace_ms
        self._begin_stop(local, msg.reason)

    def _signal(self, local: Local, sig: signal.Signals) -> Liveness:
        """Signal the job's process group by exact identity (launch.signal_job); note what it got."""
        marker = self.ctx.receipts.marker_path(local.attempt_id)
        liveness = signal_job(local.identity, marker, sig, current_boot_id=self.ctx.boot_id())
        if liveness is Liveness.RUNNING:
            local.sent = "kill" if sig == signal.SIGKILL else "term"
        return liveness

    def _begin_stop(self, local: Local, reason: str) -> None:
        liveness = self._signal(local, signal.SIGTERM)
        log.info("event=stop_term attempt=%s reason=%s liveness=%s", local.attempt_id, reason, liveness.name)
        local.stop_phase = "term"
        self.ctx.bridge.call_at(f"stop:{local.attempt_id}", time.monotonic() + local.grace_ms / 1000,
                                self.me, StopCheck(local.attempt_id, "term"))

    def on_stop_check(self, msg: StopCheck, _peer: bytes) -> None:
        local = self.live.get(msg.attempt_id)
        if local is None or local.identity is None:
            return
        if msg.phase == "term":
            liveness = self._signal(local, signal.SIGKILL)
            if liveness is Liveness.RUNNING:
                local.stop_phase = "kill"
                log.info("event=stop_kill attempt=%s", local.attempt_id)
                # The launcher outlives its job: it stops what is left (TERM, the task's stop
                # grace, KILL), drains, and publishes.
                runtime = self.ctx.config.runtime
                wait_ms = runtime.kill_grace_ms + local.grace_ms + runtime.output_drain_ms
                self.ctx.bridge.call_at(f"stop:{local.attempt_id}", time.monotonic() + wait_ms / 1000,
                                        self.me, StopCheck(local.attempt_id, "kill"))
        else:
            log.error("event=stop_inconclusive attempt=%s", local.attempt_id)

    # -- end ----------------------------------------------------------------------------------

    def on_exited(self, msg: ProcessExited, _peer: bytes) -> None:
        local = self.live.pop(msg.key, None)
        if local is None:
            return
        self.ctx.bridge.cancel_timer(f"stop:{local.attempt_id}")
        try:  # reap only our own launcher (a re-adopted one may still be our child), never waitpid(-1)
            os.waitpid(local.identity.pid, os.WNOHANG)
        except ChildProcessError:
            pass
        if local.pidfd >= 0:
            os.close(local.pidfd)
            local.pidfd = -1
        self.ctx.local_receipts.remove_fifo(local.attempt_id)
        stopped_by = local.sent or "exit"  # "term" or "kill" when the job's group got our signal
        self.on_consume(Consume(local.run_id, local.attempt_id, stopped_by=stopped_by), b"")
        # No pull here: the attempt holds its slot in the database until its end is committed,
        # and the Supervisor nudges us then (a pull now would only be answered Idle).

    def on_consume(self, msg: Consume, _peer: bytes) -> None:
        """Hand an ended launcher to the ReceiptConsumer; while it is being restarted (no live
        instance) again a moment later: never dropped, this executor has forgotten the attempt."""
        if not self.ctx.directory.tell("receipts", msg):
            log.warning("event=consume_deferred attempt=%s in_s=%.2f", msg.attempt_id, CONSUME_RETRY_S)
            self.ctx.bridge.call_at(f"consume:{msg.attempt_id}", time.monotonic() + CONSUME_RETRY_S,
                                    self.me, msg)

    def on_no_receipt(self, msg: NoReceipt, _peer: bytes) -> None:
        self._attest_not_running(msg.run_id, msg.attempt_id, msg.stopped_by)

    def _attest_not_running(self, run_id: str, attempt_id: str, stopped_by: str | None) -> None:
        """Conclusive evidence for recovery: this executor runs no process for the attempt
        (`stopped_by` how it ended, None when it was never launched here)."""
        fact = "never_launched" if stopped_by is None else ("ended" if stopped_by == "exit" else "stopped")
        self._attest(run_id, attempt_id, fact, stopped_by)
