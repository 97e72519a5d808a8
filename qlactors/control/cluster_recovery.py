"""Control side: recovery on a control replica: it decides from the database and from what workers
attest, never from `/proc` or a worker's files (SEMANTICS.md §9, §10 step 1).

Each cycle: one page of never-activated claims whose offer expired (their lease is released and
the attempt offered again: store/cadence/expired_claims.py), then one page of `starting|running`
attempts whose lease is missing or expired and for which evidence exists (marked lost, or ended
by their cancel intent: store/cadence/cluster_recovery.py). Attempts still waiting for evidence are not
on that page at all (`status` lists them). A full page asks the Scheduler for another cycle at
once; a failure ends the cycle, so nothing is offered while authority is unknown.

A claim its worker gives back (`never_launched` for an attempt never activated) is not this
actor's: the store released its lease (`declined`) in the attestation's own transaction
(store/dispatch/attestations.py), and the cycle the Gateway asks for offers the attempt again.
"""

from __future__ import annotations

import logging

from ..runtime.actor import RuntimeActor
from ..runtime.signals import AttemptEnded, StartupPass, StepDone, StepRequest
from ..store.cadence.cluster_recovery import ClusterRecoveryCases
from ..store.cadence.expired_claims import ExpiredClaims
from .context import ControlContext

log = logging.getLogger("qlactors.recovery")


class ClusterRecovery(RuntimeActor):
    ctx: ControlContext
    name = "recovery"
    never_redelivered = (StartupPass,)

    def __init__(self, ctx: ControlContext) -> None:
        super().__init__(ctx)
        self.claims = ExpiredClaims(ctx.repo.store)
        self.cases = ClusterRecoveryCases(ctx.repo.store, recovery_grace_ms=ctx.recovery_grace_ms,
                                          drain_grace_ms=ctx.drain_grace_ms)

    def handlers(self):
        return {StartupPass: self.on_startup, StepRequest: self.on_page, AttemptEnded: self.on_ended}

    def on_startup(self, _msg: StartupPass, _peer: bytes) -> dict[str, int]:
        """A replica holds no process: its startup pass is the first page of each kind."""
        released, resolved, _more = self._pages()
        return {"released": released, "resolved": resolved}

    def on_ended(self, msg: AttemptEnded, _peer: bytes) -> None:
        # Nothing to do here: the attestation's transaction recorded the evidence (judged on the
        # page of the cycle the Gateway asked for) or already released a given-back claim.
        log.info("event=attested_not_running run=%s attempt=%s", msg.run_id, msg.attempt_id)

    def on_page(self, msg: StepRequest, _peer: bytes) -> None:
        try:
            released, resolved, more = self._pages()
        except Exception as err:  # ends the cycle: nothing is offered while authority is unknown
            log.warning("event=recovery_page_failed error=%r", err)
            self.ctx.directory.tell("scheduler", StepDone(msg.cycle, self.name, False, repr(err)))
            return
        self.ctx.directory.tell("scheduler", StepDone(msg.cycle, self.name, True,
                                                      pending=released + resolved > 0, more=more))

    def _pages(self) -> tuple[int, int, bool]:
        """Released claims, resolved attempts, and whether a page was full and acted (so more
        remain that the next cycle can take; a page whose every entry was refused waits for the
        tick instead of spinning)."""
        page = self.ctx.config.runtime.recovery_page
        claims, claims_more = self.claims.page(page)
        released = 0
        for claim in claims:
            if self.claims.release(claim).applied:
                released += 1
                log.info("event=expired_offer_released run=%s attempt=%s", claim.run_id, claim.attempt_id)
        candidates, cases_more = self.cases.page(page)
        resolved = 0
        for candidate in candidates:
            outcome = self.cases.resolve(candidate)
            if outcome.applied:
                resolved += 1
                log.warning("event=attempt_recovered run=%s attempt=%s evidence=%s run_state=%s",
                            candidate.run_id, candidate.attempt_id, candidate.kind, outcome.run_state)
            else:
                log.info("event=recovery_refused run=%s attempt=%s evidence=%s result=%s detail=%s",
                         candidate.run_id, candidate.attempt_id, candidate.kind, outcome.result,
                         outcome.detail)
        more = (claims_more and released > 0) or (cases_more and resolved > 0)
        return released, resolved, more
