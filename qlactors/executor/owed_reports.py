"""The Executor's owed reports (SEMANTICS.md §9 Owed reports, Register once): every report it owes
the control side is journalled before it is first sent and kept until its own answer.

- Owed: Register (while the worker has no session), Started, StartFailed, Decline, every Attest
  and Leave. (`Completed` has its own journal: the receipt file, kept and re-sent by the
  ReceiptConsumer until answered, under one request id per attempt.) Activate and Pull are not
  owed: they are repeated on their own cadence until answered, and a late answer to them is
  judged against what the Executor holds.
- Each is re-sent unchanged (same `request_id`) at every heartbeat interval while it waits, and
  at once after every new Welcome, to whichever replica is current.
- An answer settles the report it names (`answer_to`) once: a second answer to it (a copy's, a
  replica's late one) finds nothing owed and is logged and ignored. A report answered `fenced`
  for its session when that session is no longer the current one is not lost: it is re-made as
  an Attest from the current session (Started: the Welcome's re-attestation already did it).
- Register: a worker without a session re-sends the same Register (same `register_id`, so every
  copy and every replica give the same session) with backoff, 1 s doubling to its heartbeat; a
  key the replicas refuse (not yet allowed) is tried again up to every 30 s and logged once a
  minute, so a later `worker allow` takes effect without a restart; a refusal for its protocol
  version, or as a second live process presenting the same key (`duplicate_worker`), stops the
  worker (exit 1) with the refusal's text, as retrying cannot help.
- Revoked: a key refused after this worker had a session was revoked (`worker revoke`). Said
  once, as an ERROR naming how many jobs' results cannot be delivered (running, or ended with
  their receipts on disk): they go on being re-sent. Its session has ended, so recovery marks
  the runs of idempotent or deduplicated tasks lost after the recovery grace; only those of
  unknown safety wait to be delivered once the key is allowed again (or recorded lost by
  `worker retire`). Said again only after a new session.

A mixin of `Executor` (executor/executor.py), as `SessionReports` is.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from ..clock import wall_ms
from ..ids import new_id
from ..runtime.signals import OwedDue, RegisterDue
from ..wire import codec
from ..wire import messages as m
from ..wire.pacing import Backoff, LogLimit
from .context import ExecutorContext
from .journal.records import LeaseFacts, OwedReport

log = logging.getLogger("qlactors.executor")

REGISTER_FIRST_S = 1.0  # the first repeat of an unanswered Register; doubles up to the heartbeat
REGISTER_MAX_S = 10.0  # the default heartbeat; the last Welcome's interval once there was one
REFUSED_KEY_MAX_S = 30.0  # a key not (yet) allowed: tried again at most this far apart
REFUSED_LOG_EVERY_S = 60.0
OWED_RESEND_S = 1.0  # while no session says its heartbeat: how often owed reports go out again
SESSION_FENCES = ("unknown_session", "session_")  # details of a fence by the session reported from
PROTOCOL_REFUSAL = "protocol"  # the first word of a Register refused for its protocol version
DUPLICATE_REFUSAL = "duplicate_worker"  # ... refused as a second live process presenting this key


KEY_REFUSED = "key_refused"  # the one key of `key_refused_log`


def register_pacing() -> tuple[Backoff, LogLimit]:
    """A new Executor's Register backoff and its `worker_key_refused` log limit."""
    return Backoff(REGISTER_FIRST_S, REGISTER_MAX_S), LogLimit(REFUSED_LOG_EVERY_S)


def session_fence(detail: str | None) -> bool:
    """Whether a `fenced` answer is about the session the report was sent from."""
    return (detail or "").startswith(SESSION_FENCES)


class OwedReports:
    """Journal, re-send and settle what an Executor owes (see the module docstring)."""

    ctx: ExecutorContext

    owed_sent_at: dict[str, float]  # request id -> when this instance last sent it (monotonic)
    owed_round_at: float = 0.0  # when the owed timer was last set (monotonic)
    register_request: str | None = None  # the Register waited for (no session yet)
    register_backoff: Backoff  # its repeats: 1 s doubling to the heartbeat (REFUSED_KEY_MAX_S once refused)
    key_refused_log: LogLimit  # `worker_key_refused`, once a minute
    had_session: bool = False  # a Welcome came since this instance started: a refused key was revoked
    revoked_logged: bool = False

    # -- owing ----------------------------------------------------------------------------------

    def _owe(self, message: Any, attempt_id: str | None = None) -> None:
        """Journal `message` as owed, then send it."""
        body = codec.encode(message)[1]
        self.ctx.journal.owe(message.request_id, message.KIND, attempt_id, body)
        self.owed_sent_at[message.request_id] = time.monotonic()
        self.out.to_control(message)
        self._schedule_owed()

    def _resend_owed(self, due_before: float) -> None:
        """Every owed report again, unchanged, oldest first: those this instance has not sent since
        `due_before` (monotonic: the Welcome, the last round). A Register is re-sent by its own
        backoff, and a report waits while there is no session."""
        if self.session is None:
            return
        still_owed = False
        for report in self.ctx.journal.owed():
            if report.kind == m.Register.KIND:
                self.ctx.journal.settle(report.request_id)  # a session is open: this one is moot
                continue
            still_owed = True
            if self.owed_sent_at.get(report.request_id, float("-inf")) > due_before:
                continue  # sent just now (this Welcome's re-attestations, a fresh report)
            self.owed_sent_at[report.request_id] = time.monotonic()
            self.out.to_control(_decoded(report))
        if still_owed:
            self._schedule_owed()  # and again an interval later, until each is answered

    def _schedule_owed(self) -> None:
        if self.ctx.bridge.timer_due("owed") is None:
            every = self.session.heartbeat_ms / 1000 if self.session is not None else OWED_RESEND_S
            self.owed_round_at = time.monotonic()
            self.ctx.bridge.call_at("owed", self.owed_round_at + every, self.me, OwedDue())

    def on_owed_due(self, _msg: OwedDue, _peer: bytes) -> None:
        """A heartbeat interval went by: what was sent before it and is still owed goes out again."""
        due_before = self.owed_round_at
        if self.session is None:  # the Register's own backoff repeats it; the rest waits for a Welcome
            if self.ctx.journal.owed(1):
                self._schedule_owed()
            return
        self._resend_owed(due_before)

    def _owed_answered(self, answer_to: str) -> OwedReport | None:
        """The owed report an answer names (still owed: `_settle` it once acted on); None when it
        names none (an answer to a request that is not owed, or a second answer to a settled one)."""
        return self.ctx.journal.owes(answer_to) if answer_to else None

    def _settle(self, report: OwedReport | None) -> None:
        if report is not None:
            self.ctx.journal.settle(report.request_id)
            self.owed_sent_at.pop(report.request_id, None)

    def _fenced_by_session(self, report: OwedReport, answer: Any) -> None:
        """A report answered `fenced` for the session it was sent from. While that session is still
        the current one here it stays owed (this worker is about to learn its session ended, and
        sends it again from the next one); otherwise it is settled and re-made as an Attest from
        the current session, so nothing it reported is lost."""
        original = _decoded(report)
        s = self.session
        if s is not None and (original.session_id, original.session_generation) == (s.session_id,
                                                                                   s.session_generation):
            return
        self._settle(report)
        log.warning("event=report_fenced_by_session kind=%s attempt=%s detail=%s action=attest_from_current",
                    report.kind, report.attempt_id, getattr(answer, "detail", ""))
        if s is None:
            return
        if isinstance(original, (m.StartFailed, m.Decline)):
            # Nothing runs for it here: the evidence, from a session that can speak.
            self._give_back(original.run_id, original.attempt_id, _lease_of(original))
        elif isinstance(original, m.Attest):
            self._owe(replace(original, request_id=new_id(), session_id=s.session_id,
                              session_generation=s.session_generation), original.attempt_id)
        # Started: the Welcome's re-attestation of the held attempt (`running`) did it already.
        # Leave: the session it drained is gone anyway.

    # -- Register once --------------------------------------------------------------------------

    def _send_register(self, message: m.Register) -> None:
        self.register_request = message.request_id
        self.register_backoff.reset()
        self._owe(message)
        self._schedule_register()

    def _schedule_register(self) -> float:
        delay = self.register_backoff.next()
        self.ctx.bridge.call_at("register", time.monotonic() + delay, self.me, RegisterDue())
        return delay

    def on_register_due(self, _msg: RegisterDue, _peer: bytes) -> None:
        if self.session is not None or self.register_request is None:
            return
        report = self.ctx.journal.owes(self.register_request)
        if report is None:
            return
        # The same request and register id, its clock now: the skew `workers` shows is measured
        # from the copy that opens the session (a key allowed minutes after the first copy).
        self.out.to_control(replace(_decoded(report), worker_clock_ms=wall_ms()))
        log.info("event=register_repeated register=%s next_in_s=%.0f", self.register_request,
                 self._schedule_register())

    def _welcomed(self, msg: m.Welcome) -> bool:
        """Whether `msg` answers the Register this worker waits for (settled now)."""
        if self.register_request is None or msg.answer_to != self.register_request:
            log.warning("event=welcome_unexpected session=%s answer_to=%s", msg.session_id, msg.answer_to or "-")
            return False
        self._settle(self._owed_answered(msg.answer_to))
        self.register_request = None
        self.register_backoff.cap_s = max(REGISTER_FIRST_S, msg.heartbeat_ms / 1000)
        self.key_refused_log.forget(KEY_REFUSED)
        self.had_session, self.revoked_logged = True, False
        self.ctx.bridge.cancel_timer("register")
        return True

    def _register_refused(self, msg: m.Ack) -> None:
        """A Register refused: for its protocol version the worker stops (retrying cannot help);
        otherwise (an unknown or revoked key) it keeps trying, and says so once a minute."""
        if msg.detail.startswith(PROTOCOL_REFUSAL):
            log.error("event=register_refused reason=protocol detail=%s", msg.detail)
            self.ctx.fatal.trip(f"the control side refused this worker's protocol: {msg.detail}")
            return
        if msg.detail.startswith(DUPLICATE_REFUSAL):  # retrying would take the session from the other
            log.error("event=register_refused reason=duplicate_worker key=%s detail=%s",
                      getattr(self.ctx, "public_key", "") or "-", msg.detail)
            self.ctx.fatal.trip(f"the control side refused this worker: {msg.detail}")
            return
        self._key_refused(msg.detail)

    def _key_refused(self, detail: str) -> None:
        key = getattr(self.ctx, "public_key", "") or "-"
        self.register_backoff.cap_s = REFUSED_KEY_MAX_S  # the Register, if any, backs off up to it
        if self.had_session:  # allowed before: revoked since
            if not self.revoked_logged:
                self.revoked_logged = True
                waiting = sum(1 for _ in self.ctx.journal.walk(("launching", "started")))
                log.error("event=worker_key_revoked key=%s running=%d detail=%s (this worker's key is no longer "
                          "on the allow-list and its session has ended: its running jobs go on, but the results "
                          "of these %d cannot be delivered; recovery marks the runs of tasks declaring --safety "
                          "idempotent or deduplicated lost after recovery_grace_ms (then their retry policy "
                          "applies), and only the runs of unknown safety wait until the key is allowed again "
                          "(qlactors worker allow NAME KEYFILE) or the worker is retired (qlactors worker retire "
                          "NAME --confirm-stopped: they are recorded lost); it keeps re-sending them)",
                          key, waiting, detail, waiting)
            return
        if self.key_refused_log.admit(KEY_REFUSED, time.monotonic()) is not None:
            log.error("event=worker_key_refused key=%s detail=%s (put this worker's key on the allow-list: "
                      "qlactors worker allow NAME KEYFILE; it keeps trying, at most every %.0f s)", key, detail,
                      REFUSED_KEY_MAX_S)


def _decoded(report: OwedReport) -> Any:
    return codec.decode([codec.HEADER, report.body])


def _lease_of(report: Any) -> LeaseFacts:
    return LeaseFacts(report.offer_id, report.lease_generation, report.lease_token, report.session_id,
                      report.session_generation)
