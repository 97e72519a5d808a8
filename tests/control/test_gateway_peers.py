"""The Gateway forgets a worker's peer when its session ends, so it stops sending it nudges (and
the bridge stops logging `peer_send_failed` for it every cycle): a heartbeat answered
`session_ended` (superseded, expired, revoked), a Leave `offline`, or silence for a whole
session lease. And a message whose values the domain or the store refuses (a PeerFault) is
answered `refused`, never a crash. A cluster replica's Gateway (`ClusterSessions`) on SQLite and
PostgreSQL; the worker is a DEALER the test drives."""

from __future__ import annotations

import dataclasses
import logging

import zmq

from qlactors.control import gateway
from qlactors.clock import wall_ms
from qlactors.runtime.signals import ToWorkers
from qlactors.ids import new_id
from qlactors.wire import messages as m

from actor_harness import register_message
from cluster_rigs import cluster_gateway, leave_of  # noqa: F401 - the fixture
from cluster_rigs import LEASES


def _heartbeat(session, seq: int = 1) -> m.Heartbeat:
    return m.Heartbeat(request_id=new_id(), worker_id=session.worker_id, session_id=session.session_id,
                       session_generation=session.generation, seq=seq, free_slots=1,
                       worker_clock_ms=wall_ms(), renewals=[])


def _heard(h, peer, session) -> None:
    """The worker heartbeats; a nudge after a cycle then reaches it (the Gateway knows its peer)."""
    peer.send(_heartbeat(session))
    assert not peer.expect(m.HeartbeatAck).session_ended
    h.directory.tell("gateway", ToWorkers(nudge=True))
    peer.expect(m.Nudge)


def test_a_worker_that_left_offline_is_nudged_no_more(cluster_gateway):  # noqa: F811
    h, peer = cluster_gateway
    session = h.ctx.control_side.dispatch.sessions.register("w1", 2, boot_id="b", session_lease_ms=60_000)
    _heard(h, peer, session)
    peer.send(leave_of(session, "draining"))
    assert peer.expect(m.Ack).result == "applied"
    h.directory.tell("gateway", ToWorkers(nudge=True))
    peer.expect(m.Nudge)  # draining: still reached (its stops, its running jobs)
    peer.send(leave_of(session, "offline"))
    assert peer.expect(m.Ack).result == "applied"
    h.directory.tell("gateway", ToWorkers(nudge=True))
    peer.quiet()


def test_a_worker_whose_heartbeat_says_its_session_ended_is_nudged_no_more(cluster_gateway):  # noqa: F811
    h, peer = cluster_gateway
    old = h.ctx.control_side.dispatch.sessions.register("w1", 2, boot_id="b", session_lease_ms=60_000)
    _heard(h, peer, old)
    h.ctx.control_side.dispatch.sessions.register("w1", 2, boot_id="b", session_lease_ms=60_000)  # supersedes it
    peer.send(_heartbeat(old, seq=2))
    assert peer.expect(m.HeartbeatAck).session_ended
    h.directory.tell("gateway", ToWorkers(nudge=True))
    peer.quiet()


def test_a_worker_not_heard_for_a_session_lease_is_forgotten(cluster_gateway, monkeypatch, caplog):  # noqa: F811
    h, peer = cluster_gateway
    caplog.set_level(logging.INFO, logger="qlactors.gateway")
    session = h.ctx.control_side.dispatch.sessions.register("w1", 2, boot_id="b", session_lease_ms=60_000)
    _heard(h, peer, session)
    start = gateway._clock()
    monkeypatch.setattr(gateway, "_clock", lambda: start + LEASES["session_lease_ms"] / 1000 - 1)
    h.directory.tell("gateway", ToWorkers(nudge=True))
    peer.expect(m.Nudge)  # within its session lease: still its peer
    monkeypatch.setattr(gateway, "_clock", lambda: start + LEASES["session_lease_ms"] / 1000 + 1)
    h.directory.tell("gateway", ToWorkers(nudge=True))
    peer.quiet()
    assert any("event=peer_forgotten worker=w1" in r.getMessage() for r in caplog.records)
    _heard(h, peer, session)  # heard again: its peer again


def test_a_send_names_its_worker_only_while_that_peer_is_a_live_sessions(cluster_gateway, monkeypatch):  # noqa: F811
    """What the bridge logs of a failed send: the worker of a live session's peer; nothing at
    warning level for a peer whose session ended (its `peer_send_failed` would be noise)."""
    from qlactors.wire.bridge import Outbox

    sent: list[tuple[str, str]] = []
    original = Outbox.to_peer

    def spy(self, peer_id, message, *, worker="", **kw):
        sent.append((type(message).__name__, worker))
        original(self, peer_id, message, worker=worker, **kw)

    monkeypatch.setattr(Outbox, "to_peer", spy)
    h, peer = cluster_gateway
    old = h.ctx.control_side.dispatch.sessions.register("w1", 2, boot_id="b", session_lease_ms=60_000)
    _heard(h, peer, old)
    assert sent == [("HeartbeatAck", "w1"), ("Nudge", "w1")]
    h.ctx.control_side.dispatch.sessions.register("w1", 2, boot_id="b", session_lease_ms=60_000)  # supersedes it
    peer.send(_heartbeat(old, seq=2))
    assert peer.expect(m.HeartbeatAck).session_ended
    assert sent[-1] == ("HeartbeatAck", "")  # its session ended: forgotten before the answer


def test_a_refused_register_from_another_peer_keeps_the_remembered_peer(cluster_gateway):  # noqa: F811
    """Two processes presenting one key have one worker id: refusing the second one's Register
    (here: a protocol mismatch; a duplicate_worker refusal takes the same path) leaves the first one's
    peer remembered, so its nudges and stops still reach it."""
    h, peer = cluster_gateway
    session = h.ctx.control_side.dispatch.sessions.register("w1", 2, boot_id="b", session_lease_ms=60_000)
    _heard(h, peer, session)
    other = h.dealer(peer.sock.getsockopt_string(zmq.LAST_ENDPOINT))
    other.send(register_message("w1", "b2", protocol_min=0, protocol_max=0))
    ack = other.expect(m.Ack)
    assert (ack.of, ack.result) == ("register", "refused")
    h.directory.tell("gateway", ToWorkers(nudge=True))
    peer.expect(m.Nudge)  # the first process's peer is still its worker's


# -- peer faults: refused, never a crash (`errors.PeerFault`) -----------------------------------

def _started(session, lease_token: str) -> m.Started:
    return m.Started(request_id=new_id(), worker_id=session.worker_id, session_id=session.session_id,
                     session_generation=session.generation, run_id=new_id(), attempt_id=new_id(),
                     offer_id=new_id(), lease_generation=1, lease_token=lease_token, lease_version=1,
                     boot_id="b", pid=1234, pgid=1234, start_ticks=1)


def test_a_heartbeat_quoting_a_non_ascii_lease_token_is_refused_and_the_gateway_answers_on(cluster_gateway):  # noqa: F811
    """token_hash refuses the token (a PeerFault): the Gateway answers `refused` with the reason and
    keeps serving the same worker."""
    h, peer = cluster_gateway
    session = h.ctx.control_side.dispatch.sessions.register("w1", 2, boot_id="b", session_lease_ms=60_000)
    bad = m.LeaseRef(run_id=new_id(), attempt_id=new_id(), offer_id=new_id(), lease_generation=1,
                     lease_token="jeton-\u00e9")
    sent = m.Heartbeat(request_id=new_id(), worker_id=session.worker_id, session_id=session.session_id,
                       session_generation=session.generation, seq=1, free_slots=1,
                       worker_clock_ms=wall_ms(), renewals=[bad])
    peer.send(sent)
    ack = peer.expect(m.Ack)
    assert (ack.of, ack.answer_to, ack.result, ack.detail) == (
        "heartbeat", sent.request_id, "refused", "a callback token is ASCII base64url")
    peer.send(_heartbeat(session, seq=2))
    assert not peer.expect(m.HeartbeatAck).session_ended


def test_reports_with_a_bad_value_are_refused_one_by_one_and_the_others_answered(cluster_gateway):  # noqa: F811
    """Reports sent together may share a batch: the one whose token the domain refuses, and the one
    whose pid 0 the store refuses (BadInput), are each refused; the sound one (a fence quoting a run
    that does not exist) is answered `fenced` as usual."""
    h, peer = cluster_gateway
    session = h.ctx.control_side.dispatch.sessions.register("w1", 2, boot_id="b", session_lease_ms=60_000)
    non_ascii = _started(session, "jeton-\u00e9")
    pid_0 = dataclasses.replace(_started(session, "t" * 43), pid=0)
    sound = _started(session, "t" * 43)
    for report in (non_ascii, pid_0, sound):
        peer.send(report)
    answers = {ack.answer_to: ack for ack in (peer.expect(m.Ack) for _ in range(3))}
    assert answers[non_ascii.request_id].result == "refused"
    assert answers[non_ascii.request_id].detail == "a callback token is ASCII base64url"
    assert answers[pid_0.request_id].result == "refused"
    assert "pid must be a non-negative integer" in answers[pid_0.request_id].detail
    assert answers[sound.request_id].result == "fenced"
