"""Actor failure and restart: the Supervisor restarts each child, escalates a child that keeps
failing, and the bridge keeps serving timers and pidfd watches across a restart; a bridge loop
that dies stops the runtime (issue 9 §2; SEMANTICS.md §10).

Failures are real: a message type the test adds to an actor's handler table raises, so pykka
stops the actor and `on_failure` tells the Supervisor, exactly as any bug would.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import pykka
import pytest
import zmq

from qlactors import faults
from qlactors.executor.executor import Executor
from qlactors.executor.receipt_consumer import ReceiptConsumer
from qlactors.control import scheduler as scheduler_module
from qlactors.control.scheduler import Scheduler
from qlactors.control.recovery import Recovery
from qlactors.runtime.signals import ActorFailed, AttemptEnded, Consume, NoReceipt, StepDone, StepRequest, Tick
from qlactors.control.gateway import fence_of
from qlactors.runtime.supervisor import MAX_RESTARTS
from qlactors.profiles.edge import ORDER
from qlactors.domain.transitions import ErrorCode
from qlactors.wire import messages as m
from qlactors.wire.bridge import Bridge

from actor_harness import WAIT_S, ActorHarness, Stub, ack_message, leases, unique_endpoint, wait_until, welcome_message
from edge_harness import group_alive
from actor_rigs import ExecutorRig, Flights, ReceiptRig, new_token, spec
from qlactors.domain.receipt import token_hash
from restart_rig import Boom, breakable, make_rig  # noqa: F401 - fixtures


# -- restart and escalation, for every child ----------------------------------------------------


@pytest.mark.parametrize("name", [name for name, _ in ORDER])
def test_supervisor_restarts_a_failed_child_then_escalates_when_it_keeps_failing(make_rig, name, caplog):
    rig = make_rig(name)
    h = rig.h
    first = rig.factories[name]()
    assert h.directory.get(name) is first
    caplog.set_level(logging.WARNING, logger="qlactors.supervisor")
    current = first
    for n in range(MAX_RESTARTS):
        replacement = rig.fail(name)
        assert not current.is_alive()
        assert replacement.actor_class is first.actor_class
        current = replacement
        assert not h.ctx.fatal.event.is_set(), f"restart {n + 1} was fatal: {h.ctx.fatal.reason}"
    # The Supervisor registers the replacement before it logs the restart: wait for the lines.
    def restarted() -> int:
        return len([r for r in caplog.records if "event=actor_restarted" in r.getMessage()
                    and f"actor={name}" in r.getMessage()])
    wait_until(lambda: restarted() >= MAX_RESTARTS, what="the restart lines")
    assert restarted() == MAX_RESTARTS
    # One failure more within the window: the runtime stops, saying who and why.
    current.tell(Boom())
    wait_until(h.ctx.fatal.event.is_set, what="the escalation")
    assert h.ctx.fatal.reason.startswith(f"actor {name} failed {MAX_RESTARTS + 1} times")
    assert "boom" in h.ctx.fatal.reason
    assert rig.supervisor.is_alive()


def test_supervisor_escalates_a_failure_of_an_actor_it_cannot_restart(make_rig):
    rig = make_rig()  # no factories at all
    rig.supervisor.tell(ActorFailed("bridge", "gone"))
    wait_until(rig.h.ctx.fatal.event.is_set, what="the escalation")
    assert rig.h.ctx.fatal.reason == "actor bridge failed 1 times, last: gone"


def test_a_failure_of_the_supervisor_itself_stops_the_runtime(make_rig):
    rig = make_rig()
    rig.supervisor.tell(Boom())
    wait_until(rig.h.ctx.fatal.event.is_set, what="the fatal stop")
    assert rig.h.ctx.fatal.reason.startswith("the supervisor failed: RuntimeError('boom')")


# -- restarts while a timer or a pidfd watch is pending ----------------------------------------


def test_a_receipt_consumer_restarted_with_its_recheck_timer_pending_still_gets_it(make_rig):
    rig = make_rig("receipts", publish_grace_ms=400)
    h = rig.h
    h.stub("executor")
    h.start("receipts", ReceiptConsumer)
    h.directory.tell("receipts", Consume("run-1", "att-1"))  # no receipt yet: a recheck after the grace
    wait_until(lambda: h.bridge.timer_due("recheck:att-1") is not None, what="the recheck timer")
    rig.fail("receipts")
    assert h.bridge.timer_due("recheck:att-1") is not None  # still pending across the restart
    (told,) = h.inbox.wait("executor", NoReceipt)
    assert (told.run_id, told.attempt_id) == ("run-1", "att-1")
    assert h.bridge.is_alive()
    # ...and the bridge goes on serving timers afterwards.
    later = Stub.start("later", h.inbox)
    h._refs.append(later)
    h.directory.set("later", later)
    h.bridge.call_at("later", time.monotonic() + 0.05, h.directory.named("later"), "ping")
    assert h.inbox.wait("later", str) == ["ping"]


def test_a_scheduler_restarted_with_its_step_deadline_pending_goes_on_cycling(make_rig, monkeypatch):
    monkeypatch.setattr(scheduler_module, "STEP_DEADLINE_S", 0.3)
    rig = make_rig("scheduler")
    h = rig.h
    h.stub("recovery")  # silent: the step deadline is what ends a cycle
    h.start("scheduler", Scheduler)
    h.directory.tell("scheduler", Tick("test"))
    h.inbox.wait("recovery", StepRequest)
    assert h.bridge.timer_due("scheduler-step") is not None
    rig.fail("scheduler")
    # The old instance's deadline fires at the new one (a stale cycle: ignored) without harm...
    wait_until(lambda: h.bridge.timer_due("scheduler-step") is None, what="the stale deadline fired")
    assert h.bridge.is_alive()
    # ...and the new instance cycles, with a deadline the bridge serves: the silent step is reported.
    h.directory.tell("scheduler", Tick("test"))
    h.inbox.wait("recovery", StepRequest, count=2)
    # (recovery has no factory in this rig, so the Supervisor escalates what the Scheduler reports)
    wait_until(h.ctx.fatal.event.is_set, what="the silent step reported to the Supervisor")
    assert h.ctx.fatal.reason == "actor recovery failed 1 times, last: silent past its step deadline"


def test_an_executor_restarted_mid_stop_re_adopts_its_launcher_and_finishes_the_stop(make_rig):
    """A stop timer and a pidfd watch are pending when the Executor dies: the new instance gets the
    timer (and escalates to KILL), re-adopts the launcher from its journal and sees it end."""
    rig = make_rig("executor", "receipts", slots=1, kill_grace_ms=500)
    h = rig.h
    h.start("receipts", ReceiptConsumer)
    h.start("executor", Executor)
    exe = ExecutorRig(h, h.directory.get("executor"), rig.peer, rig.peer.expect(m.Register))
    # The job ignores TERM (and its children inherit that), so only the KILL after the grace ends it.
    offer, _act, started = exe.launch(["sh", "-c", "trap '' TERM; echo up; sleep 30"])
    exe.ack_started(started)
    wait_until(lambda: b"up" in h.config.logs_dir.joinpath(
        h.ctx.executor_side.logs.artifact_id(offer.run_id, offer.attempt_id)).read_bytes(), what="the job is up")
    rig.peer.send(m.StopRequested(run_id=offer.run_id, attempt_id=offer.attempt_id, reason="user",
                                  grace_ms=1500))
    key = f"stop:{offer.attempt_id}"
    wait_until(lambda: h.bridge.timer_due(key) is not None, what="the stop timer")
    rig.fail("executor")
    # The new instance registers; once welcomed it re-adopts the launcher from the journal.
    rig.peer.expect(m.Register)
    s = h.ctx.executor_side.session
    rig.peer.send(welcome_message(s))
    # The pending stop timer reaches the new instance, which sends KILL; the pidfd it re-watched
    # reports the launcher's end, and the receipt (or its absence) is reported.
    report = rig.peer.expect((m.Completed, m.Attest), timeout=WAIT_S, strict=False)
    assert report.attempt_id == offer.attempt_id
    assert h.bridge.is_alive()
    assert not h.ctx.fatal.event.is_set()
    wait_until(lambda: not group_alive(started.pgid), what="the job's group gone")


# -- the bridge loop itself -------------------------------------------------------------------------


def test_a_dead_target_never_ends_the_bridge_loop(tmp_path):
    ctx = zmq.Context()
    bridge = Bridge(ctx)
    stopped: list[str] = []
    bridge.on_exit = stopped.append
    received = threading.Event()

    class Dead:
        def tell(self, message):
            raise pykka.ActorDeadError("gone")

    class Alive:
        def tell(self, message):
            received.set()

    try:
        bridge.start()
        bridge.ready()
        r, w = os.pipe()
        bridge.watch(r, "pipe", Dead())
        bridge.call_at("dead", time.monotonic(), Dead(), "x")
        os.write(w, b"x")  # the "process" ends: the dead watcher is told, and fails
        wait_until(lambda: bridge.timer_due("dead") is None, what="the dead timer fired")
        bridge.call_at("alive", time.monotonic() + 0.05, Alive(), "y")
        assert received.wait(WAIT_S)
        assert bridge.is_alive() and stopped == []
        os.close(r)
        os.close(w)
    finally:
        bridge.close()
        ctx.term()
    assert stopped == []  # close() is not a failure


def test_a_bridge_loop_that_dies_stops_the_runtime_with_a_reason(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(faults, "_ACTIVE", "bridge_loop_on_nudge")
    monkeypatch.setattr(faults, "_raised", set())
    ctx = zmq.Context()
    endpoint = unique_endpoint("nudge")
    bridge = Bridge(ctx, nudge_bind=endpoint)
    stopped: list[str] = []
    bridge.on_exit = stopped.append
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    try:
        bridge.start()
        bridge.ready()
        push.connect(endpoint)
        push.send(b"nudge")
        bridge.join(WAIT_S)
        assert not bridge.is_alive()
        assert stopped == ["the bridge thread failed: InjectedFault('fault injected at bridge_loop_on_nudge'); "
                           "no socket, timer or process watch is served any more"]
        assert any("event=bridge_failed" in r.getMessage() for r in caplog.records)
    finally:
        push.close(0)
        bridge.close()
        ctx.term()


# -- an Executor restart, or a re-offer, with an offer in flight -----------------------------------


def test_an_executor_re_offered_an_attempt_it_holds_unactivated_accepts_it_again_and_runs_it(make_rig):
    """Same attempt id, new lease generation: the journal row and the log file are reused, the late
    refusal of the first Activate does not drop the second offer, and the job runs once."""
    rig = make_rig("executor", "receipts", slots=2)
    h = rig.h
    h.start("receipts", ReceiptConsumer)
    h.start("executor", Executor)
    exe = ExecutorRig(h, h.directory.get("executor"), rig.peer, rig.peer.expect(m.Register))
    pull = exe.welcome()
    h.repo.tasks.add(spec("job", ["sh", "-c", "echo once"]), actor_name="tester")
    run_id = h.repo.runs.request("job").run.id
    first = exe.offer_for(pull)
    assert len(pull.offers) == 2
    exe.send_offers(pull, first)  # one offer for two pairs: nothing more to offer now
    act1 = rig.peer.expect(m.Activate)
    rig.peer.send(m.Nudge())
    pull2 = rig.peer.expect(m.Pull)  # a second slot is free
    assert len(pull2.offers) == 1
    log_path = h.ctx.executor_side.logs.path_for(run_id, first.attempt_id)
    log_path.write_bytes(b"stale")
    # The control side withdraws the first lease before activating it, and offers the attempt again.
    assert h.ctx.control_side.dispatch.reports.decline(fence_of(act1, act1.worker_id), "declined").result == "applied"
    second = exe.offer_for(pull2)
    assert (second.attempt_id, second.lease_generation) == (first.attempt_id, 2)
    exe.send_offers(pull2, second)
    act2 = rig.peer.expect(m.Activate)
    assert (act2.attempt_id, act2.lease_generation, act2.offer_id) == (first.attempt_id, 2, second.offer_id)
    assert act2.callback_token_hash != act1.callback_token_hash
    assert log_path.read_bytes() == b""  # emptied for the new offer
    assert h.ctx.executor_side.journal.get(first.attempt_id).callback_token_hash == act2.callback_token_hash
    # The first Activate's answer (fenced) comes first and must not drop the second offer: it
    # names the first offer's id, not the current one.
    late = h.ctx.control_side.dispatch.reports.activate(fence_of(act1, act1.worker_id), act1.callback_token_hash, act1.log_artifact_id)
    assert late.result == "fenced"
    rig.peer.send(ack_message("activate", run_id, first.attempt_id, "fenced", "lease_released",
                              offer_id=act1.offer_id))
    exe.activate(act2)
    started = rig.peer.expect(m.Started, strict=False)  # a Pull for the free slot may come first
    h.track_group(started.pgid)
    exe.ack_started(started)
    completed = rig.peer.expect(m.Completed, strict=False)
    assert exe.ack_completed(completed) == "applied"
    assert h.repo.runs.get(run_id).state == "succeeded"
    assert log_path.read_bytes() == b"once\n"
    assert h.directory.get("executor").is_alive()


def test_a_restarted_executor_gives_back_the_offer_the_dead_instance_accepted(make_rig):
    """The dead instance journaled the offer (`accepted`) and never launched it: the new one clears
    the row and attests it holds nothing, so recovery can release the lease."""
    rig = make_rig("executor", slots=1)
    h = rig.h
    h.stub("receipts")
    h.start("executor", Executor)
    exe = ExecutorRig(h, h.directory.get("executor"), rig.peer, rig.peer.expect(m.Register))
    pull = exe.welcome()
    h.repo.tasks.add(spec("job"), actor_name="tester")
    run_id = h.repo.runs.request("job").run.id
    exe.send_offers(pull, exe.offer_for(pull))
    act = rig.peer.expect(m.Activate)
    assert h.ctx.executor_side.journal.get(act.attempt_id).state == "accepted"
    rig.fail("executor")
    rig.peer.expect(m.Register)
    s = h.ctx.executor_side.session
    rig.peer.send(welcome_message(s))
    attest = rig.peer.expect(m.Attest, strict=False)
    assert (attest.run_id, attest.attempt_id, attest.fact) == (run_id, act.attempt_id, "never_launched")
    assert h.ctx.executor_side.journal.get(act.attempt_id) is None
    rig.peer.expect(m.Pull, strict=False)  # its slot is free again
    # A late Activated for the dead instance's offer launches nothing.
    rig.peer.send(m.Activated(answer_to=act.request_id, run_id=run_id, attempt_id=act.attempt_id, offer_id=act.offer_id,
                              lease_version=1, deadline_at_ms=None))
    rig.peer.quiet()
    assert h.directory.get("executor").is_alive()


def test_a_restarted_worker_declines_the_unactivated_offers_it_does_not_know_and_keeps_the_one_it_does(make_rig):
    """Welcome after a resume lists the session's leases never activated (SEMANTICS.md §9 Offers).
    The dead instance accepted one offer (journalled: kept, `_adopt` gives it back) and never got
    the answer carrying another (its Pull's pair is journalled): that one is declined with the
    pair's token, so it is offered again at once. A lease whose pair the journal never held
    cannot be quoted: left to expire."""
    rig = make_rig("executor", slots=2)
    h = rig.h
    h.stub("receipts")
    h.start("executor", Executor)
    exe = ExecutorRig(h, h.directory.get("executor"), rig.peer, rig.peer.expect(m.Register))
    s = h.ctx.executor_side.session
    cluster = dict(session_lease_ms=60_000, run_lease_ms=60_000, heartbeat_ms=600_000,
                   resume_secret=new_token())  # a cluster session: its Pulls are journalled
    rig.peer.send(welcome_message(s, **cluster))
    pull = rig.peer.expect(m.Pull)
    for name in ("known", "lost", "stranger"):
        h.repo.tasks.add(spec(name), actor_name="tester")
        h.repo.runs.request(name)
    known = exe.offer_for(pull, 0)
    exe.send_offers(pull, known)
    assert rig.peer.expect(m.Activate).attempt_id == known.attempt_id
    rig.peer.send(m.Nudge())
    second = rig.peer.expect(m.Pull)  # for the other slot, journalled before it was sent
    assert [p.pull_id for p in h.ctx.executor_side.journal.open_pulls()] == [second.pull_id]
    lost = exe.offer_for(second, 0)  # leased in the database; its Offers answer never arrives
    stranger = h.ctx.control_side.dispatch.offers.one(s.worker_id, s.session_id, s.generation, "no-such-pair", token_hash(new_token()),
                                    log_cap_bytes=0)
    rig.fail("executor")
    register = rig.peer.expect(m.Register)
    assert register.resume_session_id == s.session_id
    unactivated = [m.Unactivated(run_id=u.run_id, attempt_id=u.attempt_id, offer_id=u.offer_id,
                                 lease_generation=u.lease_generation)
                   for u in h.ctx.control_side.dispatch.sessions.unactivated_leases(s.session_id)]
    assert {u.attempt_id for u in unactivated} == {known.attempt_id, lost.attempt_id, stranger.attempt_id}
    rig.peer.send(welcome_message(s, resumed=True, unactivated=unactivated, **cluster))
    decline = rig.peer.expect(m.Decline, strict=False)
    assert (decline.attempt_id, decline.offer_id, decline.reason) == (lost.attempt_id, lost.offer_id,
                                                                      "unknown_after_restart")
    assert decline.lease_token == second.offers[0].lease_token
    assert h.ctx.control_side.dispatch.reports.decline(fence_of(decline, decline.worker_id)).result == "applied"
    assert [(l["status"], l["release_reason"]) for l in leases(h.repo, lost.run_id)] == [("released", "declined")]
    attest = rig.peer.expect(m.Attest, strict=False)  # the known offer: given back, not declined
    assert (attest.attempt_id, attest.fact) == (known.attempt_id, "never_launched")
    rig.peer.expect(m.Pull, strict=False)
    rig.peer.quiet()
    assert not any(isinstance(msg, m.Decline) for msg in rig.peer.pending)
    assert [l["status"] for l in leases(h.repo, stranger.run_id)] == ["leased"]  # to expire
    assert second.pull_id not in {p.pull_id for p in h.ctx.executor_side.journal.open_pulls()}  # stale: forgotten


def test_a_receipt_consumer_restarted_before_its_answer_still_removes_the_receipt(make_rig):
    """The Completed went out, the consumer died, the completion committed: the new instance takes
    the late `applied` answer and removes the receipt and journal row, as the old one would have."""
    rig = make_rig("receipts")
    h = rig.h
    h.stub("executor")
    h.start("receipts", ReceiptConsumer)
    receipts = ReceiptRig(h, h.directory.get("receipts"), rig.peer)
    token = new_token()
    run_id, attempt_id = receipts.journalled_attempt(token)
    path = receipts.plant(run_id, attempt_id, token, exit_code=0)
    h.directory.tell("receipts", Consume(run_id, attempt_id))
    completed = rig.peer.expect(m.Completed)
    rig.fail("receipts")
    assert receipts.answer(completed) == "applied"
    wait_until(lambda: not path.exists() and h.ctx.executor_side.journal.get(attempt_id) is None,
               what="the receipt and its journal row removed")
    assert h.repo.runs.get(run_id).state == "succeeded"


def _journal(h: ActorHarness, run_id: str, attempt_id: str, state: str) -> None:
    """The executor's journal row of an attempt it holds (`accepted`: offered; `launching`: activated)."""
    h.ctx.executor_side.journal.accept(attempt_id, run_id, str(h.ctx.executor_side.logs.path_for(run_id, attempt_id)),
                         str(h.ctx.executor_side.receipts.final_path(attempt_id)), token_hash(new_token()))
    if state != "accepted":
        h.ctx.executor_side.journal.set_state(attempt_id, state)


def test_a_recovery_restarted_after_an_attest_still_judges_the_attempt_it_was_told_about(make_rig):
    """The dead instance had been told an attempt ended; the new one looks at every `running`
    attempt again, so the ended one becomes `lost` instead of staying `running` for ever, while a
    healthy one, and an offered or starting one the Executor holds, are left alone."""
    rig = make_rig("recovery", session_capacity=64)
    h = rig.h
    h.stub("scheduler")
    h.start("recovery", Recovery)
    flights = Flights(h, h.ctx.executor_side.session)
    _, live = h.spawn_sleep(30)
    ended = flights.make("running", h.dead_identity())
    healthy = flights.make("running", live)
    offered = flights.make("claimed")
    _journal(h, *offered, "accepted")  # a healthy offer in flight: the Executor holds it
    starting = flights.make("starting")
    _journal(h, *starting, "launching")
    h.directory.tell("recovery", AttemptEnded(*ended))
    rig.fail("recovery")
    h.inbox.wait("scheduler", Tick, count=2, where=lambda t: t.reason == "recovery_resumed")  # each instance
    h.directory.tell("recovery", StepRequest(1))
    (done,) = h.inbox.wait("scheduler", StepDone)
    assert done.ok
    run = h.repo.runs.get(ended[0])
    assert (run.state, run.attempts[0].error_code) == ("lost", ErrorCode.RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT)
    assert h.repo.runs.get(healthy[0]).state == "running"
    assert [lease["status"] for lease in leases(h.repo, offered[0])] == ["leased"]
    assert h.repo.runs.get(starting[0]).attempts[0].state == "starting"


def test_a_recovery_restarted_before_a_give_back_still_frees_the_slot_of_an_unheld_claim(make_rig):
    """The Executor gave back a claim and an activated attempt it never launched (no journal row:
    it holds neither), but the Attest reached a Recovery that was being restarted: the new one
    takes both back, so the claim's lease is released (it is offered again) and the unlaunched
    attempt is judged, instead of their leases holding slots for ever."""
    rig = make_rig("recovery", session_capacity=64)
    h = rig.h
    h.stub("scheduler")
    h.start("recovery", Recovery)
    flights = Flights(h, h.ctx.executor_side.session)
    given_back = flights.make("claimed")
    never_launched = flights.make("starting")
    old = h.directory.get("recovery")
    old.tell(Boom())
    h.directory.tell("recovery", AttemptEnded(*given_back))  # lost with the dying instance
    h.directory.tell("recovery", AttemptEnded(*never_launched))
    h.inbox.wait("scheduler", Tick, count=2, where=lambda t: t.reason == "recovery_resumed")  # each instance
    assert h.directory.get("recovery") is not old
    h.directory.tell("recovery", StepRequest(1))
    (done,) = h.inbox.wait("scheduler", StepDone)
    assert done.ok
    assert [lease["status"] for lease in leases(h.repo, given_back[0])] == ["released"]
    assert h.repo.runs.get(given_back[0]).state == "dispatching"  # offered again, never lost
    run = h.repo.runs.get(never_launched[0])
    assert (run.state, run.attempts[0].error_code) == ("lost", ErrorCode.RECOVERY_IDENTITY_MISSING)
    assert [lease["status"] for lease in leases(h.repo, never_launched[0])] != ["leased"]


# -- a ReceiptConsumer restart with a Consume lost, or told while no instance is alive ------------


def test_a_receipt_consumer_restarted_with_a_consume_queued_still_consumes_that_receipt(make_rig):
    """pykka drops what was queued for the dead instance, and the Executor has already forgotten
    the attempt: the new instance looks again at every journaled launcher that is not running,
    so the receipt is consumed and the run ends (with slots = 1 it would wedge the runtime)."""
    rig = make_rig("receipts")
    h = rig.h
    h.stub("executor")
    h.start("receipts", ReceiptConsumer)
    receipts = ReceiptRig(h, h.directory.get("receipts"), rig.peer)
    token = new_token()
    run_id, attempt_id = receipts.journalled_attempt(token)
    h.ctx.executor_side.journal.set_state(attempt_id, "started", identity=h.dead_identity())
    path = receipts.plant(run_id, attempt_id, token, exit_code=3)
    _, live = h.spawn_sleep(30)  # a launcher still running: the Executor watches it, left alone
    running_run, running_attempt = receipts.journalled_attempt(new_token())
    h.ctx.executor_side.journal.set_state(running_attempt, "started", identity=live)
    old = h.directory.get("receipts")
    old.tell(Boom())
    old.tell(Consume(run_id, attempt_id))  # the Executor's tell, queued behind the failure: dropped
    completed = rig.peer.expect(m.Completed, strict=False)
    assert (completed.run_id, completed.attempt_id, completed.exit_code) == (run_id, attempt_id, 3)
    assert h.directory.get("receipts") is not old
    assert receipts.answer(completed) == "applied"
    wait_until(lambda: not path.exists() and h.ctx.executor_side.journal.get(attempt_id) is None,
               what="the receipt and its journal row removed")
    assert h.repo.runs.get(run_id).state == "failed"  # exit code 3, no retry policy
    rig.peer.quiet()  # nothing about the running one
    assert h.ctx.executor_side.journal.get(running_attempt).state == "started"
    assert h.inbox.items("executor", NoReceipt) == []


def test_an_executor_whose_consume_finds_no_receipt_consumer_tells_it_again_once_one_is_up(make_rig):
    """The launcher ends while the ReceiptConsumer is being restarted (no live instance under its
    name): the Executor, which has forgotten the attempt, keeps the Consume and repeats it."""
    rig = make_rig("executor", slots=1)
    h = rig.h
    h.start("executor", Executor)
    exe = ExecutorRig(h, h.directory.get("executor"), rig.peer, rig.peer.expect(m.Register))
    offer, _act, started = exe.launch(["sh", "-c", "exit 0"])
    exe.ack_started(started)
    wait_until(lambda: offer.attempt_id not in h.directory.get("executor").proxy().slots.live.get(),
               what="the launcher's end seen by the Executor")
    assert h.directory.get("receipts") is None
    h.stub("receipts")  # a new instance takes the name
    (told,) = h.inbox.wait("receipts", Consume)
    assert (told.run_id, told.attempt_id, told.stopped_by) == (offer.run_id, offer.attempt_id, "exit")
