"""Control side: the Retry actor: resolves lost runs by their admission-time policy, and requeues those
whose backoff is over."""

from __future__ import annotations

import logging

from ..runtime.actor import RuntimeActor
from ..runtime.signals import StepDone, StepRequest
from .context import ControlContext

log = logging.getLogger("qlactors.retry")


class Retry(RuntimeActor):
    ctx: ControlContext
    name = "retry"

    def handlers(self):
        return {StepRequest: self.on_page}

    def on_page(self, msg: StepRequest, _peer: bytes) -> None:
        retries = self.ctx.lost_retry
        page = self.ctx.config.runtime.retry_page
        try:
            lost = retries.lost_runs(page)
            for run_id in lost:
                retries.resolve_lost(run_id)
            due = retries.due_retries(page)
            for run_id in due:
                retries.requeue(run_id)
        except Exception as err:  # the cycle stops here; the next tick tries again
            log.warning("event=retry_page_failed error=%r", err)
            self.ctx.directory.tell("scheduler", StepDone(msg.cycle, self.name, False, repr(err)))
            return
        full = len(lost) >= page or len(due) >= page  # more may wait: another cycle at once
        self.ctx.directory.tell("scheduler", StepDone(msg.cycle, self.name, True, pending=bool(lost or due),
                                                      more=full))
