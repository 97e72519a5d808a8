"""Endpoints (`inproc://`, `ipc://`, `tcp://`) and the socket options of each socket role, in one place.

Every socket the runtime opens gets its options here, by role: the server ROUTER a control side
binds, the client DEALER an executor side connects, the local PULL/PUSH pairs between actors and
the bridge, and the nudge PULL. Options that only matter on a network (ZMTP heartbeats, TCP
keepalive, `IMMEDIATE`) are applied to `tcp://` only, so edge (inproc) sockets stay as they were.
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
from dataclasses import dataclass
from typing import Iterable, Literal

import zmq

from ..errors import BadInput, QlactorsError
from .codec import MAX_FRAME_BYTES

Transport = Literal["inproc", "ipc", "tcp"]

# sun_path holds 108 bytes including the final NUL (an abstract `@name` counts the same way).
MAX_IPC_PATH_BYTES = 107
# The ZMTP heartbeat interval when the caller names none; the peer is dropped after 3 silent intervals.
DEFAULT_HEARTBEAT_MS = 5_000
# libzmq sends HEARTBEAT_TTL in deciseconds in a 16-bit field.
MAX_HEARTBEAT_TTL_MS = 6_553_500
# TCP keepalive: a dead peer that sends no FIN (a host gone, a NAT forgot us) is noticed by the
# kernel too, not only by the ZMTP heartbeat. Seconds.
TCP_KEEPALIVE_IDLE_S = 30
TCP_KEEPALIVE_INTVL_S = 10
TCP_KEEPALIVE_CNT = 3

_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
_INPROC_NAME = re.compile(r"[!-~]{1,256}")  # printable ASCII, no space


class BadEndpoint(BadInput):
    """An endpoint string qlactors does not accept; the message says which rule it broke."""


class BindFailed(QlactorsError):
    """An endpoint could not be bound (in use, not an address of this host, no permission)."""


# Who else holds an address a runtime binds, by transport: only a control replica binds tcp,
# and an ipc endpoint is a home's nudge socket.
_IN_USE_HINT = {"tcp": "another replica on this host?", "ipc": "another runtime for this home?",
                "inproc": "bound twice in this process"}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A parsed endpoint: `text` is what ZeroMQ gets; host and port are set for tcp only."""

    text: str
    transport: Transport
    address: str  # everything after "://"
    host: str | None = None  # "*" for a wildcard bind; an IPv6 address without brackets
    port: int | None = None

    @property
    def is_wildcard(self) -> bool:
        return self.host == "*"


@dataclass(frozen=True, slots=True)
class ZmtpHeartbeat:
    """libzmq's own heartbeats (ZMTP PING/PONG): they detect a dead TCP peer, not a dead worker.

    `interval_ms`: a PING after this much silence; `timeout_ms`: the connection is closed when
    nothing arrives this long after a PING; `ttl_ms`: the peer closes its side after this much
    silence from us.
    """

    interval_ms: int
    timeout_ms: int
    ttl_ms: int

    @classmethod
    def every(cls, interval_ms: int) -> ZmtpHeartbeat:
        """A PING every `interval_ms`; three silent intervals end the connection on both sides."""
        return cls(interval_ms, 3 * interval_ms, min(3 * interval_ms, MAX_HEARTBEAT_TTL_MS))

    def __post_init__(self) -> None:
        if self.interval_ms <= 0 or self.timeout_ms <= 0 or self.ttl_ms <= 0:
            raise BadEndpoint(f"ZMTP heartbeat times must be positive, got {self}")
        if self.ttl_ms > MAX_HEARTBEAT_TTL_MS:
            raise BadEndpoint(f"ZMTP heartbeat ttl_ms is at most {MAX_HEARTBEAT_TTL_MS}, got {self.ttl_ms}")


def parse_endpoint(text: str) -> Endpoint:
    """`inproc://name`, `ipc:///abs/path` or `ipc://@abstract`, `tcp://host:port` or `tcp://*:port`."""
    if not isinstance(text, str):
        raise BadEndpoint(f"an endpoint is a string such as tcp://host:5710, got {type(text).__name__}")
    scheme, sep, address = text.partition("://")
    if not sep:
        raise BadEndpoint(f"endpoint {text!r} has no scheme: write inproc://NAME, ipc:///PATH or tcp://HOST:PORT")
    if scheme == "inproc":
        if not _INPROC_NAME.fullmatch(address):
            raise BadEndpoint(f"endpoint {text!r}: an inproc name is 1 to 256 printable characters, no spaces")
        return Endpoint(text, "inproc", address)
    if scheme == "ipc":
        return _parse_ipc(text, address)
    if scheme == "tcp":
        return _parse_tcp(text, address)
    raise BadEndpoint(f"endpoint {text!r}: transport {scheme!r} is not one of inproc, ipc, tcp")


def _parse_ipc(text: str, address: str) -> Endpoint:
    if not (address.startswith("/") or address.startswith("@")) or len(address) < 2:
        raise BadEndpoint(f"endpoint {text!r}: ipc needs an absolute path (ipc:///run/x.sock) "
                          "or an abstract name (ipc://@name)")
    if len(address.encode()) > MAX_IPC_PATH_BYTES:
        raise BadEndpoint(f"endpoint {text!r}: an ipc path is at most {MAX_IPC_PATH_BYTES} bytes "
                          f"(this one has {len(address.encode())}); use a shorter path or ipc://@name")
    return Endpoint(text, "ipc", address)


def _parse_tcp(text: str, address: str) -> Endpoint:
    host, sep, port_text = address.rpartition(":")
    if not sep or not host:
        raise BadEndpoint(f"endpoint {text!r}: write tcp://HOST:PORT (or tcp://*:PORT to bind every interface)")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise BadEndpoint(f"endpoint {text!r}: the port must be a number from 1 to 65535")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise BadEndpoint(f"endpoint {text!r}: {host} is not an IPv6 address") from None
        host = host[1:-1]
    elif host != "*" and not _is_ipv4(host) and not _HOSTNAME.fullmatch(host):
        raise BadEndpoint(f"endpoint {text!r}: {host!r} is not a host name, an IPv4 address, "
                          "[an IPv6 address] or *")
    return Endpoint(text, "tcp", address, host, int(port_text))


def _is_ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def connectable(endpoint: Endpoint) -> Endpoint:
    """`endpoint` itself, or BadEndpoint when it names no one to connect to (a `*` host)."""
    if endpoint.is_wildcard:
        raise BadEndpoint(f"endpoint {endpoint.text!r}: * only binds; connect to a host name or address")
    return endpoint


# -- socket roles ---------------------------------------------------------------------------
# Options go on before bind/connect: libzmq reads most of them when a connection is made.

Options = Iterable[tuple[int, int | bytes]]


def _base(sock: zmq.Socket) -> None:
    # LINGER 0: closing never waits for a peer that is not there, so Context.term() cannot hang.
    sock.setsockopt(zmq.LINGER, 0)


def _network(sock: zmq.Socket, endpoint: Endpoint, heartbeat: ZmtpHeartbeat) -> None:
    if endpoint.transport != "tcp":
        return
    sock.setsockopt(zmq.HEARTBEAT_IVL, heartbeat.interval_ms)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, heartbeat.timeout_ms)
    sock.setsockopt(zmq.HEARTBEAT_TTL, heartbeat.ttl_ms)
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
    sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, TCP_KEEPALIVE_IDLE_S)
    sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, TCP_KEEPALIVE_INTVL_S)
    sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, TCP_KEEPALIVE_CNT)


def _extra(sock: zmq.Socket, options: Options) -> None:
    for option, value in options:
        sock.setsockopt(option, value)


def server_router(sock: zmq.Socket, endpoint: Endpoint, *, heartbeat: ZmtpHeartbeat,
                  security: Options = ()) -> None:
    """The control side's ROUTER: frame limit, ROUTER_MANDATORY, and on tcp heartbeats and keepalive.

    MAXMSGSIZE: an oversized frame is dropped by libzmq before it is held in memory.
    ROUTER_MANDATORY: a send to a peer that is gone raises (EHOSTUNREACH) instead of vanishing,
    so the bridge logs it. `security` is `curve.server_socket_options(...)` on a cluster.
    """
    _base(sock)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    _network(sock, endpoint, heartbeat)
    _extra(sock, security)


def client_dealer(sock: zmq.Socket, endpoint: Endpoint, *, heartbeat: ZmtpHeartbeat,
                  security: Options = ()) -> None:
    """An executor side's DEALER to one control endpoint; on tcp also IMMEDIATE, heartbeats, keepalive.

    IMMEDIATE (tcp): a message is queued only on a connection whose handshake completed, so a
    send while the replica is unreachable fails at once (EAGAIN) instead of waiting in a queue
    that a reconnect would lose. `security` is `curve.client_socket_options(...)` on a cluster.
    """
    connectable(endpoint)
    _base(sock)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    if endpoint.transport == "tcp":
        sock.setsockopt(zmq.IMMEDIATE, 1)
    _network(sock, endpoint, heartbeat)
    _extra(sock, security)


def local_socket(sock: zmq.Socket) -> None:
    """An inproc PUSH or PULL between an actor and the bridge (the outbox)."""
    _base(sock)


def nudge_pull(sock: zmq.Socket) -> None:
    """The PULL `qlactors` commands nudge: tiny frames, a short queue (a nudge only says "act now")."""
    _base(sock)
    sock.setsockopt(zmq.RCVHWM, 16)
    sock.setsockopt(zmq.MAXMSGSIZE, 64)


# -- binding ----------------------------------------------------------------------------------

def bind(sock: zmq.Socket, endpoint: Endpoint) -> None:
    """`sock.bind(endpoint)`, with a failure said in one line (BindFailed) instead of a ZMQError."""
    try:
        sock.bind(endpoint.text)
    except zmq.ZMQError as err:
        raise BindFailed(bind_failure(endpoint, err.errno, err.strerror)) from None


def check_bindable(endpoint: Endpoint) -> None:
    """BindFailed when a tcp endpoint cannot be bound now, before a runtime starts anything.

    A probe socket is bound (never listened on, so it accepts no connection) and closed at once,
    with SO_REUSEADDR as libzmq binds: a port some other process listens on is refused, one left
    in TIME_WAIT is not. Only a hint, for a one-line refusal before any log line: the real bind
    may still fail (the address taken meanwhile), and `bind` says so the same way.
    """
    if endpoint.transport != "tcp":
        return
    host = "0.0.0.0" if endpoint.is_wildcard else endpoint.host  # libzmq binds IPv4 unless told
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        address = socket.getaddrinfo(host, endpoint.port, family, socket.SOCK_STREAM)[0][4]
    except socket.gaierror:
        return  # a name that does not resolve: the real bind says so
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as err:
            raise BindFailed(bind_failure(endpoint, err.errno, err.strerror)) from None


def bind_failure(endpoint: Endpoint, code: int | None, reason: str | None) -> str:
    """The one line that says why `endpoint` could not be bound."""
    if code == errno.EADDRINUSE:
        why = f"address already in use ({_IN_USE_HINT[endpoint.transport]})"
    elif code == errno.EADDRNOTAVAIL:
        why = "not an address of this host (bind one of its own addresses, or tcp://*:PORT)"
    elif code == errno.EACCES:
        why = "permission denied (a port below 1024 needs privileges)"
    else:
        why = (reason or "failed").lower()
    return f"cannot bind {endpoint.text}: {why}"
