"""CurveZMQ pieces: the allow-list cache, the ZAP authenticator on a real tcp socket, the options."""

from __future__ import annotations

import threading

import pytest
import zmq

from qlactors.errors import BadInput
from qlactors.wire.curve import (ZAP_DOMAIN, AllowList, CurveServer, client_socket_options, is_z85_key,
                                 server_socket_options, start_authenticator)
from wire_harness import CurveClient, KeyPair, Replica, tcp_endpoint


def test_allow_list_maps_keys_to_worker_ids_and_replace_swaps_the_whole_list():
    a, b = KeyPair.new(), KeyPair.new()
    allow = AllowList({a.text: "w1"})
    assert allow.worker_for(a.text) == "w1" and allow.worker_for(b.text) is None
    allow.replace({b.text: "w2"})
    assert allow.worker_for(a.text) is None and allow.worker_for(b.text) == "w2"
    assert len(allow) == 1


def test_allow_list_refuses_what_is_not_a_key_or_a_worker_id_and_keeps_the_old_list():
    a = KeyPair.new()
    allow = AllowList({a.text: "w1"})
    with pytest.raises(BadInput, match="Z85"):
        allow.replace({"not-a-key": "w1"})
    with pytest.raises(BadInput, match="not a worker id"):
        allow.replace({a.text: ""})
    assert allow.worker_for(a.text) == "w1"


def test_allow_list_readers_see_the_old_or_the_new_list_never_a_mix():
    keys = [KeyPair.new().text for _ in range(50)]
    old = {k: "old" for k in keys}
    new = {k: "new" for k in keys}
    allow = AllowList(old)
    mixed: list[set[str | None]] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            snapshot = allow._keys  # one reference, as worker_for reads it
            seen = {snapshot.get(k) for k in keys}
            if len(seen) != 1:
                mixed.append(seen)

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(2000):
        allow.replace(new if i % 2 else old)
    stop.set()
    reader.join()
    assert not mixed


def test_z85_key_check():
    assert is_z85_key(KeyPair.new().text)
    assert not is_z85_key("short") and not is_z85_key(b"x" * 40) and not is_z85_key(" " * 40)


def test_socket_options_carry_the_keys_and_enforce_the_zap_domain():
    server, client = KeyPair.new(), KeyPair.new()
    assert dict(server_socket_options(server.secret)) == {
        zmq.CURVE_SERVER: 1, zmq.CURVE_SECRETKEY: server.secret,
        zmq.ZAP_DOMAIN: ZAP_DOMAIN.encode(), zmq.ZAP_ENFORCE_DOMAIN: 1}
    assert dict(client_socket_options(client.public, client.secret, server.public)) == {
        zmq.CURVE_SERVERKEY: server.public, zmq.CURVE_PUBLICKEY: client.public,
        zmq.CURVE_SECRETKEY: client.secret}
    with pytest.raises(BadInput, match="server secret key"):
        server_socket_options(b"too short")
    with pytest.raises(BadInput, match="server public key"):
        client_socket_options(client.public, client.secret, server.public.decode())


@pytest.fixture
def served():
    """A CURVE ROUTER on tcp with its authenticator; yields (replica, allow-list, authenticator, server keys)."""
    ctx = zmq.Context()
    server = KeyPair.new()
    allow = AllowList()
    auth = start_authenticator(ctx, allow)
    replica = Replica(ctx, tcp_endpoint(), server)
    clients: list[CurveClient] = []
    yield replica, allow, auth, server, clients
    for client in clients:
        client.close()
    replica.close()
    auth.stop()
    ctx.term()


def test_the_authenticator_admits_listed_keys_only_and_sets_the_key_as_user_id(served):
    replica, allow, auth, server, clients = served
    listed, stranger = KeyPair.new(), KeyPair.new()
    allow.replace({listed.text: "w1"})
    good = CurveClient(replica.endpoint, listed, server.public)
    bad = CurveClient(replica.endpoint, stranger, server.public)
    clients += [good, bad]
    assert good.handshake() == zmq.EVENT_HANDSHAKE_SUCCEEDED
    assert bad.handshake() == zmq.EVENT_HANDSHAKE_FAILED_AUTH
    good.sock.send_multipart([b"hello"])
    assert replica.sock.poll(10_000)
    frames = replica.sock.recv_multipart(copy=False)
    assert frames[-1].bytes == b"hello"
    assert frames[-1].get("User-Id") == listed.text


def test_a_stopped_authenticator_admits_no_new_connection(served):
    replica, allow, auth, server, clients = served
    listed = KeyPair.new()
    allow.replace({listed.text: "w1"})
    assert auth.is_alive()
    auth.stop()
    assert not auth.is_alive()
    late = CurveClient(replica.endpoint, listed, server.public, handshake_ms=1000)
    clients.append(late)
    # ZAP_ENFORCE_DOMAIN: with no handler answering, the handshake fails (or stalls until the
    # client gives up on it) instead of passing.
    outcome = late.events.wait_for(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_DISCONNECTED,
                                   zmq.EVENT_HANDSHAKE_SUCCEEDED)
    assert outcome != zmq.EVENT_HANDSHAKE_SUCCEEDED
    late.sock.send_multipart([b"hello"])
    assert not replica.sock.poll(500)
    assert zmq.EVENT_HANDSHAKE_SUCCEEDED not in late.events.seen


def test_one_authenticator_per_context():
    ctx = zmq.Context()
    auth = start_authenticator(ctx, AllowList())
    try:
        with pytest.raises(zmq.ZMQError):
            start_authenticator(ctx, AllowList())
        assert auth.is_alive()
    finally:
        auth.stop()
        ctx.term()


def test_curve_server_needs_a_real_secret_key_and_never_shows_it():
    ctx = zmq.Context()
    auth = start_authenticator(ctx, AllowList())
    try:
        server = KeyPair.new()
        record = CurveServer(server.secret, AllowList(), auth)
        assert server.secret.decode() not in repr(record)
        with pytest.raises(BadInput):
            CurveServer(b"nope", AllowList(), auth)
    finally:
        auth.stop()
        ctx.term()
