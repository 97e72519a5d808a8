"""The Supervisor: the control side's face to executors, the cadence timer, and the restarter of failed actors."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Callable

import pykka

from ..domain.receipt import Receipt, ReceiptError, token_hash
from ..faults import crash_point
from ..home import clear_disk_hold, write_disk_hold
from ..ids import new_id
from ..wire import codec
from ..wire import messages as m
from ..wire.bridge import Inbound
from ..wire.offers import BATCH_BUDGET_BYTES, check_offer, offers_message
from .base import RuntimeActor, now_ms
from .signals import ActorFailed, AttemptEnded, CycleDone, Drain, Redeliver, Tick

log = logging.getLogger("qlactors.supervisor")

MAX_RESTARTS = 3  # within RESTART_WINDOW_S; one more failure stops the runtime
RESTART_WINDOW_S = 60.0


def fence_of(report: Any):
    """The store's Fence for a fenced wire report (only the lease token's hash is compared)."""
    from ..store.records import Fence

    return Fence(worker_id=report.worker_id, session_id=report.session_id,
                 session_generation=report.session_generation, run_id=report.run_id,
                 attempt_id=report.attempt_id, offer_id=report.offer_id,
                 lease_generation=report.lease_generation,
                 lease_token_hash=token_hash(report.lease_token), lease_version=report.lease_version)


class Supervisor(RuntimeActor):
    name = "supervisor"
    uses_outbox = True

    def __init__(self, ctx: Any, factories: dict[str, Callable[[], pykka.ActorRef]]) -> None:
        super().__init__(ctx)
        self.factories = factories
        self.peers: dict[str, bytes] = {}
        self.restarts: dict[str, deque] = {}
        self.tick_s = ctx.config.runtime.cadence_tick_ms / 1000
        self.idle_tick_s = max(self.tick_s, ctx.config.runtime.idle_tick_ms / 1000)
        self.disk_held_since_ms: int | None = None  # set while the disk reserve holds attempts back

    def handlers(self):
        return {
            m.Register: self.on_register, m.Heartbeat: self.on_heartbeat, m.Pull: self.on_pull,
            m.Activate: self.on_activate, m.Started: self.on_started, m.StartFailed: self.on_start_failed,
            m.Decline: self.on_decline, m.Completed: self.on_completed, m.Attest: self.on_attest,
            m.LogChunk: self.on_log_chunk,
            Tick: self.on_tick, CycleDone: self.on_cycle_done, ActorFailed: self.on_actor_failed,
            Drain: self.on_drain, str: self.on_nudge,
        }

    def started(self) -> None:
        # A hold published by a runtime that died is not this one's.
        self._publish_hold(lambda: clear_disk_hold(self.ctx.config.home))

    def on_failure(self, exception_type, exception_value, traceback) -> None:
        self._close()
        self.ctx.fatal.trip(f"the supervisor failed: {exception_value!r}")

    def on_receive(self, message: Any) -> Any:
        # A well-formed frame whose values the store or domain refuses (an id too long, pid 0, a
        # negative count) is the peer's fault: answer `refused`, never let it stop the runtime.
        try:
            return super().on_receive(message)
        except ValueError as err:  # BadInput, and the domain's value errors (a non-ASCII token...)
            if isinstance(message, Redeliver):  # a report handled again after a database outage
                message = message.message
            if not isinstance(message, Inbound):
                raise
            report = message.message
            log.warning("event=report_refused kind=%s error=%s", report.KIND, err)
            self._ack(message.peer, report.KIND, report, "refused", str(err))
            return None

    # -- executor reports ---------------------------------------------------------------------

    def _ack(self, peer: bytes, of: str, msg: Any, result: str, detail: str = "") -> None:
        self.out.to_peer(peer, m.Ack(of=of, run_id=getattr(msg, "run_id", ""),
                                     attempt_id=getattr(msg, "attempt_id", ""),
                                     offer_id=getattr(msg, "offer_id", ""), result=result,
                                     detail=(detail or "")[:500]))

    def on_register(self, msg: m.Register, peer: bytes) -> None:
        # Edge: the one local session of this process, registered at startup; its leases live
        # as long as the process, so there is nothing to resume and no lease to renew.
        session = self.ctx.session
        if msg.worker_id != session.worker_id:
            self._ack(peer, "register", msg, "refused", f"unknown worker {msg.worker_id!r}")
            return
        if not msg.protocol_min <= codec.VERSION <= msg.protocol_max:
            self._ack(peer, "register", msg, "refused", f"protocol {msg.protocol_min}..{msg.protocol_max} "
                                                          f"does not include {codec.VERSION}")
            return
        self.peers[msg.worker_id] = peer
        self.out.to_peer(peer, m.Welcome(
            worker_id=session.worker_id, session_id=session.session_id,
            session_generation=session.generation, resumed=False, resume_secret=new_id(),
            protocol=codec.VERSION, heartbeat_ms=self.ctx.config.runtime.cadence_tick_ms,
            session_lease_ms=None, run_lease_ms=None, unactivated=[]))

    def on_heartbeat(self, msg: m.Heartbeat, peer: bytes) -> None:
        ended = not self._current_session(msg)
        if not ended:
            self.peers[msg.worker_id] = peer
        self.out.to_peer(peer, m.HeartbeatAck(
            seq=msg.seq, session_ended=ended, session_expires_at_ms=None,
            renewed=[m.Renewed(attempt_id=r.attempt_id, lease_generation=r.lease_generation,
                               lease_version=0, expires_at_ms=None) for r in msg.renewals] if not ended else [],
            fenced=[], detail="stale session" if ended else ""))

    def _current_session(self, msg: Any) -> bool:
        s = self.ctx.session
        return (msg.worker_id, msg.session_id, msg.session_generation) == (
            s.worker_id, s.session_id, s.generation)

    def on_pull(self, msg: m.Pull, peer: bytes) -> None:
        from ..store.records import Fenced

        views = []
        # Nothing is offered before startup recovery is done, during shutdown, beyond the pairs
        # the executor sent, or while the logs' file system is below the reserve.
        if self.ctx.admitting.is_set() and msg.offers and self._disk_has_room():
            try:
                views = self.ctx.dispatch.offer_batch(
                    msg.worker_id, msg.session_id, msg.session_generation,
                    [(slot.offer_id, token_hash(slot.lease_token)) for slot in msg.offers],
                    log_cap_bytes=self.ctx.config.runtime.log_cap_bytes,
                    check=check_offer,  # an offer the wire cannot carry ends OFFER_UNENCODABLE
                    size=check_offer, budget_bytes=BATCH_BUDGET_BYTES)
            except Fenced as err:
                self._ack(peer, "pull", msg, "fenced", str(err))
                return
        self.out.to_peer(peer, offers_message(self.ctx.session, msg.pull_id, views))

    def _disk_has_room(self) -> bool:
        """The disk reserve: below it no attempt starts and queued runs wait (logged once per hold).

        No timer watches the disk: while runs wait, every cycle nudges the executors, whose next
        pull checks again, so queued runs start within a tick of space coming back.
        """
        reserve = self.ctx.config.runtime.disk_reserve_bytes
        if reserve <= 0 or self.ctx.free_bytes is None:
            return True
        try:
            free = self.ctx.free_bytes()
        except OSError as err:  # cannot tell: do not stop work on a guess, the log create will say
            log.warning("event=disk_free_unknown path=%s error=%s", self.ctx.config.logs_dir, err)
            return True
        home = self.ctx.config.home
        if free < reserve:
            if self.disk_held_since_ms is None:
                self.disk_held_since_ms = now_ms()
                log.warning("event=disk_reserve_hold free=%d reserve=%d path=%s", free, reserve,
                            self.ctx.config.logs_dir)
                self._publish_hold(lambda: write_disk_hold(
                    home, free_bytes=free, reserve_bytes=reserve, path=str(self.ctx.config.logs_dir),
                    since_ms=self.disk_held_since_ms))
            return False
        if self.disk_held_since_ms is not None:
            held_s = (now_ms() - self.disk_held_since_ms) / 1000
            self.disk_held_since_ms = None
            self._publish_hold(lambda: clear_disk_hold(home))
            log.info("event=disk_reserve_released free=%d reserve=%d held_s=%.1f", free, reserve, held_s)
        return True

    @staticmethod
    def _publish_hold(write: Callable[[], None]) -> None:
        # A nearly full disk may refuse even this small file: `status` then misses the reason,
        # the hold itself (and its log line) stands.
        try:
            write()
        except OSError as err:
            log.warning("event=disk_hold_status_unwritten error=%s", err)

    def on_activate(self, msg: m.Activate, peer: bytes) -> None:
        result = self.ctx.dispatch.activate(fence_of(msg), msg.callback_token_hash, msg.log_artifact_id)
        if result.result == "applied":
            self.out.to_peer(peer, m.Activated(run_id=msg.run_id, attempt_id=msg.attempt_id,
                                               offer_id=msg.offer_id, lease_version=result.lease_version,
                                               deadline_at_ms=result.deadline_at_ms))
            if result.deadline_at_ms is not None:
                self._wake_at(result.deadline_at_ms)
        else:
            self._ack(peer, "activate", msg, result.result, result.detail)

    def on_started(self, msg: m.Started, peer: bytes) -> None:
        outcome = self.ctx.dispatch.started(fence_of(msg), msg.boot_id, msg.pid, msg.pgid, msg.start_ticks)
        self._ack(peer, "started", msg, outcome.result, outcome.detail)

    def on_start_failed(self, msg: m.StartFailed, peer: bytes) -> None:
        outcome = self.ctx.dispatch.start_failed(fence_of(msg), msg.reason)
        self._ack(peer, "start_failed", msg, outcome.result, outcome.detail)

    def on_decline(self, msg: m.Decline, peer: bytes) -> None:
        outcome = self.ctx.dispatch.decline(fence_of(msg))
        self._ack(peer, "decline", msg, outcome.result, outcome.detail)
        if outcome.result == "applied":
            self.ctx.directory.tell("scheduler", Tick("decline"))  # offered again at once

    def on_log_chunk(self, msg: m.LogChunk, peer: bytes) -> None:
        # Edge keeps the log in a local file the commands read; no chunk is ever shipped.
        self.out.to_peer(peer, m.LogAck(attempt_id=msg.attempt_id, result="refused", acked_offset=0,
                                        detail="edge keeps logs in local files"))

    def on_completed(self, msg: m.Completed, peer: bytes) -> None:
        try:
            receipt = Receipt(schema_version=msg.schema_version, run_id=msg.run_id, attempt_id=msg.attempt_id,
                              callback_sequence=msg.callback_sequence, token=msg.token,
                              started_at_ms=msg.started_at_ms, finished_at_ms=msg.finished_at_ms,
                              exit_code=msg.exit_code, output_open=msg.output_open)
        except ReceiptError as err:
            self._ack(peer, "completed", msg, "refused", f"invalid receipt: {err.reason}")
            return
        crash_point("before_completion_commit")
        outcome = self.ctx.completion.complete(msg.run_id, msg.attempt_id, receipt, msg.log_dropped_bytes,
                                               msg.stopped_by)
        self._ack(peer, "completed", msg, outcome.result, outcome.reason or "")
        if outcome.result in ("applied", "already_terminal") and self.ctx.admitting.is_set():
            self.out.to_peer(peer, m.Nudge())  # its slot is free in the database now: pull again

    def on_attest(self, msg: m.Attest, peer: bytes) -> None:
        # Edge: the executor shares this process, and recovery judges by its own records and the
        # process identity (SEMANTICS.md §6); an attestation only tells it where to look now.
        result = "fenced" if not self._current_session(msg) else "applied"
        if result == "applied" and msg.fact not in ("running", "launch_unknown"):
            self.ctx.directory.tell("recovery", AttemptEnded(msg.run_id, msg.attempt_id))
            self.ctx.directory.tell("scheduler", Tick("attest"))
        self.out.to_peer(peer, m.Attested(
            run_id=msg.run_id, attempt_id=msg.attempt_id, fact=msg.fact, result=result, offer_id=None,
            lease_generation=None, lease_version=None, lease_expires_at_ms=None,
            detail="stale session" if result == "fenced" else ""))

    # -- cadence ------------------------------------------------------------------------------

    def on_nudge(self, _msg: str, _peer: bytes) -> None:
        self.ctx.directory.tell("scheduler", Tick("nudge"))

    def on_tick(self, msg: Tick, _peer: bytes) -> None:
        self.ctx.directory.tell("scheduler", msg)

    def on_cycle_done(self, msg: CycleDone, _peer: bytes) -> None:
        for order in msg.stops:
            peer = self.peers.get(self.ctx.session.worker_id)
            if peer is not None:
                self.out.to_peer(peer, m.StopRequested(run_id=order.run_id, attempt_id=order.attempt_id,
                                                       reason=order.reason, grace_ms=order.grace_ms))
        if msg.work_waiting and self.ctx.admitting.is_set():
            for peer in self.peers.values():
                self.out.to_peer(peer, m.Nudge())
        self._wake_at(msg.next_due_ms, reset=True, idle=msg.idle)

    def _wake_at(self, due_ms: int | None, *, reset: bool = False, idle: bool = False) -> None:
        """Schedule the next cycle at the tick, or sooner when a deadline or retry falls due.

        `reset` replaces the pending wake-up (after a cycle); otherwise it may only move earlier.
        After a cycle that found the runtime idle the longer idle tick applies: every change of
        intent nudges, every due time is scheduled, so an idle cycle only re-checks the quiet.
        """
        delay = self.idle_tick_s if idle else self.tick_s
        if due_ms is not None:
            delay = min(delay, max(0.0, due_ms / 1000 - time.time()) + 0.005)
        when = time.monotonic() + delay
        current = self.ctx.bridge.timer_due("cadence")
        if reset or current is None or when < current:
            self.ctx.bridge.call_at("cadence", when, self.me, Tick("cadence"))

    # -- lifecycle ----------------------------------------------------------------------------

    def on_drain(self, msg: Drain, _peer: bytes) -> None:
        self.ctx.admitting.clear()

    def on_actor_failed(self, msg: ActorFailed, _peer: bytes) -> None:
        history = self.restarts.setdefault(msg.name, deque())
        now = time.monotonic()
        while history and now - history[0] > RESTART_WINDOW_S:
            history.popleft()
        # A step that stays silent while the database is failing is waiting for it, not broken:
        # that restart is not counted (a persistent outage stops the runtime by its own limit).
        counted = not (msg.step_timeout and self.ctx.repo.store.health.outage() is not None)
        if msg.name not in self.factories or (counted and len(history) >= MAX_RESTARTS):
            self.ctx.fatal.trip(f"actor {msg.name} failed {len(history) + 1} times, last: {msg.error}")
            return
        if counted:
            history.append(now)
        old = self.ctx.directory.get(msg.name)
        if old is not None and old.is_alive():
            old.stop(block=False)
        self.ctx.directory.set(msg.name, self.factories[msg.name]())
        log.warning("event=actor_restarted actor=%s error=%s counted=%s", msg.name, msg.error, counted)
