"""The Executor's adoption and re-attestation (SEMANTICS.md §9 Re-attest, §10): after every start
and every new session, each attempt in the journal is probed and re-attested with the fact the
evidence gives, and each survivor's lease is re-bound to the current session.

- Journal rows this instance does not hold are probed (`executor/evidence.py: probe_rows`, one
  publish grace per page) and acted on by their fact: `running` → adopted and attested
  `running`; a receipt, `ended` or `rebooted` → consumed (the receipt, or its absence, is
  reported as for a launcher whose end this executor saw); `never_launched` → given back;
  `launch_unknown` → attested so, never relaunched; unreadable /proc → no fact, probed again
  on a later heartbeat. (Edge: its recovery judges by its own records, §6, so everything but a
  survivor or a never-launched row is consumed as before.)
- Attempts this instance holds when a session other than their lease's opens (a re-register
  after the old session ended): each launched one is attested `running` quoting its lease,
  with a fresh slot, and its renewals are held until the answer; an accepted, never launched
  one is given back.
- The answer to a `running` attestation: `applied` → the lease is re-bound (journal too);
  `superseded` → the process is stopped by its exact identity; `fenced` because the session
  attested from is no longer current → nothing now, the next Welcome attests again; `fenced`
  otherwise (the lease is not the worker's any more) → attested again if a newer lease was
  learnt meanwhile, else the process is stopped by its exact identity (§9 Renewal).

A mixin of `Executor` (executor/executor.py), as `SessionReports` is.
"""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass, field
from typing import Any

from ..ids import new_id
from ..process.identity import Liveness, probe
from ..runtime.signals import Consume
from ..wire import messages as m
from . import evidence as ev
from .context import ExecutorContext
from .journal.records import IN_FLIGHT, JournalEntry, LeaseFacts
from .owed_reports import session_fence

log = logging.getLogger("qlactors.executor")

PROBE_PAGE = 64


@dataclass
class Rebinding:
    """A survivor's `running` attestations waiting for their answers (answered in order)."""

    slots: dict[str, tuple[str, str, int]] = field(default_factory=dict)  # offer id -> (lease token,
    # session id, generation) it was attested from
    outstanding: int = 0
    quoted: LeaseFacts | None = None  # the lease the latest one quoted


class Adoption:
    """Probing, adoption and re-attestation of an Executor (see the module docstring)."""

    ctx: ExecutorContext

    # -- journal rows not held ------------------------------------------------------------------

    def _adopt(self) -> None:
        """Probe every in-flight journal row this instance does not hold, and act on its fact."""
        self._judge([e for e in self.ctx.journal.walk(IN_FLIGHT) if e.attempt_id not in self.live])

    def _reprobe(self) -> None:
        """Rows whose /proc was unreadable at the last probe: probed again (each heartbeat)."""
        if not self.unprobed:
            return
        ids, self.unprobed = sorted(self.unprobed), set()
        entries = (self.ctx.journal.get(a) for a in ids if a not in self.live)
        self._judge([e for e in entries if e is not None and e.state in IN_FLIGHT])

    def _judge(self, rows: list[JournalEntry]) -> None:
        grace_s = self.ctx.config.runtime.publish_grace_ms / 1000
        for start in range(0, len(rows), PROBE_PAGE):
            for found in ev.probe_rows(rows[start:start + PROBE_PAGE], receipts=self.ctx.local_receipts,
                                       current_boot_id=self.ctx.boot_id(), grace_s=grace_s):
                self._act_on(found)

    def _act_on(self, found: ev.Evidence) -> None:
        entry, fact = found.entry, found.fact
        if fact == ev.NEVER_LAUNCHED:  # an instance that died before launching it: nothing runs
            self.ctx.journal.clear(entry.attempt_id)
            self._give_back(entry.run_id, entry.attempt_id, entry.lease)
        elif fact == ev.RUNNING:
            self._adopt_running(entry, found.identity)
        elif fact in (ev.ENDED_WITH_RECEIPT, ev.ENDED, ev.REBOOTED) or not self._cluster():
            # Its receipt, or the lack of one, decides, exactly as for a launcher whose exit we
            # saw ourselves (the probe has waited the publish grace for a process found gone).
            self.on_consume(Consume(entry.run_id, entry.attempt_id, recheck=fact != ev.UNREADABLE), b"")
        elif fact == ev.LAUNCH_UNKNOWN:  # maybe spawned, maybe not: never relaunched, never "ended"
            log.warning("event=launch_unknown run=%s attempt=%s", entry.run_id, entry.attempt_id)
            self._attest(entry.run_id, entry.attempt_id, ev.LAUNCH_UNKNOWN, lease=entry.lease)
        else:  # unreadable /proc is not evidence (§10): no fact now, a later probe
            log.warning("event=evidence_unreadable run=%s attempt=%s action=probe_later", entry.run_id,
                        entry.attempt_id)
            self.unprobed.add(entry.attempt_id)

    def _adopt_running(self, entry: JournalEntry, identity: Any) -> None:
        """A launcher that survived a restart: watched again (for timeout and cancel), re-attested."""
        from .executor import Local

        boot_id = self.ctx.boot_id()
        try:
            pidfd = os.pidfd_open(identity.pid)
        except ProcessLookupError:  # ended since the probe: its receipt decides
            self.on_consume(Consume(entry.run_id, entry.attempt_id), b"")
            return
        if probe(identity, current_boot_id=boot_id) is not Liveness.RUNNING:
            os.close(pidfd)  # ended, or the pid was recycled, between the probe and the open
            self.on_consume(Consume(entry.run_id, entry.attempt_id), b"")
            return
        local = Local(run_id=entry.run_id, attempt_id=entry.attempt_id, identity=identity, pidfd=pidfd,
                      deadline_ms=entry.local_deadline_ms)
        self.live[entry.attempt_id] = local
        self.ctx.bridge.watch(pidfd, entry.attempt_id, self.me)
        log.info("event=adopted run=%s attempt=%s pid=%d", entry.run_id, entry.attempt_id, identity.pid)
        if self._cluster():  # its lease is re-bound to this session
            self._attest_running(local, entry.lease)

    def _give_back(self, run_id: str, attempt_id: str, lease: LeaseFacts | None = None) -> None:
        """Tell the control side this executor holds no process for an attempt it never launched.

        The evidence recovery needs (SEMANTICS.md §6): a `claimed` attempt has its lease released
        and is offered again; one activated but never launched ends as judged there.
        """
        log.warning("event=attempt_given_back run=%s attempt=%s", run_id, attempt_id)
        self._attest(run_id, attempt_id, "never_launched", lease=lease)

    # -- attempts held when a new session opens ---------------------------------------------------

    def _reattest_held(self, welcome: m.Welcome) -> None:
        """A session other than their lease's: re-attest each held survivor, give back the rest."""
        if not self._cluster():
            return
        current = (welcome.session_id, welcome.session_generation)
        for local in list(self.live.values()):
            lease = self._lease_of(local)
            if lease is not None and (lease.session_id, lease.session_generation) == current:
                continue  # a resumed session: its lease goes on
            if local.identity is None:  # accepted, not launched: its Activate is the old session's
                self.ctx.journal.clear(local.attempt_id)
                del self.live[local.attempt_id]
                self._give_back(local.run_id, local.attempt_id, lease)
                continue
            log.info("event=reattest_running run=%s attempt=%s session=%s", local.run_id, local.attempt_id,
                     welcome.session_id)
            self._attest_running(local, lease)

    def _lease_of(self, local: Any) -> LeaseFacts | None:
        if local.lease is not None:
            return local.lease
        entry = self.ctx.journal.get(local.attempt_id)
        return None if entry is None else entry.lease

    def _attest_running(self, local: Any, lease: LeaseFacts | None) -> None:
        """`running` from the current session quoting `lease`, with a fresh slot for the re-bound one."""
        s = self.session
        if s is None:
            return
        slot = (new_id(), secrets.token_urlsafe(32))
        pending = self.rebinding.setdefault(local.attempt_id, Rebinding())
        pending.slots[slot[0]] = (slot[1], s.session_id, s.session_generation)
        pending.outstanding += 1
        pending.quoted = lease
        self._attest(local.run_id, local.attempt_id, ev.RUNNING, lease=lease, slot=slot, identity=local.identity)

    def _held_lease(self, local: Any) -> bool:
        """Whether `local`'s lease is the current session's (only those are renewed)."""
        s, lease = self.session, local.lease
        return (s is not None and lease is not None
                and (lease.session_id, lease.session_generation) == (s.session_id, s.session_generation))

    # -- the answers ------------------------------------------------------------------------------

    def on_attested(self, msg: m.Attested, _peer: bytes) -> None:
        report = self._owed_answered(msg.answer_to)
        if report is None:  # a second answer to an attestation settled already, or a stray one
            log.info("event=answer_ignored of=attest attempt=%s fact=%s result=%s (not the answer waited for)",
                     msg.attempt_id, msg.fact, msg.result)
            return
        if msg.fact != ev.RUNNING and msg.result == "fenced" and session_fence(msg.detail):
            self._fenced_by_session(report, msg)  # re-made from the current session
            return
        self._settle(report)
        local = self.live.get(msg.attempt_id)
        pending = self.rebinding.get(msg.attempt_id)
        if msg.fact != ev.RUNNING or pending is None or local is None:
            if pending is not None and local is None:
                del self.rebinding[msg.attempt_id]  # ended meanwhile: its receipt decides
            if msg.result != "applied":
                log.warning("event=attest_%s attempt=%s fact=%s detail=%s", msg.result, msg.attempt_id,
                            msg.fact, msg.detail)
            return
        pending.outstanding = max(0, pending.outstanding - 1)
        if msg.result == "applied":
            self._rebound(local, pending, msg)
            return
        if pending.outstanding > 0:  # the answer to an earlier attestation: the latest decides
            log.info("event=attest_superseded_by_later attempt=%s result=%s detail=%s", msg.attempt_id,
                     msg.result, msg.detail)
            return
        del self.rebinding[msg.attempt_id]
        if msg.result == "superseded":
            if local.identity is not None and local.stop_phase is None:
                log.warning("event=superseded_process_stopped attempt=%s detail=%s", msg.attempt_id, msg.detail)
                self._begin_stop(local, "superseded")
        elif msg.result == "fenced" and session_fence(msg.detail):
            # The session attested from is no longer current: its next heartbeat finds it ended,
            # and the Welcome after the re-register attests again. Its renewals stay held.
            log.warning("event=rebind_fenced_by_session attempt=%s detail=%s action=reattest_next_session",
                        msg.attempt_id, msg.detail)
        elif local.lease is not None and local.lease != pending.quoted:
            # A newer lease was learnt since (an earlier attestation re-bound it): quote that one.
            log.warning("event=rebind_retried attempt=%s detail=%s", msg.attempt_id, msg.detail)
            self._attest_running(local, local.lease)
        elif local.identity is not None and local.stop_phase is None:
            # The quoted lease is not this worker's any more and nothing can renew it: a survivor
            # running with no lease would be unknown to everyone. Stopped by its exact identity;
            # its receipt (or its absence, attested) reports it.
            log.error("event=rebind_refused_process_stopped attempt=%s result=%s detail=%s", msg.attempt_id,
                      msg.result, msg.detail)
            self._begin_stop(local, "rebind_" + msg.result)

    def _rebound(self, local: Any, pending: Rebinding, msg: m.Attested) -> None:
        slot = pending.slots.get(msg.offer_id or "")
        if slot is None:
            log.error("event=rebind_of_unknown_slot attempt=%s offer=%s", msg.attempt_id, msg.offer_id)
            if pending.outstanding == 0:
                del self.rebinding[msg.attempt_id]
            return
        token, session_id, generation = slot
        local.lease = LeaseFacts(msg.offer_id, msg.lease_generation, token, session_id, generation)
        self.ctx.journal.rebind(msg.attempt_id, msg.lease_generation, msg.offer_id, token, session_id,
                                generation)
        log.info("event=rebound attempt=%s lease_generation=%s session=%s", msg.attempt_id,
                 msg.lease_generation, session_id)
        if pending.outstanding > 0:
            return  # a later attestation decides (quoting an older lease, it is attested again)
        del self.rebinding[msg.attempt_id]
        if self.session is not None and not self._held_lease(local):
            # Re-bound to a session that has ended since: attest again from the current one.
            self._attest_running(local, local.lease)
