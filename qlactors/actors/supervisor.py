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
from ..wire import messages as m
from ..wire.bridge import Inbound
from ..wire.offers import check_offer, offer_message
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
            m.Renew: self.on_renew, m.Completed: self.on_completed, m.Attest: self.on_attest,
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
                                     attempt_id=getattr(msg, "attempt_id", ""), result=result,
                                     detail=(detail or "")[:500]))

    def on_register(self, msg: m.Register, peer: bytes) -> None:
        session = self.ctx.session
        if msg.worker_id != session.worker_id:
            self._ack(peer, "register", msg, "refused", f"unknown worker {msg.worker_id!r}")
            return
        self.peers[msg.worker_id] = peer
        self.out.to_peer(peer, m.Welcome(worker_id=session.worker_id, session_id=session.session_id,
                                         session_generation=session.generation))

    def on_heartbeat(self, msg: m.Heartbeat, peer: bytes) -> None:
        if not self._current_session(msg):
            self._ack(peer, "heartbeat", msg, "fenced", "stale session")
            return
        self.peers[msg.worker_id] = peer

    def _current_session(self, msg: Any) -> bool:
        s = self.ctx.session
        return (msg.worker_id, msg.session_id, msg.session_generation) == (
            s.worker_id, s.session_id, s.generation)

    def on_pull(self, msg: m.Pull, peer: bytes) -> None:
        from ..store.records import Fenced

        offer = None
        # Nothing is offered before startup recovery is done, during shutdown, beyond the free
        # slots the executor says it has, or while the logs' file system is below the reserve.
        if self.ctx.admitting.is_set() and msg.free_slots > 0 and self._disk_has_room():
            try:
                offer = self.ctx.dispatch.offer(
                    msg.worker_id, msg.session_id, msg.session_generation, msg.offer_id,
                    token_hash(msg.lease_token), log_cap_bytes=self.ctx.config.runtime.log_cap_bytes,
                    check=check_offer)  # an offer the wire cannot carry ends OFFER_UNENCODABLE
            except Fenced as err:
                self._ack(peer, "pull", msg, "fenced", str(err))
                return
        if offer is None:
            self.out.to_peer(peer, m.Idle(offer_id=msg.offer_id))
            return
        self.out.to_peer(peer, offer_message(offer))

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

    def on_renew(self, msg: m.Renew, peer: bytes) -> None:
        # Edge leases live as long as the runtime process: nothing to renew (SEMANTICS.md §1).
        self._ack(peer, "renew", msg, "applied", "edge leases do not expire")

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
        if not self._current_session(msg):
            self._ack(peer, "attest", msg, "fenced", "stale session")
            return
        if not msg.running and msg.conclusive:
            # Evidence for recovery, which judges it on its next page (now: a cycle is asked for).
            self.ctx.directory.tell("recovery", AttemptEnded(msg.run_id, msg.attempt_id))
            self.ctx.directory.tell("scheduler", Tick("attest"))
        self._ack(peer, "attest", msg, "applied")

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
