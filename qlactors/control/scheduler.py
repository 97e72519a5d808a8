"""Control side: the Scheduler, one non-overlapping cycle per cadence tick, steps in a fixed order,
each with a deadline.

Order (SEMANTICS.md §10): 1. recovery page, 2. retry page, 3. cron admission (one page of due
schedules, run by the Scheduler itself), 4. workflow frontier (later), 5. timeouts and stop
orders, then admission (executors are nudged when queued work waits). A step that fails or stays
silent past its deadline ends the cycle: nothing is dispatched while authority is unknown. A tick
during a cycle is coalesced; a full cron page, or a step that says its page was full, asks
for one more cycle at once.
"""

from __future__ import annotations

import logging
import time

from ..clock import wall_ms
from ..runtime.actor import RuntimeActor
from ..runtime.signals import ActorFailed, CycleDone, StepDone, StepRequest, StepTimeout, Tick
from .context import ControlContext

log = logging.getLogger("qlactors.scheduler")

STEPS = ("recovery", "retry", "cron")  # "cron" runs here, in the Scheduler; the others are actors
STEP_DEADLINE_S = 10.0


class Scheduler(RuntimeActor):
    ctx: ControlContext
    name = "scheduler"

    def __init__(self, ctx: ControlContext) -> None:
        super().__init__(ctx)
        self.cycle = 0
        self.step: int | None = None  # index into STEPS while a cycle runs
        self.pending = False
        self.busy = False  # a step of the current cycle reported work
        self.retention = ctx.retention

    def handlers(self):
        return {Tick: self.on_tick, StepDone: self.on_step_done, StepTimeout: self.on_step_timeout}

    def on_tick(self, _msg: Tick, _peer: bytes) -> None:
        if self.step is not None:
            self.pending = True  # coalesced: one more cycle after this one, not one per tick
            return
        self.cycle += 1
        self.busy = False
        self._run_step(0)

    def _run_step(self, index: int) -> None:
        self.step = index
        if index >= len(STEPS):
            self._finish(ok=True)
            return
        name = STEPS[index]
        if name == "cron":
            try:
                self.busy = self._cron_page() or self.busy
            except Exception as err:  # a database error ends the cycle like a failed step
                self._finish(ok=False, step="cron", detail=repr(err))
                return
            self._run_step(index + 1)
            return
        self.ctx.bridge.call_at("scheduler-step", time.monotonic() + STEP_DEADLINE_S, self.me,
                                StepTimeout(self.cycle, name))
        if not self.ctx.directory.tell(name, StepRequest(self.cycle)):
            self._finish(ok=False, step=name, detail="the step's actor is not running")

    def _cron_page(self) -> bool:
        """Admit one page of due schedules at one observed time; True when any was due."""
        if not self.ctx.admitting.is_set():
            return False  # before startup recovery and while draining: fire_once catches up later
        cron, runtime = self.ctx.cron, self.ctx.config.runtime
        now = cron.observed_now_ms()
        due = cron.due(now, runtime.cron_page)
        for schedule in due:
            fired = cron.fire(schedule, now, tick_ms=runtime.cadence_tick_ms)
            if fired.outcome in ("admitted", "skipped", "missed_only"):
                log.info("event=cron_%s task=%s trigger=%s run=%s scheduled_for=%s missed=%d replaced=%s",
                         fired.outcome, schedule.task_name, fired.trigger_id, fired.run_id,
                         fired.scheduled_for_ms, fired.missed, fired.cancelled_run_id)
        if len(due) >= runtime.cron_page:
            self.pending = True  # more may be due: another cycle right after this one
        return bool(due)

    def _retire(self) -> bool:
        """Last, after dispatch is decided: one page of retention (log files, then rows, then a
        tombstone). A failure is logged and retried next cycle; it never holds work back.
        True when more may be due (the next cycle comes at the tick, not the idle tick)."""
        rt = self.ctx.config.runtime
        try:
            report = self.retention.retire_page(wall_ms(), max_age_ms=rt.retention_max_age_ms,
                                                max_runs=rt.retention_max_runs, page=rt.retention_page,
                                                revoked_tokens_ms=rt.retention_revoked_tokens_ms,
                                                task_events=rt.retention_task_events)
        except Exception as err:
            log.warning("event=retention_failed cycle=%d error=%r", self.cycle, err)
            return False
        if report.retired:
            log.info("event=runs_retired count=%d reasons=%s", report.retired, dict(report.reasons))
        return report.more

    def on_step_done(self, msg: StepDone, _peer: bytes) -> None:
        if self.step is None or msg.cycle != self.cycle or msg.step != STEPS[self.step]:
            return  # a late answer to a cycle that already ended
        self.ctx.bridge.cancel_timer("scheduler-step")
        self.busy = self.busy or msg.pending
        if msg.more:
            self.pending = True  # more candidates than a page: another cycle at once, as for cron
        if not msg.ok:
            self._finish(ok=False, step=msg.step, detail=msg.detail)
            return
        self._run_step(self.step + 1)

    def on_step_timeout(self, msg: StepTimeout, _peer: bytes) -> None:
        if self.step is None or msg.cycle != self.cycle or msg.step != STEPS[self.step]:
            return
        self._finish(ok=False, step=msg.step, detail=f"did not answer within {STEP_DEADLINE_S:g} s")
        self.ctx.directory.tell("supervisor", ActorFailed(msg.step, "silent past its step deadline",
                                                          step_timeout=True))

    def _finish(self, *, ok: bool, step: str = "", detail: str = "") -> None:
        self.ctx.bridge.cancel_timer("scheduler-step")
        stops: tuple = ()
        work = False
        next_due = None
        idle = False
        if ok:
            try:
                page = self.ctx.config.runtime.recovery_page
                control = self.ctx.control
                orders = [*control.stops.commit_timeouts(page), *control.stops.pending(page)]
                # A timeout committed now is also pending: one stop order per attempt.
                stops = tuple({o.attempt_id: o for o in orders}.values())
                work = self.ctx.admitting.is_set() and control.status.queued_waiting()
                due = [t for t in (control.stops.next_due_ms(), self.ctx.cron.next_fire_ms(),
                                   self.ctx.cron.next_not_before_ms()) if t is not None]
                next_due = min(due) if due else None
                idle = not (stops or work or self.busy or control.status.active_run_ids(1))
            except Exception as err:  # a database error ends the cycle like a failed step
                ok, step, detail = False, "stops/admission", str(err)
        if ok:
            idle = not self._retire() and idle
        health = getattr(self.ctx, "cycle_health", None)  # for `status`: which step, since when
        if ok:
            self.ctx.authority.set()
            if health is not None:
                health.passed()
        else:
            self.ctx.authority.clear()  # the Gateway offers nothing until a cycle gets through
            log.warning("event=cycle_failed cycle=%d step=%s detail=%s", self.cycle, step, detail)
            if health is not None:
                health.failed(step, detail, wall_ms())
        self.step = None
        self.ctx.directory.tell("supervisor", CycleDone(ok=ok, next_due_ms=next_due, stops=stops,
                                                        work_waiting=work, idle=idle))
        if self.pending:
            self.pending = False
            self.actor_ref.tell(Tick("coalesced"))
