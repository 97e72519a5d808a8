"""Executor side: asking for work — one Pull for every free slot, the Pull waiting for its answer
(repeated unchanged when its answer went astray), and the pairs of the Pulls answered lately, with
which an Offers answer that comes again or late is declined at once instead of left to expire.

A part the Executor holds (executor/executor.py); the Offers answer itself is taken there.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import Any, Callable

from ..ids import new_id
from ..wire import messages as m
from .disk_reserve import DiskReserve
from .session_policy import CurrentSession
from .slots import Slots

log = logging.getLogger("qlactors.executor")


class Pulling:
    """The Pull of an Executor (see the module docstring)."""

    def __init__(self, *, current: CurrentSession, slots: Slots, send: Callable[[Any], None],
                 admitting: threading.Event, disk_reserve: DiskReserve | None) -> None:
        self.current, self.slots, self.send = current, slots, send
        self.admitting, self.disk_reserve = admitting, disk_reserve
        # The Pull waiting for its answer: its id and its (offer id -> lease token) pairs.
        self.pending: tuple[str, dict[str, str]] | None = None
        self.message: m.Pull | None = None  # the waiting Pull as sent, to repeat it unchanged
        self.sent_at = 0.0  # monotonic
        # The pairs of the last answered Pulls (offer id -> lease token): an Offers answer that
        # comes again or late is declined at once with them, never left to expire.
        self.answered_pairs: dict[str, str] = {}

    def pull(self) -> None:
        """One Pull for every free slot: a pair (offer id, lease token) per slot."""
        s = self.current.welcome
        if s is None or self.pending is not None or self.slots.free() <= 0:
            return
        if not self.admitting.is_set():
            return
        reserve = self.disk_reserve  # a worker's own disk (edge: the Gateway's check)
        if reserve is not None and not reserve.has_room():
            return  # the next heartbeat or nudge checks again
        pairs = {new_id(): secrets.token_urlsafe(32) for _ in range(self.slots.free())}
        pull_id = new_id()
        self.current.policy.pull_sent(pull_id, pairs)
        self.pending = (pull_id, pairs)
        self.message = m.Pull(
            request_id=pull_id, worker_id=self.current.worker_id, session_id=s.session_id,
            session_generation=s.session_generation, pull_id=pull_id,
            offers=[m.OfferSlot(offer_id=o, lease_token=t) for o, t in pairs.items()])
        self.sent_at = time.monotonic()
        self.send(self.message)

    def waits_for(self, msg: m.Offers) -> bool:
        """Whether `msg` answers the Pull waiting now."""
        return bool(self.pending) and self.pending[0] == msg.pull_id and msg.answer_to == msg.pull_id

    def pairs(self) -> dict[str, str]:
        """The waiting Pull's pairs (offer id -> lease token)."""
        return self.pending[1]

    def answered(self, msg: m.Offers) -> None:
        """Its offers are journalled: the Pull waits no more; its pairs decline a late copy."""
        pairs = self.pending[1]
        self.current.policy.pull_answered(msg.pull_id)
        self.answered_pairs = dict(list(self.answered_pairs.items())[-4 * self.slots.capacity:] + list(pairs.items()))
        self.pending = self.message = None

    def answered_pair(self, offer_id: str) -> str | None:
        return self.answered_pairs.get(offer_id)

    def learn(self, pairs: dict[str, str]) -> None:
        """Pairs of stale journalled Pulls: a late Offers answer to one of them is declined."""
        self.answered_pairs.update(pairs)

    def forget(self) -> None:
        """The session ended: its pairs were the old session's (a late answer is declined with them)."""
        if self.pending is not None:
            self.answered_pairs.update(self.pending[1])
        self.pending = self.message = None

    def drop(self) -> None:
        """The waiting Pull's answer was taken by the drain."""
        self.pending = self.message = None

    def repeat(self, heartbeat_ms: int) -> None:
        """A Pull unanswered for a heartbeat interval went astray (an answer lost on the way, a
        replica gone): send it again, the same pairs, which get the same offers and no second
        lease."""
        if self.message is None or self.pending is None:
            return
        if time.monotonic() - self.sent_at < heartbeat_ms / 1000:
            return
        log.warning("event=pull_repeated pull=%s pairs=%d", self.message.pull_id, len(self.message.offers))
        self.sent_at = time.monotonic()
        self.send(self.message)
