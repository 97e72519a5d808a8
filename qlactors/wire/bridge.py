"""Wire: the bridge, the one thread per process that owns the ZeroMQ sockets, the timers and the
pidfd watches.

Size: one poll loop, its routes and its timers read together (the loop is the only writer of them).

Actors never touch a shared socket. They send through their own inproc PUSH (`Outbox`) into the
bridge's outbox; the bridge forwards to the control ROUTER (control side) or the executor DEALER
(executor side), decodes every inbound frame strictly, and `tell`s the actor that owns the
message kind. Timers and process-exit watches live here too, so the whole runtime has one poll
loop and no timer thread of its own (SEMANTICS.md §10).

On a cluster the control side's ROUTER binds tcp with CurveZMQ (`curve=`): every frame's
authenticated `User-Id` is mapped through the allow-list cache on every message, and a bridge
whose authenticator is not running refuses to serve. The worker side reaches its replicas
through `control_links=` (links.py: one socket per replica, failover) instead of one DEALER.
Socket options come from endpoints.py, per socket role.

Targets are names (`Directory.named`), never raw actor refs: an actor the Supervisor restarted
is reached under its name, and one that is down only costs a log line. Every delivery is
guarded, and any end of the loop other than `close()` calls `on_exit` (the runtime's Fatal), so
the runtime never goes on without its sockets, timers and watches.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import zmq

from ..domain.results import Result
from ..errors import BadInput, QlactorsError
from ..faults import raise_point
from . import codec, endpoints
from .curve import REFUSED_KEY, AuthenticatorDown, CurveServer, server_socket_options, wrong_worker_claim
from .links import ReplicaLinks
from .messages import Ack
from .pacing import LogLimit
from .peer_failures import PeerFailures
from .timers import Timers

log = logging.getLogger("qlactors.bridge")

ROUTE_CONTROL = b"c"  # executor side -> control side
ROUTE_PEER = b"p"  # control side -> one executor peer (next frames: its worker id or b"", its ROUTER identity)
ROUTE_WAKE = b"w"  # only wakes the poll loop
IDLE_POLL_MS = 60_000
REFUSED_LOG_S = 60.0  # a refused key's frames are logged once per key per this long, with a count


class Target(Protocol):
    def tell(self, message: Any) -> None: ...


@dataclass(frozen=True, slots=True)
class Inbound:
    """A decoded wire message and the peer it came from (ROUTER identity; b"" on the executor side).

    `worker_id` is the worker the frame's authenticated CURVE key is bound to (allow-list), on a
    CurveZMQ control side; None on inproc (edge) and on the executor side.
    """

    peer: bytes
    message: Any
    worker_id: str | None = None


@dataclass(frozen=True, slots=True)
class ProcessExited:
    """A watched pidfd became readable: the process `key` names has ended."""

    key: str


class Bridge(threading.Thread):
    """Owns the sockets; routes, decodes, times and watches. Start it, `ready()`, then `close()`.

    Control side: `control_bind` (inproc on edge; tcp needs `curve`). Executor side:
    `control_connect` (one DEALER, inproc on edge) or `control_links` (a worker's replicas).
    `heartbeat_ms` is the ZMTP heartbeat interval of a tcp ROUTER.
    """

    def __init__(self, ctx: zmq.Context, *, control_bind: str | None = None,
                 control_connect: str | None = None, nudge_bind: str | None = None,
                 curve: CurveServer | None = None, control_links: ReplicaLinks | None = None,
                 heartbeat_ms: int = endpoints.DEFAULT_HEARTBEAT_MS) -> None:
        super().__init__(name="qlactors-bridge", daemon=True)
        self.ctx = ctx
        self.outbox_endpoint = f"inproc://qlactors-outbox-{id(self):x}"
        self._control_bind = None if control_bind is None else endpoints.parse_endpoint(control_bind)
        self._control_connect = None if control_connect is None else endpoints.parse_endpoint(control_connect)
        if self._control_connect is not None and control_links is not None:
            raise BadInput("a bridge connects either one control endpoint or replica links, not both")
        if self._control_bind is not None and self._control_bind.transport == "tcp" and curve is None:
            raise BadInput(f"control_bind {control_bind}: tcp is served with CurveZMQ only (pass curve=)")
        if self._control_connect is not None and self._control_connect.transport == "tcp":
            raise BadInput(f"control_connect {control_connect}: tcp replicas are reached through "
                           "control_links (CurveZMQ, one socket per replica)")
        self._curve = curve
        self._links = control_links
        self._heartbeat = endpoints.ZmtpHeartbeat.every(heartbeat_ms)
        self._nudge_bind = nudge_bind
        self._control_target: Target | None = None  # who gets executor reports (Supervisor)
        self._executor_targets: dict[str, Target] = {}  # kind -> actor on the executor side
        self._nudge_target: Target | None = None
        self._lock = threading.Lock()  # guards the watches
        self._timers = Timers()
        self._watches: dict[int, tuple[str, Target]] = {}
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self.rejected_frames = 0
        self._peer_failures = PeerFailures()
        self._refusals = LogLimit(REFUSED_LOG_S)  # (reason, key or worker) -> its last `frame_refused` line
        # Called (in the bridge thread) with a one-line reason when the loop ends without
        # `close()`: the edge profile trips its Fatal, which stops the runtime.
        self.on_exit: Callable[[str], None] | None = None
        # Executor side: called (in the bridge thread) with the text of a VersionMismatch from the
        # control side. Retrying cannot help a worker on another protocol version (SEMANTICS.md
        # §9 Register once): a worker profile stops with it (exit 1), so its supervisor shows why.
        self.on_version_mismatch: Callable[[str], None] | None = None

    # -- wiring (before start) --------------------------------------------------------------

    def route_control(self, target: Target) -> None:
        self._control_target = target

    def route_executor(self, kinds: list[str], target: Target) -> None:
        for kind in kinds:
            self._executor_targets[kind] = target

    def route_nudge(self, target: Target) -> None:
        self._nudge_target = target

    # -- thread-safe API for actors -----------------------------------------------------------

    def call_at(self, key: str, when: float, target: Target, message: Any) -> None:
        """Tell `target` `message` at monotonic time `when`; a later call with the same key replaces it."""
        self._timers.set(key, when, target, message)
        self._wake()

    def timer_due(self, key: str) -> float | None:
        """When the timer `key` fires (monotonic), or None when none is pending."""
        return self._timers.due(key)

    def cancel_timer(self, key: str) -> None:
        self._timers.cancel(key)

    def watch(self, fd: int, key: str, target: Target) -> None:
        """Tell `target` ProcessExited(key) once `fd` (a pidfd) becomes readable; then forget it."""
        with self._lock:
            self._watches[fd] = (key, target)
        self._wake()

    def unwatch(self, fd: int) -> None:
        with self._lock:
            self._watches.pop(fd, None)
        self._wake()

    def ready(self, timeout: float = 5.0) -> None:
        """Wait until the sockets are bound (or raise what stopped the thread)."""
        if not self._ready.wait(timeout):
            raise RuntimeError("the bridge did not start in time")
        # Said in one line (endpoints.bind); a dead authenticator is the bridge failing to start.
        if isinstance(self._failure, QlactorsError) and not isinstance(self._failure, AuthenticatorDown):
            raise self._failure
        if self._failure is not None:
            raise RuntimeError(f"the bridge failed to start: {self._failure}") from self._failure

    def close(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self._wake()
        if self.is_alive():
            self.join(timeout)
        if self._wake_fd >= 0:
            os.close(self._wake_fd)
            self._wake_fd = -1

    def _wake(self) -> None:
        try:
            os.eventfd_write(self._wake_fd, 1)
        except OSError:
            pass

    # -- the loop (bridge thread only) ------------------------------------------------------

    def run(self) -> None:
        sockets: list[zmq.Socket] = []

        def make(kind: int) -> zmq.Socket:
            sock = self.ctx.socket(kind)
            sockets.append(sock)
            return sock

        links: list[zmq.Socket] = []
        monitors: list[zmq.Socket] = []
        try:
            outbox = make(zmq.PULL)
            endpoints.local_socket(outbox)
            outbox.bind(self.outbox_endpoint)
            router = dealer = nudge = None
            if self._control_bind:
                router = make(zmq.ROUTER)
                security = ()
                if self._curve is not None:
                    self._curve.require_alive()  # before bind: never serve unauthenticated
                    security = server_socket_options(self._curve.secret_key)
                endpoints.server_router(router, self._control_bind, heartbeat=self._heartbeat, security=security)
                endpoints.bind(router, self._control_bind)
            if self._control_connect:
                dealer = make(zmq.DEALER)
                endpoints.client_dealer(dealer, self._control_connect, heartbeat=self._heartbeat)
                dealer.connect(self._control_connect.text)
            if self._links is not None:
                links, monitors = self._links.open()
            if self._nudge_bind:
                nudge = make(zmq.PULL)
                endpoints.nudge_pull(nudge)
                endpoints.bind(nudge, endpoints.parse_endpoint(self._nudge_bind))
        except BaseException as err:  # report to ready() instead of dying silently
            self._failure = err
            self._ready.set()
            for sock in sockets:
                sock.close(0)
            if self._links is not None:
                self._links.close()
            return
        self._ready.set()
        reason = "the bridge loop ended unexpectedly"
        try:
            self._loop(outbox, router, dealer, nudge, links, monitors)
        except AuthenticatorDown as err:
            reason = f"the bridge stopped serving: {err}"
        except BaseException as err:
            reason = f"the bridge thread failed: {err!r}"
            log.exception("event=bridge_failed error=%r", err)
        finally:
            for sock in sockets:
                sock.close(0)
            if self._links is not None:
                self._links.close()
            if not self._stopping.is_set():
                log.error("event=bridge_stopped reason=%s", reason)
                if self.on_exit is not None:
                    self.on_exit(f"{reason}; no socket, timer or process watch is served any more")

    def _loop(self, outbox, router, dealer, nudge, links: list[zmq.Socket], monitors: list[zmq.Socket]) -> None:
        poller = zmq.Poller()
        for sock in (outbox, router, dealer, nudge, *links, *monitors):
            if sock is not None:
                poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_fd, zmq.POLLIN)
        watched: set[int] = set()
        while not self._stopping.is_set():
            with self._lock:
                current = set(self._watches)
            for fd in current - watched:
                poller.register(fd, zmq.POLLIN)
            for fd in watched - current:
                poller.unregister(fd)
            watched = current
            # A pidfd closed between the snapshot and the poll comes back as POLLERR, not an
            # error: its watch is gone already, or it is answered like an exit.
            events = dict(poller.poll(self._poll_timeout_ms()))
            if self._wake_fd in events:
                try:
                    os.eventfd_read(self._wake_fd)
                except BlockingIOError:
                    pass
            if outbox in events:
                self._drain(outbox, lambda frames: self._forward(frames, router, dealer))
            if router is not None and router in events:
                # copy=False: a Frame carries the ZAP User-Id (the peer's authenticated key).
                self._drain(router, lambda frames: self._from_executor(frames, router), copy=False)
            if dealer is not None and dealer in events:
                self._drain(dealer, self._from_control)
            for link in links:
                if link in events:
                    self._drain(link, self._from_control)
            for monitor in monitors:
                if monitor in events:
                    self._links.on_monitor(monitor)
            if self._links is not None:
                self._links.expire()
            if nudge is not None and nudge in events:
                raise_point("bridge_loop_on_nudge")
                self._drain(nudge, self._from_nudge)
            for fd in watched & set(events):
                with self._lock:
                    key, target = self._watches.pop(fd, (None, None))
                if target is not None:
                    self._deliver(target, ProcessExited(key))
            self._fire_timers()

    @staticmethod
    def _deliver(target: Target, message: Any) -> None:
        """Tell `target`; a failure to deliver is logged, it never ends the loop."""
        try:
            target.tell(message)
        except Exception as err:
            log.error("event=delivery_failed message=%s error=%r", type(message).__name__, err)

    def _poll_timeout_ms(self) -> int:
        when = self._timers.next_at()
        link_due = None if self._links is None else self._links.due()
        if link_due is not None and (when is None or link_due < when):
            when = link_due
        if when is None:
            return IDLE_POLL_MS
        return max(0, min(IDLE_POLL_MS, int((when - time.monotonic()) * 1000) + 1))

    def _fire_timers(self) -> None:
        for target, message in self._timers.pop_due(time.monotonic()):
            self._deliver(target, message)

    @staticmethod
    def _drain(sock: zmq.Socket, handle: Callable[[list], None], limit: int = 256, copy: bool = True) -> None:
        for _ in range(limit):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=copy)
            except zmq.Again:
                return
            try:
                handle(frames)
            except AuthenticatorDown:
                raise
            except Exception as err:  # one frame we could not route never ends the loop
                log.error("event=frame_dropped error=%r", err)

    def _forward(self, frames: list[bytes], router, dealer) -> None:
        route = frames[0] if frames else b""
        # ROUTE_CONTROL frames: [route, request id, header, body] (Outbox.to_control).
        if route == ROUTE_CONTROL and self._links is not None and len(frames) > 2:
            self._links.send(frames[1].decode("ascii", "replace"), frames[2:])
        elif route == ROUTE_CONTROL and dealer is not None and len(frames) > 2:
            dealer.send_multipart(frames[2:], zmq.NOBLOCK)
        elif route == ROUTE_PEER and router is not None and len(frames) > 3:
            try:
                router.send_multipart(frames[2:], zmq.NOBLOCK)
            except zmq.ZMQError as err:  # the peer is gone; its session will be fenced
                self._peer_failures.failed(frames[2], frames[1].decode("utf-8", "replace"), err)
        elif route != ROUTE_WAKE:
            log.error("event=outbox_unroutable route=%r", route)

    def _from_executor(self, frames: list[zmq.Frame], router) -> None:
        """A frame on the control ROUTER; with CurveZMQ the authenticator and the key are checked first."""
        peer = frames[0].bytes
        body = [frame.bytes for frame in frames[1:]]

        def refuse(ack: Ack) -> None:
            # Answer a frame we could not read with a refusal, so the peer learns why (version!).
            try:
                router.send_multipart([peer, *codec.encode(ack, codec.PROTOCOL_MIN)], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

        worker_id = None
        if self._curve is not None:
            self._curve.require_alive()
            key, worker_id = self._curve.worker_of(frames[-1])
            if worker_id is None:  # never decode for a key the allow-list does not hold (any more)
                self.rejected_frames += 1
                unlogged = self._refusals.admit(("key", key), time.monotonic())
                if unlogged is not None:
                    log.warning("event=frame_refused reason=unknown_or_revoked_key key=%s unlogged_since=%d "
                                "(logged at most every %.0f s per key)", key, unlogged, REFUSED_LOG_S)
                refuse(Ack(answer_to="", of="unknown", run_id="", attempt_id="", offer_id="",
                           result=Result.REFUSED.value, detail=REFUSED_KEY))
                return
        message = self._decode(body, reply=refuse)
        if message is None:
            return
        wrong = None if worker_id is None else wrong_worker_claim(message, worker_id)
        if wrong is not None:
            self.rejected_frames += 1
            unlogged = self._refusals.admit(("worker", worker_id), time.monotonic())
            if unlogged is not None:
                log.warning("event=frame_refused reason=wrong_worker_id worker=%s detail=%s unlogged_since=%d",
                            worker_id, wrong.detail, unlogged)
            refuse(wrong)
        elif self._control_target is not None:
            self._deliver(self._control_target, Inbound(peer, message, worker_id))

    def _from_control(self, frames: list[bytes]) -> None:
        message = self._decode(frames, reply=None)
        if message is None:
            return  # answers nothing (SEMANTICS.md §9 Exchange)
        if self._links is not None:  # an answer retires exactly the request it names
            self._links.answered(getattr(message, "answer_to", ""))
        kind = message.KIND
        if isinstance(message, Ack):
            kind = f"ack:{message.of}"
        target = self._executor_targets.get(kind) or self._executor_targets.get(message.KIND)
        if target is None:
            log.warning("event=no_route kind=%s", kind)
            return
        self._deliver(target, Inbound(b"", message))

    def _from_nudge(self, frames: list[bytes]) -> None:
        if self._nudge_target is not None:
            self._deliver(self._nudge_target, Inbound(b"", "nudge"))

    def _decode(self, frames: list[bytes], reply) -> Any | None:
        try:
            return codec.decode(frames)
        except codec.DecodeError as err:
            self.rejected_frames += 1
            log.warning("event=frame_rejected reason=%s detail=%s", err.reason, str(err)[:200])
            if reply is None and isinstance(err, codec.VersionMismatch) and self.on_version_mismatch is not None:
                self.on_version_mismatch(err.reason)
            if reply is not None:
                reply(Ack(answer_to="", of="unknown", run_id="", attempt_id="", offer_id="", result=Result.REFUSED.value,
                          detail=str(err)[:500]))
            return None


class Outbox:
    """One actor's PUSH into the bridge (create it in `on_start`, close it in `_close`)."""

    def __init__(self, ctx: zmq.Context, endpoint: str) -> None:
        self._sock = ctx.socket(zmq.PUSH)
        endpoints.local_socket(self._sock)
        self._sock.connect(endpoint)

    def to_control(self, message: Any) -> None:
        """Send a request; the bridge's links keep it by its `request_id` until an answer names it.
        Written in the range's lowest version, which every replica reads (codec.py)."""
        self._sock.send_multipart([ROUTE_CONTROL, message.request_id.encode("ascii"),
                                   *codec.encode(message, codec.PROTOCOL_MIN)])

    def to_peer(self, peer: bytes, message: Any, *, worker: str = "", protocol: int = codec.PROTOCOL_MIN) -> None:
        """Send to one executor peer, in the `protocol` agreed with it. `worker`: the worker whose
        live session that peer is (its failed send is logged naming it); "" for a peer no live
        session is known by (not logged)."""
        self._sock.send_multipart([ROUTE_PEER, worker.encode(), peer, *codec.encode(message, protocol)])

    def close(self) -> None:
        self._sock.close(0)
