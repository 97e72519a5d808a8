"""Shared: the actor base every actor extends: dispatch by message type, failure reporting,
redelivery after a database outage."""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any, Callable, ClassVar

import pykka

from ..errors import StoreUnavailable
from ..wire.bridge import Inbound, Outbox
from .context import Named, SharedContext
from .outage import retry_delay_s
from .signals import ActorFailed, Redeliver


log = logging.getLogger("qlactors.actors")
# Timer keys of redeliveries: unique across restarts, so a new instance never replaces a
# redelivery its predecessor scheduled (it reaches the new instance by name).
_REDELIVERIES = itertools.count()


class RuntimeActor(pykka.ThreadingActor):
    """Base: `handlers()` maps message types to methods; failures reach the Supervisor.

    A handler that meets an unavailable database (`StoreUnavailable`: its transaction changed
    nothing) is not a failure: the message is handled again after a backoff, its answer withheld
    until then (a peer waiting for one repeats its report anyway). Handlers are written so that
    everything before their first store call can be done twice. A message still failing after
    `store_outage_stop_ms` fails the actor (the Supervisor's restart and escalation take over).
    """

    name: ClassVar[str] = "actor"
    uses_outbox: ClassVar[bool] = False
    never_redelivered: ClassVar[tuple[type, ...]] = ()  # asked, not told: the asker gets the error

    def __init__(self, ctx: SharedContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.out: Outbox | None = None
        self._table: dict[type, Callable[[Any, bytes], Any]] = {}

    def handlers(self) -> dict[type, Callable[[Any, bytes], Any]]:
        return {}

    def on_start(self) -> None:
        # pykka runs on_start in the actor's own thread: the socket belongs to this thread.
        # Take the name first, so an answer to anything `started()` sends finds this actor.
        self.ctx.directory.set(self.name, self.actor_ref)
        self._table = self.handlers()
        if self.uses_outbox:
            self.out = Outbox(self.ctx.zmq, self.ctx.bridge.outbox_endpoint)
        self.started()

    def started(self) -> None:
        """Hook for subclasses, run in the actor's thread after the outbox exists."""

    @property
    def me(self) -> Named:
        """This actor by name: the target for bridge timers and watches, which must reach a
        restarted instance (a raw ref of a dead one only raises ActorDeadError)."""
        return self.ctx.directory.named(self.name)

    def on_receive(self, message: Any) -> Any:
        tries, since = 0, None
        if isinstance(message, Redeliver):
            message, tries, since = message.message, message.tries, message.since
        original, peer = message, b""
        if isinstance(message, Inbound):
            peer, message = message.peer, message.message
        handler = self._table.get(type(message))
        if handler is None:
            log.warning("event=unhandled actor=%s message=%s", self.name, type(message).__name__)
            return None
        try:
            return handler(message, peer)
        except StoreUnavailable as err:
            if isinstance(message, self.never_redelivered):
                raise
            now = time.monotonic()
            since = now if since is None else since
            # Other transactions may succeed meanwhile (each ends the outage, so the runtime's
            # stop never comes): one message failing this long fails the actor instead, and the
            # Supervisor restarts it, or stops the runtime if it keeps failing. An outage that has
            # lasted as long is left to its own stop (the runtime is stopping already).
            limit_s = self.ctx.config.runtime.store_outage_stop_ms / 1000
            outage = self.ctx.health.outage()
            if now - since > limit_s and (outage is None or outage.seconds < limit_s):
                log.error("event=store_retries_exhausted actor=%s message=%s tries=%d seconds=%.1f",
                          self.name, self._kind(original), tries, now - since)
                raise
            self._redeliver(original, tries + 1, err, since)
            return None

    @staticmethod
    def _kind(message: Any) -> str:
        return getattr(getattr(message, "message", message), "KIND", type(message).__name__)

    def _redeliver(self, message: Any, tries: int, err: StoreUnavailable, since: float) -> None:
        delay = retry_delay_s(tries)
        log.warning("event=store_retry actor=%s message=%s try=%d in_s=%.2f error=%s", self.name,
                    self._kind(message), tries, delay, err)
        self.ctx.bridge.call_at(f"redeliver:{self.name}:{next(_REDELIVERIES)}",
                                time.monotonic() + delay, self.me, Redeliver(message, tries, since))

    def on_failure(self, exception_type, exception_value, traceback) -> None:
        # pykka does not call on_stop after on_failure: close here too (STYLE.md traps).
        log.error("event=actor_failed actor=%s error=%r", self.name, exception_value)
        self._close()
        self.ctx.directory.tell("supervisor", ActorFailed(self.name, repr(exception_value)))

    def on_stop(self) -> None:
        self._close()

    def _close(self) -> None:
        if self.out is not None:
            self.out.close()
            self.out = None
