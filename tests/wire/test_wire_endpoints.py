"""Endpoint parsing and the socket options of each role, read back from real sockets."""

from __future__ import annotations

import pytest
import zmq

from qlactors.errors import BadInput
from qlactors.wire import codec
from qlactors.wire.endpoints import (MAX_HEARTBEAT_TTL_MS, BadEndpoint, Endpoint, ZmtpHeartbeat, client_dealer,
                                     connectable, local_socket, nudge_pull, parse_endpoint, server_router)


@pytest.mark.parametrize("text, expected", [
    ("inproc://qlactors-control", Endpoint("inproc://qlactors-control", "inproc", "qlactors-control")),
    ("ipc:///run/qlactors/ctl.sock", Endpoint("ipc:///run/qlactors/ctl.sock", "ipc", "/run/qlactors/ctl.sock")),
    ("ipc://@qlactors-abc", Endpoint("ipc://@qlactors-abc", "ipc", "@qlactors-abc")),
    ("tcp://127.0.0.1:5710", Endpoint("tcp://127.0.0.1:5710", "tcp", "127.0.0.1:5710", "127.0.0.1", 5710)),
    ("tcp://*:5710", Endpoint("tcp://*:5710", "tcp", "*:5710", "*", 5710)),
    ("tcp://ctl-1.example:65535", Endpoint("tcp://ctl-1.example:65535", "tcp", "ctl-1.example:65535",
                                           "ctl-1.example", 65535)),
    ("tcp://[::1]:1", Endpoint("tcp://[::1]:1", "tcp", "[::1]:1", "::1", 1)),
])
def test_parse_accepts_the_endpoints_we_serve(text, expected):
    assert parse_endpoint(text) == expected


@pytest.mark.parametrize("text, why", [
    ("localhost:5710", "no scheme"),
    ("udp://host:1", "not one of"),
    ("inproc://", "inproc name"),
    ("inproc://has space", "inproc name"),
    ("ipc://relative/path", "absolute path"),
    ("ipc:///" + "x" * 107, "at most 107 bytes"),
    ("tcp://host", "HOST:PORT"),
    ("tcp://:5710", "HOST:PORT"),
    ("tcp://host:0", "1 to 65535"),
    ("tcp://host:65536", "1 to 65535"),
    ("tcp://host:http", "1 to 65535"),
    ("tcp://bad_host!:5710", "not a host name"),
    ("tcp://[zz]:5710", "not an IPv6"),
])
def test_parse_refuses_with_the_rule_it_broke(text, why):
    with pytest.raises(BadEndpoint, match=why):
        parse_endpoint(text)


def test_bad_endpoint_is_bad_input_and_a_wildcard_is_not_connectable():
    assert issubclass(BadEndpoint, BadInput)
    assert parse_endpoint("tcp://*:5710").is_wildcard
    with pytest.raises(BadEndpoint, match="only binds"):
        connectable(parse_endpoint("tcp://*:5710"))
    assert connectable(parse_endpoint("tcp://127.0.0.1:5710")).port == 5710


def test_heartbeat_every_derives_timeout_and_ttl_and_checks_bounds():
    assert ZmtpHeartbeat.every(1000) == ZmtpHeartbeat(1000, 3000, 3000)
    assert ZmtpHeartbeat.every(3_000_000).ttl_ms == MAX_HEARTBEAT_TTL_MS
    with pytest.raises(BadEndpoint):
        ZmtpHeartbeat(0, 1, 1)
    with pytest.raises(BadEndpoint):
        ZmtpHeartbeat(1, 1, MAX_HEARTBEAT_TTL_MS + 1)


@pytest.fixture
def ctx():
    context = zmq.Context()
    sockets: list[zmq.Socket] = []

    def make(kind: int) -> zmq.Socket:
        sock = context.socket(kind)
        sockets.append(sock)
        return sock

    yield make
    for sock in sockets:
        sock.close(0)
    context.term()


def test_a_tcp_server_router_gets_the_frame_limit_heartbeats_and_keepalive(ctx):
    sock = ctx(zmq.ROUTER)
    server_router(sock, parse_endpoint("tcp://127.0.0.1:5710"), heartbeat=ZmtpHeartbeat(700, 2100, 2200))
    assert sock.getsockopt(zmq.LINGER) == 0
    assert sock.getsockopt(zmq.MAXMSGSIZE) == codec.MAX_FRAME_BYTES
    assert (sock.getsockopt(zmq.HEARTBEAT_IVL), sock.getsockopt(zmq.HEARTBEAT_TIMEOUT),
            sock.getsockopt(zmq.HEARTBEAT_TTL)) == (700, 2100, 2200)
    assert sock.getsockopt(zmq.TCP_KEEPALIVE) == 1


def test_a_server_router_raises_on_an_unroutable_send(ctx):
    # ROUTER_MANDATORY cannot be read back; its effect can: a send to no one raises.
    sock = ctx(zmq.ROUTER)
    server_router(sock, parse_endpoint("inproc://test-endpoints-router"), heartbeat=ZmtpHeartbeat.every(1000))
    sock.bind("inproc://test-endpoints-router")
    with pytest.raises(zmq.ZMQError) as err:
        sock.send_multipart([b"nobody", b"x"], zmq.NOBLOCK)
    assert err.value.errno == zmq.EHOSTUNREACH


def test_an_inproc_router_gets_no_network_options(ctx):
    sock = ctx(zmq.ROUTER)
    server_router(sock, parse_endpoint("inproc://x"), heartbeat=ZmtpHeartbeat(700, 2100, 2200))
    assert sock.getsockopt(zmq.HEARTBEAT_IVL) == 0
    assert sock.getsockopt(zmq.TCP_KEEPALIVE) == -1
    assert sock.getsockopt(zmq.MAXMSGSIZE) == codec.MAX_FRAME_BYTES


def test_a_tcp_client_dealer_gets_immediate_heartbeats_and_its_security_options(ctx):
    public, secret = zmq.curve_keypair()
    server_public, _ = zmq.curve_keypair()
    sock = ctx(zmq.DEALER)
    client_dealer(sock, parse_endpoint("tcp://127.0.0.1:5710"), heartbeat=ZmtpHeartbeat.every(500),
                  security=[(zmq.CURVE_SERVERKEY, server_public), (zmq.CURVE_PUBLICKEY, public),
                            (zmq.CURVE_SECRETKEY, secret)])
    assert sock.getsockopt(zmq.IMMEDIATE) == 1
    assert sock.getsockopt(zmq.HEARTBEAT_IVL) == 500
    assert sock.getsockopt(zmq.MAXMSGSIZE) == codec.MAX_FRAME_BYTES
    assert sock.getsockopt(zmq.MECHANISM) == zmq.CURVE  # the security options went on
    assert sock.getsockopt(zmq.LINGER) == 0


def test_an_inproc_client_dealer_queues_before_it_connects_as_edge_always_did(ctx):
    sock = ctx(zmq.DEALER)
    client_dealer(sock, parse_endpoint("inproc://x"), heartbeat=ZmtpHeartbeat.every(500))
    assert sock.getsockopt(zmq.IMMEDIATE) == 0


def test_a_client_dealer_refuses_a_wildcard(ctx):
    with pytest.raises(BadEndpoint, match="only binds"):
        client_dealer(ctx(zmq.DEALER), parse_endpoint("tcp://*:1"), heartbeat=ZmtpHeartbeat.every(500))


def test_local_and_nudge_sockets(ctx):
    push, nudge = ctx(zmq.PUSH), ctx(zmq.PULL)
    local_socket(push)
    nudge_pull(nudge)
    assert push.getsockopt(zmq.LINGER) == 0
    assert (nudge.getsockopt(zmq.LINGER), nudge.getsockopt(zmq.RCVHWM), nudge.getsockopt(zmq.MAXMSGSIZE)) == (0, 16, 64)
