"""Executor side: opening a session (SEMANTICS.md §9 Register once) — the Register at start, again
after a session ended, repeated while unanswered, and what a refusal means.

- A worker without a session re-sends the same Register (same `register_id`, so every copy and
  every replica give the same session) with backoff, 1 s doubling to its heartbeat; a key the
  replicas refuse (not yet allowed) is tried again up to every 30 s and logged once a minute, so
  a later `worker allow` takes effect without a restart; a refusal for its protocol version, or
  as a second live process presenting the same key (`duplicate_worker`), stops the worker
  (exit 1) with the refusal's text, as retrying cannot help.
- Revoked: a key refused after this worker had a session was revoked (`worker revoke`). Said
  once, as an ERROR naming how many jobs' results cannot be delivered (running, or ended with
  their receipts on disk): they go on being re-sent. Its session has ended, so recovery marks
  the runs of idempotent or deduplicated tasks lost after the recovery grace; only those of
  unknown safety wait to be delivered once the key is allowed again (or recorded lost by
  `worker retire`). Said again only after a new session.

A part the Executor holds (executor/executor.py); the Register is owed (executor/owed_reports.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any, Callable

from ..clock import wall_ms
from ..ids import new_id
from ..runtime.context import Fatal, Named
from ..runtime.signals import RegisterDue
from ..wire import codec
from ..wire import messages as m
from ..wire.bridge import Bridge
from ..wire.pacing import Backoff, LogLimit
from .journal.journal import Journal
from .owed_reports import OwedReports, decoded
from .session_policy import CurrentSession

log = logging.getLogger("qlactors.executor")

REGISTER_FIRST_S = 1.0  # the first repeat of an unanswered Register; doubles up to the heartbeat
REGISTER_MAX_S = 10.0  # the default heartbeat; the last Welcome's interval once there was one
REFUSED_KEY_MAX_S = 30.0  # a key not (yet) allowed: tried again at most this far apart
REFUSED_LOG_EVERY_S = 60.0
PROTOCOL_REFUSAL = "protocol"  # the first word of a Register refused for its protocol version
DUPLICATE_REFUSAL = "duplicate_worker"  # ... refused as a second live process presenting this key

KEY_REFUSED = "key_refused"  # the one key of `key_refused_log`


class Registration:
    """Register, its repeats and its refusals (see the module docstring)."""

    def __init__(self, *, journal: Journal, bridge: Bridge, me: Named, current: CurrentSession, owed: OwedReports,
                 send: Callable[[Any], None], fatal: Fatal, public_key: str, boot_id: Callable[[], str],
                 capacity: int, labels: list[str]) -> None:
        self.journal, self.bridge, self.me = journal, bridge, me
        self.current, self.owed, self.send, self.fatal = current, owed, send, fatal
        self.public_key, self.boot_id = public_key, boot_id
        self.capacity, self.labels = capacity, labels
        self.request: str | None = None  # the Register waited for (no session yet)
        # Its repeats: 1 s doubling to the heartbeat (REFUSED_KEY_MAX_S once refused).
        self.backoff = Backoff(REGISTER_FIRST_S, REGISTER_MAX_S)
        self.key_refused_log = LogLimit(REFUSED_LOG_EVERY_S)  # `worker_key_refused`, once a minute
        self.had_session = False  # a Welcome came since this instance started: a refused key was revoked
        self.revoked_logged = False

    def start(self) -> None:
        """Register: the Register an earlier instance sent and got no answer to, again (the same
        register id gets the same session), when it still says what this one would (same boot,
        capacity and labels: a Register from before a reboot would hide the reboot); else anew.
        A Leave an earlier instance's drain left owed is moot: that drain is over, and sent now it
        would drain the session this start resumes."""
        for owed in self.journal.owed():
            if owed.kind == m.Leave.KIND:
                self.journal.settle(owed.request_id)
            if owed.kind != m.Register.KIND:
                continue
            earlier = codec.decode([codec.HEADER, owed.body])
            if (earlier.boot_id, earlier.capacity, earlier.labels) == (self.boot_id(), self.capacity, self.labels):
                self.request = owed.request_id
                self.send(earlier)
                self._schedule()
                return
            self.journal.settle(owed.request_id)
        self.register(resume=True)

    def register(self, *, resume: bool) -> None:
        """Open a session; on a worker restarted within its session lease, resume the saved one."""
        saved = self.journal.saved_session() if resume else None
        register_id = new_id()
        message = m.Register(
            request_id=register_id, register_id=register_id, worker_id=self.current.worker_id,
            capacity=self.capacity, boot_id=self.boot_id(), labels=self.labels,
            protocol_min=codec.PROTOCOL_MIN, protocol_max=codec.PROTOCOL_MAX,
            worker_clock_ms=wall_ms(), resume_session_id=saved.session_id if saved else None,
            resume_generation=saved.generation if saved else None,
            resume_secret=saved.resume_secret if saved else None)
        self.request = message.request_id
        self.backoff.reset()
        self.owed.owe(message)
        self._schedule()

    def _schedule(self) -> float:
        delay = self.backoff.next()
        self.bridge.call_at("register", time.monotonic() + delay, self.me, RegisterDue())
        return delay

    def on_register_due(self, _msg: RegisterDue, _peer: bytes) -> None:
        if self.current.welcome is not None or self.request is None:
            return
        report = self.journal.owes(self.request)
        if report is None:
            return
        # The same request and register id, its clock now: the skew `workers` shows is measured
        # from the copy that opens the session (a key allowed minutes after the first copy).
        self.send(replace(decoded(report), worker_clock_ms=wall_ms()))
        log.info("event=register_repeated register=%s next_in_s=%.0f", self.request, self._schedule())

    def welcomed(self, msg: m.Welcome) -> bool:
        """Whether `msg` answers the Register this worker waits for (settled now)."""
        if self.request is None or msg.answer_to != self.request:
            log.warning("event=welcome_unexpected session=%s answer_to=%s", msg.session_id, msg.answer_to or "-")
            return False
        self.owed.settle(self.owed.answered(msg.answer_to))
        self.request = None
        self.backoff.cap_s = max(REGISTER_FIRST_S, msg.heartbeat_ms / 1000)
        self.key_refused_log.forget(KEY_REFUSED)
        self.had_session, self.revoked_logged = True, False
        self.bridge.cancel_timer("register")
        return True

    def refused(self, msg: m.Ack) -> None:
        """A Register refused: for its protocol version the worker stops (retrying cannot help);
        otherwise (an unknown or revoked key) it keeps trying, and says so once a minute."""
        if msg.detail.startswith(PROTOCOL_REFUSAL):
            log.error("event=register_refused reason=protocol detail=%s", msg.detail)
            self.fatal.trip(f"the control side refused this worker's protocol: {msg.detail}")
            return
        if msg.detail.startswith(DUPLICATE_REFUSAL):  # retrying would take the session from the other
            log.error("event=register_refused reason=duplicate_worker key=%s detail=%s",
                      self.public_key or "-", msg.detail)
            self.fatal.trip(f"the control side refused this worker: {msg.detail}")
            return
        self.key_refused(msg.detail)

    def key_refused(self, detail: str) -> None:
        key = self.public_key or "-"
        self.backoff.cap_s = REFUSED_KEY_MAX_S  # the Register, if any, backs off up to it
        if self.had_session:  # allowed before: revoked since
            if not self.revoked_logged:
                self.revoked_logged = True
                waiting = sum(1 for _ in self.journal.walk(("launching", "started")))
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
