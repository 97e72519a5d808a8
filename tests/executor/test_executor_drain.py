"""A worker's drain at SIGTERM (SEMANTICS.md §9 Drain), at the Executor: `DrainSession` (what the
worker profile sends at SIGTERM) declines the offer accepted and never launched, leaves the
session `draining` then `offline`, and keeps the running job running; an offer activated meanwhile
is never launched and is given back; an unreachable replica never holds the drain's caller.

The Executor and the ReceiptConsumer are real, on a cluster session of the harness's store; the
test peer plays the control side with the real store decisions (`ClusterSessions.leave`, the
store's `decline`), as a replica answers them.
"""

from __future__ import annotations

import threading

from sqlalchemy import select

from qlactors.control.gateway import Gateway, fence_of
from qlactors.runtime.signals import DrainSession
from qlactors.process.identity import Liveness, probe
from qlactors.store.schema import worker_sessions
from qlactors.wire import messages as m

from actor_harness import ActorHarness, ack_message, attempt_row, leases, unique_endpoint
from actor_rigs import spec
from cluster_rigs import ClusterRig, held_job, make_rig, ready  # noqa: F401 (fixture)
from cluster_rigs import cluster_gateway, leave_of  # noqa: F401 - fixtures


def second_offer(rig: ClusterRig, session) -> tuple[m.Offer, m.Activate]:
    """With one job running in a 2-slot worker: a Nudge, the Pull for the free slot, an offer of
    another task; the executor accepts it and asks to activate it (left unanswered)."""
    rig.peer.send(m.Nudge())
    pull = rig.peer.expect(m.Pull, strict=False)
    assert (pull.session_id, len(pull.offers)) == (session.session_id, 1)
    rig.repo.tasks.add(spec("other", ["/bin/true"]), actor_name="tester")
    rig.repo.runs.request("other")
    offer = rig.offer_for(pull)
    rig.send_offers(pull, offer)
    activate = rig.peer.expect(m.Activate, strict=False)
    assert activate.attempt_id == offer.attempt_id
    return offer, activate


def answer_leave(rig: ClusterRig, leave: m.Leave) -> m.Ack:
    outcome = rig.control.leave(leave, rig.worker_id)
    ack = ack_message("leave", "", "", outcome.result, outcome.detail or "", answer_to=leave.request_id)
    rig.peer.send(ack)
    return ack


def answer_decline(rig: ClusterRig, decline: m.Decline) -> m.Ack:
    outcome = rig.ctx.control_side.dispatch.reports.decline(fence_of(decline, decline.worker_id))
    ack = ack_message("decline", decline.run_id, decline.attempt_id, outcome.result, outcome.detail or "",
                      offer_id=decline.offer_id, answer_to=decline.request_id)
    rig.peer.send(ack)
    return ack


def live_ids(rig: ClusterRig) -> list[str]:
    return sorted(rig.ref.proxy().slots.live.get())


def session_row(rig: ClusterRig, session_id: str):
    with rig.repo.store.read() as conn:
        return conn.execute(select(worker_sessions).where(worker_sessions.c.session_id == session_id)).one()


def test_a_drain_declines_the_unlaunched_offer_leaves_the_session_and_keeps_the_job_running(make_rig):
    rig = make_rig(slots=2)
    s1 = rig.new_session()
    _offer, _pull, started = rig.launch_on(s1, held_job(rig))
    ready(rig)
    waiting, _activate = second_offer(rig, s1)
    assert rig.ctx.executor_side.journal.get(waiting.attempt_id).state == "accepted"

    done = threading.Event()
    rig.ref.tell(DrainSession(done))
    leave = rig.peer.expect(m.Leave, strict=False)
    assert (leave.session_id, leave.session_generation, leave.status) == (s1.session_id, s1.generation, "draining")
    decline = rig.peer.expect(m.Decline, strict=False)
    assert (decline.attempt_id, decline.offer_id, decline.reason) == (waiting.attempt_id, waiting.offer_id,
                                                                      "draining")
    assert answer_leave(rig, leave).result == "applied"
    assert session_row(rig, s1.session_id).status == "draining"
    assert not done.is_set()  # `offline` waits for the decline's answer
    assert answer_decline(rig, decline).result == "applied"
    offline = rig.peer.expect(m.Leave, strict=False)
    assert (offline.session_id, offline.status) == (s1.session_id, "offline")
    assert not done.is_set()
    assert answer_leave(rig, offline).result == "applied"
    assert done.wait(5)

    row = session_row(rig, s1.session_id)
    assert row.status == "offline" and row.drained_at_ms is not None and row.ended_at_ms is not None
    # The declined offer: released `declined`, its attempt still `claimed`, offered again.
    assert attempt_row(rig.repo, waiting.attempt_id).status == "claimed"
    assert [(l["status"], l["release_reason"]) for l in leases(rig.repo, waiting.run_id)] == [
        ("released", "declined")]
    assert rig.ctx.executor_side.journal.get(waiting.attempt_id) is None
    # The running job was not touched: still running, journalled for the restart, still held.
    assert probe(rig.ctx.executor_side.journal.get(started.attempt_id).identity, current_boot_id=rig.ctx.executor_side.boot_id()) \
        is Liveness.RUNNING
    assert rig.ctx.executor_side.journal.get(started.attempt_id).state == "started"
    assert attempt_row(rig.repo, started.attempt_id).status == "running"
    assert live_ids(rig) == [started.attempt_id]


def test_an_offer_activated_before_its_decline_is_never_launched_and_is_given_back(make_rig):
    rig = make_rig(slots=2)
    s1 = rig.new_session()
    rig.launch_on(s1, held_job(rig))
    ready(rig)
    waiting, activate = second_offer(rig, s1)
    # The replica applied Activate before the drain's Decline; its answer arrives after SIGTERM.
    result = rig.ctx.control_side.dispatch.reports.activate(fence_of(activate, activate.worker_id), activate.callback_token_hash,
                                       activate.log_artifact_id)
    assert result.result == "applied"

    done = threading.Event()
    rig.ref.tell(DrainSession(done))
    answer_leave(rig, rig.peer.expect(m.Leave, strict=False))
    decline = rig.peer.expect(m.Decline, strict=False)
    rig.peer.send(m.Activated(answer_to=activate.request_id, run_id=activate.run_id, attempt_id=activate.attempt_id, offer_id=activate.offer_id,
                              lease_version=result.value.lease_version, deadline_at_ms=result.value.deadline_at_ms))
    ack = answer_decline(rig, decline)
    assert (ack.result, ack.detail) == ("refused", "attempt_starting")
    given_back = rig.peer.expect(m.Attest, strict=False)
    assert (given_back.attempt_id, given_back.fact) == (waiting.attempt_id, "never_launched")
    assert given_back.lease is not None and given_back.lease.offer_id == waiting.offer_id
    assert rig.peer.expect(m.Leave, strict=False).status == "offline"
    # Its journal row stays `accepted`: a restart gives it back again if this attestation was lost.
    assert rig.ctx.executor_side.journal.get(waiting.attempt_id).state == "accepted"
    assert waiting.attempt_id not in live_ids(rig)
    assert attempt_row(rig.repo, waiting.attempt_id).status == "starting"  # launched nowhere
    assert not any(isinstance(msg, m.Started) for msg in rig.peer.pending)


def test_offers_answering_a_pull_sent_before_the_drain_are_declined(make_rig):
    rig = make_rig(slots=1)
    s1 = rig.new_session()
    rig.welcome_to(s1)
    pull = rig.peer.expect(m.Pull)
    rig.repo.tasks.add(spec("job", ["/bin/true"]), actor_name="tester")
    rig.repo.runs.request("job")
    offer = rig.offer_for(pull)  # leased in the store; its answer reaches the worker after SIGTERM

    done = threading.Event()
    rig.ref.tell(DrainSession(done))
    leave = rig.peer.expect(m.Leave, strict=False)
    rig.send_offers(pull, offer)
    decline = rig.peer.expect(m.Decline, strict=False)
    assert (decline.attempt_id, decline.offer_id, decline.lease_token) == (
        offer.attempt_id, offer.offer_id, pull.offers[0].lease_token)
    assert answer_leave(rig, leave).result == "applied"
    assert answer_decline(rig, decline).result == "applied"
    assert answer_leave(rig, rig.peer.expect(m.Leave, strict=False)).result == "applied"
    assert done.wait(5)
    assert rig.ctx.executor_side.journal.get(offer.attempt_id) is None and rig.ctx.executor_side.journal.open_pulls() == []
    assert [(l["status"], l["release_reason"]) for l in leases(rig.repo, offer.run_id)] == [
        ("released", "declined")]


def test_a_drain_whose_leave_is_never_answered_does_not_finish(make_rig):
    """The profile waits for `done` a bounded time only (worker.py LEAVE_SHARE): the Executor
    itself never pretends the session was left."""
    rig = make_rig(slots=1)
    s1 = rig.new_session()
    rig.welcome_to(s1)
    rig.peer.expect(m.Pull)
    done = threading.Event()
    rig.ref.tell(DrainSession(done))
    assert rig.peer.expect(m.Leave, strict=False).status == "draining"
    assert not done.wait(0.5)
    assert session_row(rig, s1.session_id).status == "online"  # unanswered: nothing was applied


# -- the Gateway's side: a Leave applied with Sessions.end, on SQLite and PostgreSQL ---------------


def test_the_gateway_applies_a_leave_from_the_current_session_and_fences_a_superseded_one(cluster_gateway):
    h, peer = cluster_gateway
    dispatch = h.ctx.control_side.dispatch
    old = dispatch.sessions.register("w1", 2, boot_id="b", session_lease_ms=60_000)
    current = dispatch.sessions.register("w1", 2, boot_id="b", session_lease_ms=60_000)
    peer.send(leave_of(old, "draining"))
    fenced = peer.expect(m.Ack)
    assert (fenced.of, fenced.result, fenced.detail) == ("leave", "fenced", "superseded")
    for status in ("draining", "offline", "offline"):
        peer.send(leave_of(current, status))
        ack = peer.expect(m.Ack)
        assert (ack.of, ack.result) == ("leave", "applied")
    assert ack.detail == "already_offline"  # the repeat
    with h.repo.store.read() as conn:
        rows = {r.session_id: r for r in conn.execute(select(worker_sessions))}
    assert rows[current.session_id].status == "offline" and rows[current.session_id].drained_at_ms is not None
    assert rows[old.session_id].drained_at_ms is None  # the fenced Leave changed nothing


def test_an_edge_gateway_refuses_a_leave_its_session_lives_with_the_process(tmp_path):
    endpoint = unique_endpoint("control")
    h = ActorHarness(tmp_path, control_bind=endpoint)
    try:
        h.bridge.route_control(h.directory.named("gateway"))
        for name in ("recovery", "scheduler", "supervisor"):
            h.stub(name)
        h.start_bridge()
        h.start("gateway", Gateway)
        peer = h.dealer(endpoint)
        peer.send(leave_of(h.ctx.executor_side.session, "offline"))
        ack = peer.expect(m.Ack)
        assert (ack.of, ack.result) == ("leave", "refused")
        with h.repo.store.read() as conn:
            assert conn.execute(select(worker_sessions.c.status)).scalars().all() == ["online"]
    finally:
        h.close()
