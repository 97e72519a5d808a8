"""Helpers for transport tests on real tcp sockets on 127.0.0.1 with real CURVE keys.

`Collected` is a bridge Target that queues what it is told; `CurveClient` is a worker-like
DEALER with a monitor (so a test waits for the handshake's outcome instead of sleeping);
`Replica` is a bare CURVE ROUTER standing in for a control replica in failover tests.
"""

from __future__ import annotations

import queue
import random
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from qlactors.wire import codec
from qlactors.wire.curve import client_socket_options, server_socket_options
from qlactors.wire.messages import Heartbeat
from qlactors.ids import new_id

WAIT_S = 10.0  # the longest a liveness expectation waits (it normally holds in milliseconds)
QUIET_S = 0.5  # how long "nothing arrives" is watched for, after a positive event proved the path


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A tcp port nobody listens on right now, below the kernel's ephemeral range: the kernel's own
    pick (port 0) comes from that range, where any outgoing connection (a PostgreSQL client, a
    ZeroMQ connect) may take it before the process it is meant for binds it."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(500):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free tcp port below the ephemeral range")


def tcp_endpoint() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


@dataclass(frozen=True)
class KeyPair:
    public: bytes
    secret: bytes

    @classmethod
    def new(cls) -> KeyPair:
        return cls(*zmq.curve_keypair())

    @property
    def text(self) -> str:
        return self.public.decode("ascii")


def heartbeat(worker_id: str = "w1", free_slots: int = 1) -> Heartbeat:
    return Heartbeat(request_id="heartbeat-1", worker_id=worker_id, session_id="s1", session_generation=1, seq=1, free_slots=free_slots,
                     worker_clock_ms=0, renewals=[])


class Collected:
    """A Target: every message told to it, in order, waitable."""

    def __init__(self) -> None:
        self.items: queue.Queue[Any] = queue.Queue()

    def tell(self, message: Any) -> None:
        self.items.put(message)

    def get(self, timeout: float = WAIT_S) -> Any:
        try:
            return self.items.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"nothing was delivered within {timeout} s") from None

    def nothing(self, quiet: float = QUIET_S) -> bool:
        try:
            extra = self.items.get(timeout=quiet)
        except queue.Empty:
            return True
        raise AssertionError(f"unexpected delivery: {extra!r}")


class Monitored:
    """A socket's monitor events, waitable by kind."""

    def __init__(self, sock: zmq.Socket) -> None:
        self.monitor = sock.get_monitor_socket()
        self.seen: list[int] = []

    def wait_for(self, *events: int, timeout: float = WAIT_S) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.monitor.poll(50):
                event = recv_monitor_message(self.monitor)["event"]
                self.seen.append(event)
                if event in events:
                    return event
        raise AssertionError(f"none of {events} within {timeout} s; saw {self.seen}")

    def close(self) -> None:
        self.monitor.close(0)


class CurveClient:
    """A worker's DEALER with its own key pair, on its own context (as on another host)."""

    def __init__(self, endpoint: str, keys: KeyPair, server_public: bytes, *, handshake_ms: int = 0) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if handshake_ms:  # give up on a handshake that stalls (libzmq's default waits 30 s)
            self.sock.setsockopt(zmq.HANDSHAKE_IVL, handshake_ms)
        for option, value in client_socket_options(keys.public, keys.secret, server_public):
            self.sock.setsockopt(option, value)
        self.events = Monitored(self.sock)
        self.sock.connect(endpoint)

    def handshake(self) -> int:
        """Wait for the CURVE handshake's outcome: HANDSHAKE_SUCCEEDED or HANDSHAKE_FAILED_AUTH."""
        return self.events.wait_for(zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_HANDSHAKE_FAILED_AUTH)

    def send(self, message: Any) -> bool:
        """Queue `message` without blocking; False when the socket has no connection to queue it on."""
        try:
            self.sock.send_multipart(codec.encode(message), zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def receive(self, timeout: float = WAIT_S) -> Any:
        if not self.sock.poll(int(timeout * 1000)):
            raise AssertionError(f"the client got no answer within {timeout} s")
        return codec.decode(self.sock.recv_multipart())

    def close(self) -> None:
        self.events.close()
        self.sock.close(0)
        self.ctx.term()


class Replica:
    """A bare CURVE server ROUTER on `ctx` (whose authenticator the test started): records requests."""

    def __init__(self, ctx: zmq.Context, endpoint: str, server: KeyPair) -> None:
        self.endpoint = endpoint
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        for option, value in server_socket_options(server.secret):
            self.sock.setsockopt(option, value)
        self.events = Monitored(self.sock)
        self.sock.bind(endpoint)

    def receive(self, timeout: float = WAIT_S) -> tuple[bytes, Any]:
        """(peer identity, decoded message) of the next request."""
        if not self.sock.poll(int(timeout * 1000)):
            raise AssertionError(f"{self.endpoint} got no request within {timeout} s")
        peer, *frames = self.sock.recv_multipart()
        return peer, codec.decode(frames)

    def answer(self, peer: bytes, message: Any) -> None:
        self.sock.send_multipart([peer, *codec.encode(message)])

    def close(self) -> None:
        self.events.close()
        self.sock.close(0)
