"""Executor side: adoption and re-attestation (SEMANTICS.md §9 Re-attest, §10): after every start
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

A part the Executor holds (executor/executor.py), given the journal and the files it probes, the
live table, the current session and the owed reports; a consume and a stop are the Executor's.
"""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable

from ..domain.results import Result
from ..ids import new_id
from ..process.identity import Liveness, probe
from ..runtime.context import Named
from ..runtime.signals import Consume
from ..wire import messages as m
from ..wire.bridge import Bridge
from . import evidence as ev
from .journal.journal import Journal
from .journal.records import IN_FLIGHT, JournalEntry, LeaseFacts
from .local_receipts import LocalReceipts
from .owed_reports import OwedReports, session_fence
from .session_policy import CurrentSession
from .slots import Local, Slots

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

    def __init__(self, *, journal: Journal, local_receipts: LocalReceipts, boot_id: Callable[[], str],
                 publish_grace_ms: int, bridge: Bridge, me: Named, current: CurrentSession, slots: Slots,
                 owed: OwedReports, consume: Callable[[Consume], None],
                 begin_stop: Callable[[Local, str], None]) -> None:
        self.journal, self.local_receipts, self.boot_id = journal, local_receipts, boot_id
        self.publish_grace_ms, self.bridge, self.me = publish_grace_ms, bridge, me
        self.current, self.slots, self.owed = current, slots, owed
        self.consume, self.begin_stop = consume, begin_stop
        # Survivors attested `running`, their answers pending (attempt id -> Rebinding).
        self.rebinding: dict[str, Rebinding] = {}
        self.unprobed: set[str] = set()  # journal rows whose /proc was unreadable: probed again

    # -- journal rows not held ------------------------------------------------------------------

    def adopt(self) -> None:
        """Probe every in-flight journal row this instance does not hold, and act on its fact."""
        self._judge([e for e in self.journal.walk(IN_FLIGHT) if e.attempt_id not in self.slots])

    def reprobe(self) -> None:
        """Rows whose /proc was unreadable at the last probe: probed again (each heartbeat)."""
        if not self.unprobed:
            return
        ids, self.unprobed = sorted(self.unprobed), set()
        entries = (self.journal.get(a) for a in ids if a not in self.slots)
        self._judge([e for e in entries if e is not None and e.state in IN_FLIGHT])

    def _judge(self, rows: list[JournalEntry]) -> None:
        grace_s = self.publish_grace_ms / 1000
        for start in range(0, len(rows), PROBE_PAGE):
            for found in ev.probe_rows(rows[start:start + PROBE_PAGE], receipts=self.local_receipts,
                                       current_boot_id=self.boot_id(), grace_s=grace_s):
                self._act_on(found)

    def _act_on(self, found: ev.Evidence) -> None:
        entry, fact = found.entry, found.fact
        if fact == ev.NEVER_LAUNCHED:  # an instance that died before launching it: nothing runs
            self.journal.clear(entry.attempt_id)
            self.owed.give_back(entry.run_id, entry.attempt_id, entry.lease)
        elif fact == ev.RUNNING:
            self._adopt_running(entry, found.identity)
        elif fact in (ev.ENDED_WITH_RECEIPT, ev.ENDED, ev.REBOOTED) or self.current.policy.judged_by_own_records:
            # Its receipt, or the lack of one, decides, exactly as for a launcher whose exit we
            # saw ourselves (the probe has waited the publish grace for a process found gone).
            self.consume(Consume(entry.run_id, entry.attempt_id, recheck=fact != ev.UNREADABLE))
        elif fact == ev.LAUNCH_UNKNOWN:  # maybe spawned, maybe not: never relaunched, never "ended"
            log.warning("event=launch_unknown run=%s attempt=%s", entry.run_id, entry.attempt_id)
            self.owed.attest(entry.run_id, entry.attempt_id, ev.LAUNCH_UNKNOWN, lease=entry.lease)
        else:  # unreadable /proc is not evidence (§10): no fact now, a later probe
            log.warning("event=evidence_unreadable run=%s attempt=%s action=probe_later", entry.run_id,
                        entry.attempt_id)
            self.unprobed.add(entry.attempt_id)

    def _adopt_running(self, entry: JournalEntry, identity: Any) -> None:
        """A launcher that survived a restart: watched again (for timeout and cancel), re-attested."""
        boot_id = self.boot_id()
        try:
            pidfd = os.pidfd_open(identity.pid)
        except ProcessLookupError:  # ended since the probe: its receipt decides
            self.consume(Consume(entry.run_id, entry.attempt_id))
            return
        if probe(identity, current_boot_id=boot_id) is not Liveness.RUNNING:
            os.close(pidfd)  # ended, or the pid was recycled, between the probe and the open
            self.consume(Consume(entry.run_id, entry.attempt_id))
            return
        local = Local(run_id=entry.run_id, attempt_id=entry.attempt_id, identity=identity, pidfd=pidfd,
                      deadline_ms=entry.local_deadline_ms)
        self.slots.hold(local)
        self.bridge.watch(pidfd, entry.attempt_id, self.me)
        log.info("event=adopted run=%s attempt=%s pid=%d", entry.run_id, entry.attempt_id, identity.pid)
        self.current.policy.adopted(local, entry.lease)  # a worker's: re-bound to this session

    # -- attempts held when a new session opens ---------------------------------------------------

    def reattest_held(self, welcome: m.Welcome) -> None:
        """A session other than their lease's: re-attest each held survivor, give back the rest."""
        current = (welcome.session_id, welcome.session_generation)
        for local in self.slots:
            lease = self._lease_of(local)
            if lease is not None and (lease.session_id, lease.session_generation) == current:
                continue  # a resumed session: its lease goes on
            if local.identity is None:  # accepted, not launched: its Activate is the old session's
                self.journal.clear(local.attempt_id)
                self.slots.release(local.attempt_id)
                self.owed.give_back(local.run_id, local.attempt_id, lease)
                continue
            log.info("event=reattest_running run=%s attempt=%s session=%s", local.run_id, local.attempt_id,
                     welcome.session_id)
            self.attest_running(local, lease)

    def _lease_of(self, local: Any) -> LeaseFacts | None:
        if local.lease is not None:
            return local.lease
        entry = self.journal.get(local.attempt_id)
        return None if entry is None else entry.lease

    def attest_running(self, local: Any, lease: LeaseFacts | None) -> None:
        """`running` from the current session quoting `lease`, with a fresh slot for the re-bound one."""
        s = self.current.welcome
        if s is None:
            return
        slot = (new_id(), secrets.token_urlsafe(32))
        pending = self.rebinding.setdefault(local.attempt_id, Rebinding())
        pending.slots[slot[0]] = (slot[1], s.session_id, s.session_generation)
        pending.outstanding += 1
        pending.quoted = lease
        self.owed.attest(local.run_id, local.attempt_id, ev.RUNNING, lease=lease, slot=slot, identity=local.identity)

    # -- the answers ------------------------------------------------------------------------------

    def on_attested(self, msg: m.Attested, _peer: bytes) -> None:
        report = self.owed.answered(msg.answer_to)
        if report is None:  # a second answer to an attestation settled already, or a stray one
            log.info("event=answer_ignored of=attest attempt=%s fact=%s result=%s (not the answer waited for)",
                     msg.attempt_id, msg.fact, msg.result)
            return
        if msg.fact != ev.RUNNING and msg.result == Result.FENCED and session_fence(msg.detail):
            self.owed.fenced_by_session(report, msg)  # re-made from the current session
            return
        self.owed.settle(report)
        local = self.slots.get(msg.attempt_id)
        pending = self.rebinding.get(msg.attempt_id)
        if msg.fact != ev.RUNNING or pending is None or local is None:
            if pending is not None and local is None:
                del self.rebinding[msg.attempt_id]  # ended meanwhile: its receipt decides
            if msg.result != Result.APPLIED:
                log.warning("event=attest_%s attempt=%s fact=%s detail=%s", msg.result, msg.attempt_id,
                            msg.fact, msg.detail)
            return
        pending.outstanding = max(0, pending.outstanding - 1)
        if msg.result == Result.APPLIED:
            self._rebound(local, pending, msg)
            return
        if pending.outstanding > 0:  # the answer to an earlier attestation: the latest decides
            log.info("event=attest_superseded_by_later attempt=%s result=%s detail=%s", msg.attempt_id,
                     msg.result, msg.detail)
            return
        del self.rebinding[msg.attempt_id]
        if msg.result == Result.SUPERSEDED:
            if local.identity is not None and local.stop_phase is None:
                log.warning("event=superseded_process_stopped attempt=%s detail=%s", msg.attempt_id, msg.detail)
                self.begin_stop(local, Result.SUPERSEDED)
        elif msg.result == Result.FENCED and session_fence(msg.detail):
            # The session attested from is no longer current: its next heartbeat finds it ended,
            # and the Welcome after the re-register attests again. Its renewals stay held.
            log.warning("event=rebind_fenced_by_session attempt=%s detail=%s action=reattest_next_session",
                        msg.attempt_id, msg.detail)
        elif local.lease is not None and local.lease != pending.quoted:
            # A newer lease was learnt since (an earlier attestation re-bound it): quote that one.
            log.warning("event=rebind_retried attempt=%s detail=%s", msg.attempt_id, msg.detail)
            self.attest_running(local, local.lease)
        elif local.identity is not None and local.stop_phase is None:
            # The quoted lease is not this worker's any more and nothing can renew it: a survivor
            # running with no lease would be unknown to everyone. Stopped by its exact identity;
            # its receipt (or its absence, attested) reports it.
            log.error("event=rebind_refused_process_stopped attempt=%s result=%s detail=%s", msg.attempt_id,
                      msg.result, msg.detail)
            self.begin_stop(local, "rebind_" + msg.result)

    def _rebound(self, local: Any, pending: Rebinding, msg: m.Attested) -> None:
        slot = pending.slots.get(msg.offer_id or "")
        if slot is None:
            log.error("event=rebind_of_unknown_slot attempt=%s offer=%s", msg.attempt_id, msg.offer_id)
            if pending.outstanding == 0:
                del self.rebinding[msg.attempt_id]
            return
        token, session_id, generation = slot
        local.lease = LeaseFacts(msg.offer_id, msg.lease_generation, token, session_id, generation)
        self.journal.rebind(msg.attempt_id, msg.lease_generation, msg.offer_id, token, session_id,
                                generation)
        log.info("event=rebound attempt=%s lease_generation=%s session=%s", msg.attempt_id,
                 msg.lease_generation, session_id)
        if pending.outstanding > 0:
            return  # a later attestation decides (quoting an older lease, it is attested again)
        del self.rebinding[msg.attempt_id]
        if self.current.welcome is not None and not self.current.holds(local.lease):
            # Re-bound to a session that has ended since: attest again from the current one.
            self.attest_running(local, local.lease)
