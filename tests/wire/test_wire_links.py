"""The worker's replica links: the failover rule alone, then through a real bridge to real CURVE replicas."""

from __future__ import annotations

import logging
import time

import pytest
import zmq

from qlactors.errors import BadInput
from qlactors.wire.bridge import Bridge, Inbound, Outbox
from qlactors.wire.curve import AllowList, start_authenticator
from qlactors.wire.links import UNREACHABLE_RETRY_S, Failover, ReplicaLinks
from qlactors.wire.messages import Ack, Nudge
from actor_harness import wait_until
from wire_harness import WAIT_S, Collected, KeyPair, Replica, heartbeat, tcp_endpoint

# -- the rule, without sockets ----------------------------------------------------------------


def test_an_answer_retires_exactly_the_request_it_names():
    plan = Failover(2, timeout_s=5.0)
    plan.sent("a", [b"a"], now=100.0)
    plan.sent("b", [b"b"], now=101.0)
    assert plan.deadline == 105.0  # the oldest unanswered request sets the deadline
    assert not plan.answered("")  # a frame that names no request (Nudge, a refusal) answers nothing
    assert not plan.answered("zzz")  # nor does an answer to a request no longer waited for
    assert plan.expired(105.0) and not plan.expired(104.9)
    assert plan.answered("a")  # whichever replica sent it: "a" is answered, "b" still waits
    assert plan.pending() == [[b"b"]] and plan.deadline == 106.0
    assert plan.answered("b")
    assert plan.deadline is None and not plan.unanswered and not plan.expired(1e9)


def test_a_copy_of_an_unanswered_request_keeps_its_place_and_its_clock():
    plan = Failover(2, timeout_s=5.0)
    plan.sent("a", [b"a1"], now=100.0)
    plan.sent("b", [b"b"], now=101.0)
    plan.sent("a", [b"a2"], now=104.0)  # repeated by its actor: failover is not postponed
    assert plan.pending() == [[b"a2"], [b"b"]] and plan.deadline == 105.0


def test_rotate_moves_to_the_next_replica_wrapping_and_returns_what_to_send_again():
    plan = Failover(3, timeout_s=2.0)
    plan.sent("a", [b"a"], now=0.0)
    plan.sent("b", [b"b"], now=1.0)
    assert plan.rotate(now=2.0) == [[b"a"], [b"b"]]
    assert (plan.current, plan.deadline) == (1, 4.0)
    plan.rotate(now=4.0)
    assert plan.rotate(now=6.0) == [[b"a"], [b"b"]] and plan.current == 0
    assert plan.answered("a") and plan.answered("b")
    assert plan.rotate(now=7.0) == [] and plan.deadline is None  # nothing unanswered: no deadline


def test_unanswered_requests_are_bounded_oldest_dropped_first():
    plan = Failover(1, timeout_s=1.0, limit=2)
    for name in ("a", "b", "c"):
        plan.sent(name, [name.encode()], now=0.0)
    assert plan.pending() == [[b"b"], [b"c"]] and plan.dropped == 1


def test_when_no_replica_takes_the_requests_the_ring_is_tried_again_soon():
    plan = Failover(2, timeout_s=30.0)
    plan.sent("a", [b"a"], now=10.0)
    plan.rotate(now=10.0)
    plan.rotate(now=10.0)
    plan.unreachable(now=10.0)
    assert plan.deadline == 10.0 + UNREACHABLE_RETRY_S and plan.unsent and plan.unanswered
    plan.sent("b", [b"b"], now=10.1)
    plan.delivered(now=10.2)  # a replica took both: the full timeout from now
    assert (plan.unsent, plan.deadline) == (False, 40.2)
    quick = Failover(1, timeout_s=0.1)
    quick.sent("a", [b"a"], now=0.0)
    quick.unreachable(now=0.0)
    assert quick.deadline == 0.1  # never later than the request timeout


def test_failover_refuses_no_replica_or_a_non_positive_timeout():
    with pytest.raises(BadInput):
        Failover(0, timeout_s=1.0)
    with pytest.raises(BadInput):
        Failover(1, timeout_s=0)


# -- real sockets -----------------------------------------------------------------------------


def answer_of(request) -> Ack:
    """What a replica answers `request` with: an Ack naming it."""
    return Ack(answer_to=request.request_id, of=request.KIND, run_id="", attempt_id="", offer_id="",
               result="applied", detail="")


class Cluster:
    """Two CURVE ROUTER replicas (one context, one authenticator) and a worker bridge on its own context."""

    def __init__(self, *, request_timeout_s: float, replicas_up: tuple[bool, ...] = (True, True),
                 listed: bool = True, server_key: KeyPair | None = None, handshake_failures_max: int = 10) -> None:
        self.server, self.worker = KeyPair.new(), KeyPair.new()
        self.server_ctx = zmq.Context()
        self.allow_list = AllowList({self.worker.text: "w1"} if listed else {})
        self.auth = start_authenticator(self.server_ctx, self.allow_list)
        self.endpoints = [tcp_endpoint() for _ in replicas_up]
        self.replicas = [Replica(self.server_ctx, ep, self.server) if up else None
                         for ep, up in zip(self.endpoints, replicas_up)]
        self.ctx = zmq.Context()
        self.links = ReplicaLinks(self.ctx, self.endpoints, server_public=(server_key or self.server).public,
                                  public=self.worker.public, secret=self.worker.secret,
                                  request_timeout_s=request_timeout_s, heartbeat_ms=1000,
                                  handshake_failures_max=handshake_failures_max)
        self.gave_up: list[str] = []
        self.links.on_give_up = self.gave_up.append
        self.got = Collected()
        self.bridge = Bridge(self.ctx, control_links=self.links)
        self.bridge.route_executor(["nudge", "ack"], self.got)
        self.bridge.start()
        self.bridge.ready()
        self.outbox = Outbox(self.ctx, self.bridge.outbox_endpoint)

    def connected(self) -> None:
        """Wait until the worker's links finished the CURVE handshake with every running replica."""
        up = {r.endpoint for r in self.replicas if r is not None}
        wait_until(lambda: self.links.connected() == up, what=f"links connected to {sorted(up)}")

    def close(self) -> None:
        self.outbox.close()
        self.bridge.close()
        self.ctx.term()
        for replica in self.replicas:
            if replica is not None:
                replica.close()
        self.auth.stop()
        self.server_ctx.term()


@pytest.fixture
def make_cluster():
    made: list[Cluster] = []

    def make(**kwargs) -> Cluster:
        made.append(Cluster(**kwargs))
        return made[-1]

    yield make
    for cluster in made:
        cluster.close()


def test_a_request_the_first_replica_never_answers_is_answered_by_the_second(make_cluster):
    cluster = make_cluster(request_timeout_s=1.0)
    first, second = cluster.replicas
    cluster.connected()
    assert cluster.links.current() == cluster.endpoints[0]
    cluster.outbox.to_control(heartbeat("w1", free_slots=5))
    _, request = first.receive()  # the first replica got it and stays silent
    assert request == heartbeat("w1", free_slots=5)
    peer, again = second.receive()  # after the timeout the same frames went to the second
    assert again == request
    second.answer(peer, answer_of(again))
    assert cluster.got.get(WAIT_S) == Inbound(b"", answer_of(again))
    assert cluster.links.current() == cluster.endpoints[1]
    cluster.outbox.to_control(heartbeat("w1", free_slots=6))  # later requests stay on the second
    assert second.receive()[1].free_slots == 6
    assert not first.sock.poll(500)


def test_a_failover_around_the_ring_back_to_the_same_replica_is_a_resend_not_a_failover(make_cluster, caplog):
    """The only replica up never answered: the requests go to it again, logged as a resend; a
    `link_failover` never names one endpoint as both from and to (issue 28)."""
    caplog.set_level("WARNING", logger="qlactors.links")
    cluster = make_cluster(request_timeout_s=1.0, replicas_up=(True, False))
    first = cluster.replicas[0]
    wait_until(lambda: cluster.links.connected() == {first.endpoint}, what="the link to the one replica up")
    cluster.outbox.to_control(heartbeat("w1", free_slots=3))
    _, request = first.receive()
    _, again = first.receive()  # after the timeout, around the ring: the same replica again
    assert again == request
    wait_until(lambda: "event=link_resent" in caplog.text, what="the resend logged")
    assert f"event=link_resent endpoint={first.endpoint}" in caplog.text
    assert f"from={first.endpoint} to={first.endpoint}" not in caplog.text


def test_a_replica_that_answers_stays_current(make_cluster):
    cluster = make_cluster(request_timeout_s=60.0)
    first, second = cluster.replicas
    cluster.connected()
    for slots in (1, 2):
        cluster.outbox.to_control(heartbeat("w1", free_slots=slots))
        peer, request = first.receive()
        assert request.free_slots == slots
        first.answer(peer, answer_of(request))
        assert cluster.got.get() == Inbound(b"", answer_of(request))
    assert cluster.links.current() == cluster.endpoints[0]
    assert cluster.links.due() is None
    assert not second.sock.poll(200)


def test_a_replica_with_no_connection_is_skipped_at_once(make_cluster):
    # The first endpoint has no listener: IMMEDIATE refuses the send, so the link moves on without
    # waiting for the (long) request timeout.
    cluster = make_cluster(request_timeout_s=600.0, replicas_up=(False, True))
    cluster.connected()
    cluster.outbox.to_control(heartbeat("w1", free_slots=9))
    assert cluster.replicas[1].receive(WAIT_S)[1].free_slots == 9
    assert cluster.links.current() == cluster.endpoints[1]


def test_a_late_answer_from_a_replica_that_is_no_longer_current_is_still_delivered(make_cluster):
    cluster = make_cluster(request_timeout_s=1.0)
    first, second = cluster.replicas
    cluster.connected()
    cluster.outbox.to_control(heartbeat("w1"))
    late_peer, request = first.receive()
    second.receive()  # failed over
    first.answer(late_peer, answer_of(request))  # late, but it names the request: answered
    assert cluster.got.get() == Inbound(b"", answer_of(request))
    assert cluster.links.current() == cluster.endpoints[1]
    wait_until(lambda: cluster.links.due() is None, what="the request retired by its late answer")


def test_a_nudge_from_the_current_replica_answers_no_request(make_cluster):
    cluster = make_cluster(request_timeout_s=1.0)
    first, second = cluster.replicas
    cluster.connected()
    cluster.outbox.to_control(heartbeat("w1", free_slots=3))
    peer, request = first.receive()
    first.answer(peer, Nudge())  # a frame that names no request (protocol 4)
    assert cluster.got.get() == Inbound(b"", Nudge())
    assert second.receive()[1] == request  # still unanswered: it went to the second replica


def test_a_request_sent_before_any_replica_is_reachable_goes_out_once_one_is(make_cluster):
    cluster = make_cluster(request_timeout_s=600.0, replicas_up=(False,))
    cluster.outbox.to_control(heartbeat("w1", free_slots=4))
    wait_until(lambda: cluster.links.due() is not None, what="the request waiting for a replica")
    replica = Replica(cluster.server_ctx, cluster.endpoints[0], cluster.server)  # the replica starts late
    cluster.replicas[0] = replica
    assert replica.receive()[1].free_slots == 4


def test_a_replica_refusing_the_workers_key_is_logged_with_its_endpoint_and_key_while_unconnected(
        make_cluster, caplog):
    """The refusal is logged (`link_refused`: the replica's endpoint, the worker's key, the
    `worker allow` fix) and the link is not connected meanwhile; that it connects once the key is
    allowed is the next test's."""
    caplog.set_level(logging.ERROR, logger="qlactors.links")
    cluster = make_cluster(request_timeout_s=600.0, replicas_up=(True,), listed=False)
    wait_until(lambda: any("link_refused" in r.getMessage() for r in caplog.records), what="link_refused")
    assert cluster.links.connected() == frozenset()
    refused = next(r.getMessage() for r in caplog.records if "link_refused" in r.getMessage())
    assert cluster.endpoints[0] in refused and "worker allow" in refused
    assert f"key={cluster.worker.text}" in refused  # the key the replica's `curve_denied` names


def test_a_key_allowed_after_a_refusal_connects_without_a_restart(make_cluster, caplog):
    """libzmq gives a refused connection up for good; the link connects it again with backoff,
    so a request waiting since before `worker allow` goes out once the key is allowed, and the
    first handshake after the refusal is logged once."""
    caplog.set_level(logging.INFO, logger="qlactors.links")
    cluster = make_cluster(request_timeout_s=600.0, replicas_up=(True,), listed=False)
    cluster.outbox.to_control(heartbeat("w1", free_slots=7))
    wait_until(lambda: any("link_refused" in r.getMessage() for r in caplog.records), what="link_refused")
    cluster.allow_list.replace({cluster.worker.text: "w1"})  # `worker allow`, as a replica's cache sees it
    peer, request = cluster.replicas[0].receive(WAIT_S + 5)
    assert request.free_slots == 7
    accepted = [r.getMessage() for r in caplog.records if "link_accepted_after_refusal" in r.getMessage()]
    assert len(accepted) == 1 and cluster.endpoints[0] in accepted[0]


def test_a_wrong_server_key_is_logged_once_per_endpoint_by_the_events_name(make_cluster, caplog):
    """libzmq retries a failed handshake ten times a second: one line, naming the event, and the
    failures after it counted for the next line (at most every HANDSHAKE_LOG_S)."""
    caplog.set_level(logging.ERROR, logger="qlactors.links")
    cluster = make_cluster(request_timeout_s=600.0, replicas_up=(True,), server_key=KeyPair.new())
    endpoint = cluster.endpoints[0]
    wait_until(lambda: cluster.links._handshake_log._seen.get(endpoint, (0, 0))[1] >= 5,
               what="five handshake failures after the first")
    failed = [r.getMessage() for r in caplog.records if "link_handshake_failed" in r.getMessage()]
    assert len(failed) == 1, failed
    assert endpoint in failed[0] and "event=EVENT_HANDSHAKE_FAILED_NO_DETAIL" in failed[0]
    assert "server_key" in failed[0]


def test_handshakes_failing_in_a_row_give_up_once_and_a_key_not_yet_allowed_never_does(make_cluster, caplog):
    """A wrong server_key fails every handshake: at the bound the links give up (the worker's fatal
    stop: exit 1), once, saying why; a replica that refuses the worker's key (not allowed yet) is
    tried again for ever, since a later `worker allow` must work (SEMANTICS.md §9; issue 28)."""
    wrong = make_cluster(request_timeout_s=600.0, replicas_up=(True,), server_key=KeyPair.new(),
                         handshake_failures_max=3)
    wait_until(lambda: wrong.gave_up, what="the links to give up")
    time.sleep(0.5)  # more failures: still one give-up
    assert len(wrong.gave_up) == 1 and "3 CURVE handshakes in a row failed" in wrong.gave_up[0]
    assert "server_key" in wrong.gave_up[0]
    refused = make_cluster(request_timeout_s=600.0, replicas_up=(True,), listed=False, handshake_failures_max=3)
    wait_until(lambda: "link_refused" in caplog.text, what="the key refused")
    time.sleep(1.0)
    assert refused.gave_up == []


def test_links_refuse_no_endpoint_and_a_wildcard():
    keys, server = KeyPair.new(), KeyPair.new()
    with zmq.Context() as ctx:
        for bad in ([], ["tcp://*:5710"]):
            with pytest.raises(BadInput):
                ReplicaLinks(ctx, bad, server_public=server.public, public=keys.public, secret=keys.secret,
                             request_timeout_s=1.0, heartbeat_ms=1000)
