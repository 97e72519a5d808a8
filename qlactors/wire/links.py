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

A replica that refuses this worker's key at the CURVE handshake (not yet, or no longer, on the
allow-list) makes libzmq give the connection up for good: no reconnect follows. The link
connects that endpoint again itself, 1 s after the refusal, doubling to 30 s while it is
refused, so a later `worker allow` takes effect without a restart; the first handshake that
succeeds after a refusal is logged once (`event=link_accepted_after_refusal`). Refusals and
other handshake failures (a wrong `server_key`: libzmq retries those itself, ten times a second)
are logged once per endpoint, then at most every 5 minutes with a count.
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
from .pacing import Backoff, LogLimit

log = logging.getLogger("qlactors.links")

# Unanswered requests kept for re-sending; past it the oldest is dropped (and logged): the
# actors repeat what matters on their own cadence (heartbeats, pulls, receipts).
MAX_UNANSWERED = 1024
# How soon the ring is tried again when no replica's socket has a connection up.
UNREACHABLE_RETRY_S = 0.25
# A replica that refused this worker's key is connected again this long after, doubling up to the cap.
REFUSED_RECONNECT_FIRST_S = 1.0
REFUSED_RECONNECT_MAX_S = 30.0
HANDSHAKE_LOG_S = 60.0  # a failed handshake is logged once per endpoint, then at most this often
HANDSHAKE_FAILURES_MAX = 10  # failed handshakes in a row (not refusals of the key) before giving up
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
                 clock: Callable[[], float] = time.monotonic,
                 handshake_failures_max: int = HANDSHAKE_FAILURES_MAX) -> None:
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
        self._public_text = public.decode("ascii")  # named in a refusal: the replica logs the same key
        # endpoint index -> its backoff while the replica refuses this worker's key, and when
        # (clock time) to connect it again (`_reconnect_due`)
        self._refused: dict[int, Backoff] = {}
        self._reconnect_at: dict[int, float] = {}
        self._handshake_log = LogLimit(HANDSHAKE_LOG_S)
        # Handshakes failed in a row for a reason that will not fix itself (a wrong server_key, a
        # protocol mismatch: not a key the replica does not accept yet). At the bound, with no
        # replica connected, `on_give_up` (the worker's fatal stop: exit 1, so an init system shows
        # it failed); one replica frozen past the handshake interval while another serves is not it.
        self._failed_in_a_row = 0
        self._gave_up = False
        self._handshake_failures_max = handshake_failures_max
        self.on_give_up: Callable[[str], None] = lambda _why: None

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
        """When (clock time) the link must act next: the oldest unanswered request times out, or a
        refused endpoint is connected again; None when nothing waits."""
        times = [t for t in (self._failover.deadline, *self._reconnect_at.values()) if t is not None]
        return min(times, default=None)

    def expire(self) -> None:
        """Connect again the refused endpoints whose backoff is over; fail over when the oldest
        unanswered request has waited `request_timeout_s`."""
        now = self._clock()
        for index in [i for i, at in self._reconnect_at.items() if now >= at]:
            del self._reconnect_at[index]
            self._reconnect(index)
        if self._failover.expired(now):
            self._fail_over("no answer in time")

    def _reconnect(self, index: int) -> None:
        """libzmq never reconnects after a refused handshake: disconnect and connect again."""
        if index >= len(self._sockets):
            return  # closed meanwhile
        sock, endpoint = self._sockets[index], self.endpoints[index].text
        try:
            sock.disconnect(endpoint)
        except zmq.ZMQError:
            pass  # nothing left to disconnect: the refused connection is gone already
        sock.connect(endpoint)

    def on_monitor(self, monitor: zmq.Socket) -> None:
        """Read a link's monitor events: keep `connected()` true, log what an operator must see."""
        index = self._monitors.index(monitor)
        endpoint = self.endpoints[index].text
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)["event"]
            except zmq.Again:
                return
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._failed_in_a_row = 0
                self._connected = self._connected | {endpoint}
                log.info("event=link_connected endpoint=%s", endpoint)
                refused = self._refused.pop(index, None)
                self._reconnect_at.pop(index, None)
                self._handshake_log.forget(endpoint)
                if refused is not None:
                    log.info("event=link_accepted_after_refusal endpoint=%s key=%s tries=%d (the replica "
                                "accepts this worker's key now)", endpoint, self._public_text, refused.tries)
            elif event == zmq.EVENT_DISCONNECTED:
                if endpoint in self._connected:
                    log.warning("event=link_disconnected endpoint=%s", endpoint)
                self._connected = self._connected - {endpoint}
            elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self._on_refused(index, endpoint)
            else:
                self._handshake_failed(endpoint, event)

    def _handshake_failed(self, endpoint: str, event: int) -> None:
        """A handshake that failed for a reason that will not fix itself: logged (once, then at most
        once a minute per endpoint), and counted; at the bound the worker gives up."""
        self._failed_in_a_row += 1
        unlogged = self._handshake_log.admit(endpoint, self._clock())
        if unlogged is not None:
            log.error("event=link_handshake_failed endpoint=%s event=%s unlogged_since=%d in_a_row=%d of=%d (is "
                      "server_key the replicas' public key, and is the replica's authenticator running? logged "
                      "at most every %.0f s; the worker stops at %d in a row)", endpoint, _event_name(event),
                      unlogged, self._failed_in_a_row, self._handshake_failures_max, HANDSHAKE_LOG_S,
                      self._handshake_failures_max)
        if self._failed_in_a_row >= self._handshake_failures_max and not self._connected and not self._gave_up:
            self._gave_up = True
            self.on_give_up(f"{self._failed_in_a_row} CURVE handshakes in a row failed ({_event_name(event)}, "
                            f"last with {endpoint}): is server_key the replicas' public key, and do they "
                            "speak this worker's protocol?")

    def _on_refused(self, index: int, endpoint: str) -> None:
        """The replica refused this worker's key: connect it again after the backoff (libzmq will not)."""
        backoff = self._refused.setdefault(index, Backoff(REFUSED_RECONNECT_FIRST_S, REFUSED_RECONNECT_MAX_S))
        delay = backoff.next()
        self._reconnect_at[index] = self._clock() + delay
        unlogged = self._handshake_log.admit(endpoint, self._clock())
        if unlogged is not None:
            log.error("event=link_refused endpoint=%s key=%s unlogged_since=%d reason=the replica does not "
                      "accept this worker's key (put it on the allow-list: qlactors worker allow NAME "
                      "KEYFILE; tried again in %.0f s, then up to every %.0f s)", endpoint, self._public_text,
                      unlogged, delay, REFUSED_RECONNECT_MAX_S)

    def _fail_over(self, why: str) -> None:
        """Move to the next replica that takes the unanswered requests, at most once around the ring."""
        failed = self.current()
        for _ in range(len(self.endpoints)):
            frames = self._failover.rotate(self._clock())
            if self._try_send(frames):
                self._failover.delivered(self._clock())
                if self.current() == failed:  # around the ring: no other replica took them
                    log.warning("event=link_resent endpoint=%s reason=%s resend=%d (no other replica took them)",
                                failed, why.replace(" ", "_"), len(frames))
                else:
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


def _event_name(event: int) -> str:
    """A monitor event's name (`EVENT_HANDSHAKE_FAILED_NO_DETAIL`), not its number."""
    try:
        return f"EVENT_{zmq.Event(event).name}"
    except ValueError:
        return str(event)
