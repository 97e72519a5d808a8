"""The worker side's transport: one CURVE DEALER per control replica, one replica per request, failover.

Every request a worker sends is safe to repeat (SEMANTICS.md §9), so the rule is short and exact:

- A request goes to the current replica only.
- An answer names the request it answers (`answer_to`, protocol 4) and retires exactly that
  request, whichever replica sent it (a late answer is still an answer). A frame that names no
  request (Nudge, StopRequested), one that does not decode, and a refusal of an unreadable frame
  answer nothing: they retire no request and postpone no failover.
- When the oldest unanswered request has waited `request_timeout_s`, the link fails over: the
  next replica (in the configured order, wrapping) becomes current and every unanswered request
  is sent there again, in order, and waits `request_timeout_s` anew.
- A request the current replica's socket will not take (no handshake completed: IMMEDIATE)
  fails over at once, at most once around the ring; when no replica takes it, it stays
  unanswered and the whole ring is tried again `UNREACHABLE_RETRY_S` later (or after
  `request_timeout_s`, if shorter), so a worker that starts before its replicas are reachable
  registers as soon as one is; a later request the current socket takes carries those earlier
  ones with it, in order.

`Failover` holds that rule without any socket (its clock is passed in); `ReplicaLinks` does the
I/O, and watches each socket's monitor to log connections, disconnections and a replica that
refuses this worker's key. Both belong to the bridge thread; `current()` and `connected()` may
be read from any thread.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

from ..errors import BadInput
from . import curve, endpoints

log = logging.getLogger("qlactors.links")

# Unanswered requests kept for re-sending; past it the oldest is dropped (and logged): the
# actors repeat what matters on their own cadence (heartbeats, pulls, receipts).
MAX_UNANSWERED = 1024
# How soon the ring is tried again when no replica's socket has a connection up.
UNREACHABLE_RETRY_S = 0.25
_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
           | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)

Frames = list[bytes]


class Failover:
    """Which replica is current, which requests no replica has answered, and when to move on."""

    def __init__(self, replicas: int, timeout_s: float, *, limit: int = MAX_UNANSWERED) -> None:
        if replicas < 1:
            raise BadInput("a worker needs at least one control endpoint")
        if not timeout_s > 0:
            raise BadInput(f"request_timeout_s must be positive, got {timeout_s}")
        self.replicas = replicas
        self.timeout_s = timeout_s
        self.limit = limit
        self.current = 0
        # request id -> (its frames as last sent, when it was sent to the current replica)
        self.unanswered: OrderedDict[str, tuple[Frames, float]] = OrderedDict()
        self.deadline: float | None = None  # when the oldest unanswered request times out
        self.unsent = False  # no replica took the unanswered requests yet (see `unreachable`)
        self.dropped = 0  # requests dropped past `limit`, for logs and tests

    def sent(self, request_id: str, frames: Frames, now: float) -> None:
        """A request left (or was meant to leave) for the current replica at `now`.

        A copy of a request still unanswered (the same id) replaces its frames and keeps its
        place and its clock: repeating a request never postpones the failover it is owed.
        """
        held = self.unanswered.get(request_id)
        self.unanswered[request_id] = (frames, now if held is None else held[1])
        if held is None and len(self.unanswered) > self.limit:
            self.unanswered.popitem(last=False)
            self.dropped += 1
        self._reset_deadline()

    def answered(self, request_id: str) -> bool:
        """An answer naming `request_id` came (from any replica); True when it was unanswered."""
        if not request_id or self.unanswered.pop(request_id, None) is None:
            return False
        self._reset_deadline()
        return True

    def pending(self) -> list[Frames]:
        return [frames for frames, _at in self.unanswered.values()]

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    def rotate(self, now: float) -> list[Frames]:
        """Make the next replica current; the requests to send it again, oldest first."""
        self.current = (self.current + 1) % self.replicas
        self._restart_clocks(now)
        return self.pending()

    def unreachable(self, now: float) -> None:
        """No replica took the unanswered requests: try the ring again soon."""
        if self.unanswered:
            self.unsent = True
            self.deadline = now + min(self.timeout_s, UNREACHABLE_RETRY_S)

    def delivered(self, now: float) -> None:
        """Every unanswered request went out to the current replica at `now`: it has the full timeout."""
        self.unsent = False
        self._restart_clocks(now)

    def _restart_clocks(self, now: float) -> None:
        for request_id, (frames, _at) in self.unanswered.items():
            self.unanswered[request_id] = (frames, now)
        self._reset_deadline()

    def _reset_deadline(self) -> None:
        if self.unsent and self.unanswered:
            return  # `unreachable` set the ring's retry time
        oldest = next(iter(self.unanswered.values()), None)
        self.deadline = None if oldest is None else oldest[1] + self.timeout_s


class ReplicaLinks:
    """One DEALER per replica endpoint, opened and used by the bridge thread (`Bridge(control_links=)`)."""

    def __init__(self, ctx: zmq.Context, endpoints_: list[str], *, server_public: bytes, public: bytes,
                 secret: bytes, request_timeout_s: float, heartbeat_ms: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ctx = ctx
        self.endpoints = [endpoints.connectable(endpoints.parse_endpoint(e)) for e in endpoints_]
        if not self.endpoints:
            raise BadInput("a worker needs at least one control endpoint")
        self._security = curve.client_socket_options(public, secret, server_public)
        self._heartbeat = endpoints.ZmtpHeartbeat.every(heartbeat_ms)
        self._failover = Failover(len(self.endpoints), request_timeout_s)
        self._clock = clock
        self._sockets: list[zmq.Socket] = []
        self._monitors: list[zmq.Socket] = []
        self._connected: frozenset[str] = frozenset()  # replaced whole: readers need no lock
        self._unreachable_logged = False

    # -- any thread -----------------------------------------------------------------------------

    def current(self) -> str:
        """The endpoint requests go to now (for status and logs)."""
        return self.endpoints[self._failover.current].text

    def connected(self) -> frozenset[str]:
        """The endpoints whose CURVE handshake completed and whose connection is up now."""
        return self._connected

    # -- bridge thread --------------------------------------------------------------------------

    def open(self) -> tuple[list[zmq.Socket], list[zmq.Socket]]:
        """Create and connect one socket per replica; the bridge polls both lists it returns.

        The first list carries the replicas' frames (decoded, then `answered`); the second their
        sockets' monitors (`on_monitor`).
        """
        try:
            for endpoint in self.endpoints:
                sock = self.ctx.socket(zmq.DEALER)
                self._sockets.append(sock)
                endpoints.client_dealer(sock, endpoint, heartbeat=self._heartbeat, security=self._security)
                monitor = sock.get_monitor_socket(_EVENTS)
                monitor.setsockopt(zmq.LINGER, 0)
                self._monitors.append(monitor)
                sock.connect(endpoint.text)
        except BaseException:
            self.close()
            raise
        return list(self._sockets), list(self._monitors)

    def close(self) -> None:
        for sock, monitor in zip(self._sockets, self._monitors):
            sock.disable_monitor()
            monitor.close(0)
        for sock in self._sockets:
            sock.close(0)
        self._sockets, self._monitors = [], []
        self._connected = frozenset()

    def send(self, request_id: str, frames: Frames) -> None:
        """Send a request to the current replica (failing over at once if its socket refuses it)."""
        now = self._clock()
        self._failover.sent(request_id, frames, now)
        if self._failover.dropped:
            log.warning("event=link_unanswered_dropped count=%d (oldest unanswered requests dropped; "
                        "the actors repeat what matters)", self._failover.dropped)
            self._failover.dropped = 0
        unsent = self._failover.unsent  # earlier requests no replica took go out first
        if not self._try_send(self._failover.pending() if unsent else [frames]):
            self._fail_over("not connected")
        elif unsent:
            self._failover.delivered(now)

    def answered(self, request_id: str) -> bool:
        """An answer naming `request_id` came from a replica: that request is retired."""
        return self._failover.answered(request_id)

    def due(self) -> float | None:
        """When (clock time) the oldest unanswered request times out; None when all are answered."""
        return self._failover.deadline

    def expire(self) -> None:
        """Fail over when the oldest unanswered request has waited `request_timeout_s`."""
        if self._failover.expired(self._clock()):
            self._fail_over("no answer in time")

    def on_monitor(self, monitor: zmq.Socket) -> None:
        """Read a link's monitor events: keep `connected()` true, log what an operator must see."""
        endpoint = self.endpoints[self._monitors.index(monitor)].text
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)["event"]
            except zmq.Again:
                return
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._connected = self._connected | {endpoint}
                log.info("event=link_connected endpoint=%s", endpoint)
            elif event == zmq.EVENT_DISCONNECTED:
                if endpoint in self._connected:
                    log.warning("event=link_disconnected endpoint=%s", endpoint)
                self._connected = self._connected - {endpoint}
            elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                log.error("event=link_refused endpoint=%s reason=the replica does not accept this worker's "
                          "key (put it on the allow-list: qlactors worker allow NAME KEYFILE)", endpoint)
            else:
                log.error("event=link_handshake_failed endpoint=%s event=%s (is server_key the replicas' "
                          "public key, and is the replica's authenticator running?)", endpoint, event)

    def _fail_over(self, why: str) -> None:
        """Move to the next replica that takes the unanswered requests, at most once around the ring."""
        failed = self.current()
        for _ in range(len(self.endpoints)):
            frames = self._failover.rotate(self._clock())
            if self._try_send(frames):
                self._failover.delivered(self._clock())
                log.warning("event=link_failover from=%s to=%s reason=%s resend=%d",
                            failed, self.current(), why.replace(" ", "_"), len(frames))
                self._unreachable_logged = False
                return
        self._failover.unreachable(self._clock())
        if not self._unreachable_logged:  # once per outage, not once per retry
            log.warning("event=link_unreachable endpoints=%s waiting=%d (no replica has a connection up; "
                        "retrying)", ",".join(e.text for e in self.endpoints), len(self._failover.unanswered))
            self._unreachable_logged = True

    def _try_send(self, batch: list[Frames]) -> bool:
        sock = self._sockets[self._failover.current]
        try:
            for frames in batch:
                sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True
