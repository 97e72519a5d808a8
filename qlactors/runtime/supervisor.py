"""Shared: the Supervisor: starts nothing itself but restarts failed actors (or stops the runtime), and
owns the one cadence timer. Executors talk to the Gateway (control/gateway.py), not to it."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Callable

import pykka

from ..clock import wall_ms
from .actor import RuntimeActor
from .context import SharedContext
from .signals import ActorFailed, CycleDone, Drain, Tick, ToWorkers, WakeAt

log = logging.getLogger("qlactors.supervisor")

MAX_RESTARTS = 3  # within RESTART_WINDOW_S; one more failure stops the runtime
RESTART_WINDOW_S = 60.0


class Supervisor(RuntimeActor):
    ctx: SharedContext
    name = "supervisor"

    def __init__(self, ctx: SharedContext, factories: dict[str, Callable[[], pykka.ActorRef]]) -> None:
        super().__init__(ctx)
        self.factories = factories
        self.restarts: dict[str, deque] = {}
        self.tick_s = ctx.config.runtime.cadence_tick_ms / 1000
        self.idle_tick_s = max(self.tick_s, ctx.config.runtime.idle_tick_ms / 1000)

    def handlers(self):
        return {
            Tick: self.on_tick, WakeAt: self.on_wake_at, CycleDone: self.on_cycle_done,
            ActorFailed: self.on_actor_failed, Drain: self.on_drain, str: self.on_nudge,
        }

    def on_failure(self, exception_type, exception_value, traceback) -> None:
        self._close()
        self.ctx.fatal.trip(f"the supervisor failed: {exception_value!r}")

    # -- cadence ------------------------------------------------------------------------------

    def on_nudge(self, _msg: str, _peer: bytes) -> None:
        self.ctx.directory.tell("scheduler", Tick("nudge"))

    def on_tick(self, msg: Tick, _peer: bytes) -> None:
        self.ctx.directory.tell("scheduler", msg)

    def on_cycle_done(self, msg: CycleDone, _peer: bytes) -> None:
        if msg.stops or msg.work_waiting:
            self.ctx.directory.tell("gateway", ToWorkers(stops=msg.stops, nudge=msg.work_waiting))
        for hook in self.ctx.each_cycle:  # a replica: its allow-list and its row in `status`
            try:
                hook()
            except Exception as err:  # a database outage: the next cycle tries again
                log.warning("event=cycle_hook_failed hook=%s error=%r", getattr(hook, "__name__", hook), err)
        self._wake_at(msg.next_due_ms, reset=True, idle=msg.idle)

    def on_wake_at(self, msg: WakeAt, _peer: bytes) -> None:
        self._wake_at(msg.due_ms)

    def _wake_at(self, due_ms: int | None, *, reset: bool = False, idle: bool = False) -> None:
        """Schedule the next cycle at the tick, or sooner when a deadline or retry falls due.

        `reset` replaces the pending wake-up (after a cycle); otherwise it may only move earlier.
        After a cycle that found the runtime idle the longer idle tick applies: every change of
        intent nudges, every due time is scheduled, so an idle cycle only re-checks the quiet.
        """
        delay = self.idle_tick_s if idle else self.tick_s
        if due_ms is not None:
            delay = min(delay, max(0.0, (due_ms - wall_ms()) / 1000) + 0.005)
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
        counted = not (msg.step_timeout and self.ctx.health.outage() is not None)
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
