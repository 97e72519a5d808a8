"""Recovery on a control replica: it decides from the database and from what workers attest,
never from `/proc` or a worker's files (SEMANTICS.md §9, §10).

This part of §10 step 1 runs on every cycle: a never-activated claim whose offer expired has its
lease released and is offered again. Judging `starting|running` attempts whose lease expired
(evidence, the idempotent grace, retire) is the next issue's; until then such an attempt waits,
and a worker's attestation is only logged.
"""

from __future__ import annotations

import logging
from typing import Any

from ..store.expired_claims import ExpiredClaims
from .base import RuntimeActor
from .signals import AttemptEnded, StartupPass, StepDone, StepRequest

log = logging.getLogger("qlactors.recovery")


class ClusterRecovery(RuntimeActor):
    name = "recovery"
    never_redelivered = (StartupPass,)

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.claims = ExpiredClaims(ctx.repo.store)

    def handlers(self):
        return {StartupPass: self.on_startup, StepRequest: self.on_page, AttemptEnded: self.on_ended}

    def on_startup(self, _msg: StartupPass, _peer: bytes) -> dict[str, int]:
        """A replica holds no process: its startup pass is the first page of expired claims."""
        return {"released": self._release_page()}

    def on_ended(self, msg: AttemptEnded, _peer: bytes) -> None:
        log.info("event=attested_not_running run=%s attempt=%s", msg.run_id, msg.attempt_id)

    def on_page(self, msg: StepRequest, _peer: bytes) -> None:
        try:
            released = self._release_page()
        except Exception as err:  # ends the cycle: nothing is offered while authority is unknown
            log.warning("event=recovery_page_failed error=%r", err)
            self.ctx.directory.tell("scheduler", StepDone(msg.cycle, self.name, False, repr(err)))
            return
        self.ctx.directory.tell("scheduler", StepDone(msg.cycle, self.name, True, pending=released > 0))

    def _release_page(self) -> int:
        page, _more = self.claims.page(self.ctx.config.runtime.recovery_page)
        released = 0
        for claim in page:
            outcome = self.claims.release(claim)
            if outcome.result == "applied":
                released += 1
                log.info("event=expired_offer_released run=%s attempt=%s", claim.run_id, claim.attempt_id)
        return released
