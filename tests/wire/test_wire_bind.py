"""A bind that fails is said in one line (BindFailed), never a ZMQError traceback: the tcp
pre-check a replica runs before it starts anything, and the bridge's own bind (issue 18 item 8)."""

from __future__ import annotations

import socket

import pytest
import zmq

from qlactors.wire.bridge import Bridge
from qlactors.wire.curve import AllowList, CurveServer, start_authenticator
from qlactors.wire.endpoints import BindFailed, check_bindable, parse_endpoint
from wire_harness import KeyPair, tcp_endpoint


@pytest.fixture
def taken():
    """A tcp endpoint some other process listens on."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield f"tcp://127.0.0.1:{listener.getsockname()[1]}"


def test_the_pre_check_refuses_an_address_in_use_and_passes_a_free_one(taken):
    with pytest.raises(BindFailed) as caught:
        check_bindable(parse_endpoint(taken))
    assert str(caught.value) == f"cannot bind {taken}: address already in use (another replica on this host?)"
    check_bindable(parse_endpoint(tcp_endpoint()))  # nothing listens there: no refusal


def test_the_pre_check_names_an_address_that_is_not_this_hosts():
    with pytest.raises(BindFailed) as caught:
        check_bindable(parse_endpoint("tcp://192.0.2.1:5710"))  # TEST-NET-1: never an address of ours
    assert "cannot bind tcp://192.0.2.1:5710: not an address of this host" in str(caught.value)


def test_a_bridge_whose_bind_is_taken_says_so_in_one_line(taken):
    ctx = zmq.Context()
    allow = AllowList({})
    auth = start_authenticator(ctx, allow)
    bridge = Bridge(ctx, control_bind=taken, curve=CurveServer(KeyPair.new().secret, allow, auth))
    try:
        bridge.start()
        with pytest.raises(BindFailed) as caught:
            bridge.ready()
        assert str(caught.value) == f"cannot bind {taken}: address already in use (another replica on this host?)"
    finally:
        bridge.close()
        auth.stop()
        ctx.term()
