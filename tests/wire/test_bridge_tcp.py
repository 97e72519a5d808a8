"""The control side's bridge on tcp with CurveZMQ: real sockets on 127.0.0.1, real CURVE keys."""

from __future__ import annotations

import logging
import socket
import threading

import pytest
import zmq

from qlactors.errors import BadInput
from qlactors.wire import codec
from qlactors.wire.bridge import Bridge, Inbound, Outbox
from qlactors.wire.curve import REFUSED_KEY, AllowList, CurveServer, start_authenticator
from qlactors.wire.messages import Ack, Nudge, Register
from wire_harness import WAIT_S, Collected, CurveClient, KeyPair, heartbeat, tcp_endpoint
from qlactors.ids import new_id


class Control:
    """A control side: its context, authenticator, allow-list and bridge on a fresh tcp port."""

    def __init__(self, allowed: dict[str, str], *, start: bool = True) -> None:
        self.endpoint = tcp_endpoint()
        self.server = KeyPair.new()
        self.ctx = zmq.Context()
        self.allow = AllowList(allowed)
        self.auth = start_authenticator(self.ctx, self.allow)
        self.got = Collected()
        self.exited: list[str] = []
        self.exit_event = threading.Event()
        self.bridge = Bridge(self.ctx, control_bind=self.endpoint,
                             curve=CurveServer(self.server.secret, self.allow, self.auth))
        self.bridge.route_control(self.got)
        self.bridge.on_exit = self._on_exit
        self.clients: list[CurveClient] = []
        if start:
            self.bridge.start()
            self.bridge.ready()

    def _on_exit(self, reason: str) -> None:
        self.exited.append(reason)
        self.exit_event.set()

    def client(self, keys: KeyPair) -> CurveClient:
        client = CurveClient(self.endpoint, keys, self.server.public)
        self.clients.append(client)
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.bridge.close()
        self.auth.stop()
        self.ctx.term()


@pytest.fixture
def w1() -> KeyPair:
    return KeyPair.new()


@pytest.fixture
def control(w1):
    side = Control({w1.text: "w1"})
    yield side
    side.close()


def test_a_listed_key_is_delivered_with_its_worker_id(control, w1):
    client = control.client(w1)
    assert client.handshake() == zmq.EVENT_HANDSHAKE_SUCCEEDED
    client.send(heartbeat("w1", free_slots=3))
    inbound = control.got.get()
    assert isinstance(inbound, Inbound)
    assert inbound.worker_id == "w1"
    assert inbound.message == heartbeat("w1", free_slots=3)
    assert inbound.peer  # the ROUTER identity the gateway answers to


def test_a_message_that_names_no_worker_id_yet_is_delivered_under_the_keys_id(control, w1):
    client = control.client(w1)
    client.send(Register(request_id=new_id(), register_id=new_id(), worker_id="", capacity=2, boot_id="b", labels=[], protocol_min=3, protocol_max=3,
                         worker_clock_ms=0, resume_session_id=None, resume_generation=None, resume_secret=None))
    inbound = control.got.get()
    assert (inbound.worker_id, inbound.message.capacity) == ("w1", 2)


def test_an_unknown_key_cannot_connect_and_nothing_it_sends_is_delivered(control, w1):
    stranger = control.client(KeyPair.new())
    assert stranger.handshake() == zmq.EVENT_HANDSHAKE_FAILED_AUTH
    stranger.send(heartbeat("w1"))  # queued on (or refused by) a socket whose handshake failed
    listed = control.client(w1)
    listed.send(heartbeat("w1", free_slots=7))
    assert control.got.get().message.free_slots == 7  # the path works ...
    assert control.got.nothing()  # ... and the stranger's frame never came through it


def test_a_key_removed_from_the_allow_list_is_refused_at_its_next_message(control, w1):
    client = control.client(w1)
    client.send(heartbeat("w1", free_slots=1))
    assert control.got.get().worker_id == "w1"
    control.allow.replace({})  # the replica's refresh found the key revoked; the connection stays up
    client.send(heartbeat("w1", free_slots=2))
    answer = client.receive()
    assert answer == Ack(answer_to="", of="unknown", run_id="", attempt_id="", offer_id="", result="refused", detail=REFUSED_KEY)
    assert control.got.nothing()
    assert control.bridge.rejected_frames == 1
    control.allow.replace({w1.text: "w1"})  # listed again: served again, same connection
    client.send(heartbeat("w1", free_slots=3))
    assert control.got.get().message.free_slots == 3


def test_a_listed_key_cannot_speak_for_another_worker_id(control, w1):
    client = control.client(w1)
    client.send(heartbeat("w2"))
    answer = client.receive()
    assert (answer.of, answer.result) == ("heartbeat", "refused")
    assert "'w1'" in answer.detail and "'w2'" in answer.detail
    assert control.got.nothing()


def test_a_bridge_whose_authenticator_is_not_running_refuses_to_bind(w1):
    side = Control({w1.text: "w1"}, start=False)
    try:
        side.auth.stop()
        side.bridge.start()
        with pytest.raises(RuntimeError, match="authenticator is not running"):
            side.bridge.ready()
        port = int(side.endpoint.rsplit(":", 1)[1])
        with socket.socket() as probe:  # nobody bound the port: the bind never happened
            probe.bind(("127.0.0.1", port))
    finally:
        side.close()


def test_an_authenticator_that_stops_while_serving_stops_the_bridge_with_the_reason(control, w1):
    client = control.client(w1)
    client.send(heartbeat("w1", free_slots=1))
    assert control.got.get().worker_id == "w1"
    control.auth.stop()
    client.send(heartbeat("w1", free_slots=2))  # the live connection is authenticated already
    assert control.exit_event.wait(WAIT_S)
    assert "authenticator is not running" in control.exited[0]
    control.bridge.join(WAIT_S)
    assert not control.bridge.is_alive()
    assert control.got.nothing()


def test_a_send_to_a_gone_peer_is_logged_by_its_worker_and_the_bridge_keeps_serving(control, w1, caplog):
    caplog.set_level(logging.DEBUG, logger="qlactors.bridge")
    outbox = Outbox(control.ctx, control.bridge.outbox_endpoint)
    try:
        outbox.to_peer(b"\x00gone-peer", Nudge(), worker="w9")  # ROUTER_MANDATORY: EHOSTUNREACH, not silence
        client = control.client(w1)
        client.send(heartbeat("w1", free_slots=4))
        inbound = control.got.get()
        outbox.to_peer(inbound.peer, Nudge(), worker="w1")
        assert client.receive() == Nudge()
    finally:
        outbox.close()
    failures = [r for r in caplog.records if "peer_send_failed" in r.getMessage()]
    assert len(failures) == 1 and failures[0].levelno == logging.WARNING
    assert "worker=w9" in failures[0].getMessage() and "Host unreachable" in failures[0].getMessage()
    assert control.bridge.is_alive() and not control.exited


def test_a_send_to_a_peer_of_no_live_session_is_no_warning(control, w1, caplog):
    """A peer the Gateway knows no live session by (a worker that stopped, reconnected, or talks
    to another replica now) is no news: debug level only."""
    caplog.set_level(logging.DEBUG, logger="qlactors.bridge")
    outbox = Outbox(control.ctx, control.bridge.outbox_endpoint)
    client = control.client(w1)
    try:
        outbox.to_peer(b"\x00gone-peer", Nudge())
        client.send(heartbeat("w1", free_slots=4))
        outbox.to_peer(control.got.get().peer, Nudge())  # one outbox: the send before it was tried
        assert client.receive() == Nudge()
    finally:
        outbox.close()
    failures = [r for r in caplog.records if "peer_send_failed" in r.getMessage()]
    assert [r.levelno for r in failures] == [logging.DEBUG]


def test_sends_to_a_gone_peer_are_logged_once_per_peer_per_interval(control, w1, caplog, monkeypatch):
    """A departed peer costs one log line per PEER_FAILURE_LOG_S, not one per nudge, and the
    next line says how many failures went unlogged."""
    caplog.set_level(logging.WARNING, logger="qlactors.bridge")
    outbox = Outbox(control.ctx, control.bridge.outbox_endpoint)
    client = control.client(w1)

    def round_trip() -> None:  # one outbox: every send before it has been tried
        client.send(heartbeat("w1", free_slots=4))
        outbox.to_peer(control.got.get().peer, Nudge())
        assert client.receive() == Nudge()

    def failures() -> list[str]:
        return [r.getMessage() for r in caplog.records if "peer_send_failed" in r.getMessage()]

    try:
        for _ in range(5):
            outbox.to_peer(b"\x00gone-one", Nudge(), worker="w8")
        for _ in range(3):
            outbox.to_peer(b"\x00gone-two", Nudge(), worker="w9")
        round_trip()
        one, two = b"\x00gone-one".hex()[:16], b"\x00gone-two".hex()[:16]
        assert [f.split(" error=")[0] for f in failures()] == [
            f"event=peer_send_failed worker=w8 peer={one}", f"event=peer_send_failed worker=w9 peer={two}"]
        monkeypatch.setattr(control.bridge._peer_failures._limit, "every_s", 0.0)  # the interval is over
        outbox.to_peer(b"\x00gone-one", Nudge(), worker="w8")
        round_trip()
    finally:
        outbox.close()
    assert len(failures()) == 3 and failures()[-1].endswith("unlogged_since=4"), failures()
    assert control.bridge.is_alive() and not control.exited


def test_tcp_is_not_served_without_curve():
    with zmq.Context() as ctx:
        with pytest.raises(BadInput, match="CurveZMQ only"):
            Bridge(ctx, control_bind=tcp_endpoint())
        with pytest.raises(BadInput, match="control_links"):
            Bridge(ctx, control_connect=tcp_endpoint())


def test_an_inproc_bridge_delivers_without_a_worker_id():
    ctx = zmq.Context()
    got = Collected()
    bridge = Bridge(ctx, control_bind="inproc://test-bridge-tcp-edge")
    bridge.route_control(got)
    bridge.start()
    bridge.ready()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect("inproc://test-bridge-tcp-edge")
        dealer.send_multipart(codec.encode(heartbeat("local")))
        inbound = got.get()
        assert inbound.worker_id is None and inbound.message.worker_id == "local"
    finally:
        dealer.close(0)
        bridge.close()
        ctx.term()
