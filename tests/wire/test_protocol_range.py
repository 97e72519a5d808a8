"""Register/Welcome negotiate the protocol range 4..5 (issue 26), so replicas and workers are upgraded
one at a time: a protocol-4 worker against a protocol-5 replica (the real Gateway), and a
protocol-5 worker (the real Executor) against a protocol-4 replica. Each side's frames are read
as a protocol-4 peer reads them: any protocol-5 frame is refused by its header."""

from __future__ import annotations

from qlactors.ids import new_id
from qlactors.runtime.signals import HeartbeatDue
from qlactors.wire import codec
from qlactors.wire import messages as m

from actor_harness import register_message
from actor_rigs import BOOT_ID, sup  # noqa: F401 - fixture
from cluster_rigs import LEASES, make_rig  # noqa: F401 - fixture

V4 = range(4, 5)  # what a protocol-4 release reads


def test_a_protocol_4_worker_is_answered_in_protocol_4_by_a_protocol_5_replica(sup):  # noqa: F811
    worker = sup.session.worker_id
    sup.peer.send_frames(codec.encode(register_message(worker, BOOT_ID, protocol_min=4, protocol_max=4), 4))
    welcome = codec.decode(sup.peer.recv_frames(), V4)
    assert isinstance(welcome, m.Welcome)
    assert (welcome.protocol, welcome.heartbeat_seq) == (4, None)  # the field 5 added is not sent
    pull = m.Pull(request_id=new_id(), worker_id=worker, session_id=welcome.session_id,
                  session_generation=welcome.session_generation, pull_id=new_id(),
                  offers=[m.OfferSlot(offer_id=new_id(), lease_token="t" * 43)])
    sup.peer.send_frames(codec.encode(pull, 4))
    offers = codec.decode(sup.peer.recv_frames(), V4)
    assert isinstance(offers, m.Offers) and offers.answer_to == pull.request_id
    # A protocol-5 worker on the same replica agrees 5 and gets the stored heartbeat number.
    assert sup.register(protocol_min=4, protocol_max=5).protocol == 5


def test_a_protocol_5_worker_speaks_protocol_4_to_a_protocol_4_replica(make_rig):  # noqa: F811
    rig = make_rig()
    assert rig.register.protocol_min == 4 and rig.register.protocol_max == 5
    session = rig.new_session()
    # The replica speaks 4 only: a Welcome of protocol 4 (no heartbeat_seq), written in 4.
    welcome = m.Welcome(answer_to=rig.register.request_id, worker_id=session.worker_id,
                        session_id=session.session_id, session_generation=session.generation, resumed=False,
                        resume_secret=rig.secrets[session.session_id], protocol=4, unactivated=[], **LEASES)
    rig.peer.send_frames(codec.encode(welcome, 4))
    pull = codec.decode(rig.peer.recv_frames(), V4)  # the worker's requests: all protocol-4 frames
    assert isinstance(pull, m.Pull)
    rig.ref.tell(HeartbeatDue())
    beat = codec.decode(rig.peer.recv_frames(), V4)
    assert isinstance(beat, m.Heartbeat)
    ack, _stops = rig.control.heartbeat(beat, rig.worker_id)
    assert ack.last_seq is None and not ack.session_ended
    rig.peer.send_frames(codec.encode(ack, 4))
    rig.peer.quiet()  # answered: nothing more to say, no refusal, no new Register
