"""A worker's re-attestation (SEMANTICS.md §9 Re-attest, §10 evidence): after a re-register inside
a running worker its live jobs are re-attested `running` and keep running; after a start every
journal row is attested with the fact its evidence gives (`launch_unknown` is never `ended`,
unreadable /proc is no fact); an attestation the control side fences is acted on.

The Executor and the ReceiptConsumer are real, on a cluster session (`session_lease_ms` set) of
the harness's store; the test peer plays the control side with the real store decisions
(`ClusterSessions`: heartbeats, renewals and attestations as a replica answers them).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest


from qlactors.control.gateway import fence_of
from qlactors.runtime.signals import Consume, HeartbeatDue, NoReceipt, Resume
from qlactors.domain.receipt import token_hash
from qlactors.ids import new_id
from qlactors.process.identity import Liveness
from qlactors.wire import messages as m
from qlactors.executor import evidence
from qlactors.executor.adoption import ASK_UNDECIDED_EVERY
from qlactors.executor.journal.records import LeaseFacts
from qlactors.store.cadence.cluster_recovery import ClusterRecoveryCases
from qlactors.store.dispatch.evidence import ConfirmStopped

from actor_harness import ActorHarness, attempt_row, leases, wait_until
from session_steps import expire_lease
from actor_rigs import BOOT_ID, new_token, spec
from cluster_rigs import LEASES, ClusterRig, make_rig, held_job, ready, release, end_session_by_heartbeat  # noqa: F401 - fixtures


def test_a_re_register_re_attests_the_running_job_which_keeps_running_and_completes(make_rig, caplog):
    caplog.set_level(logging.INFO, logger="qlactors")
    rig = make_rig()
    s1 = rig.new_session()
    offer, pull, started = rig.launch_on(s1, held_job(rig))
    ready(rig)
    beat = rig.heartbeat()
    assert [r.offer_id for r in beat.renewals] == [offer.offer_id]
    assert rig.answer_heartbeat(beat).renewed

    s2 = end_session_by_heartbeat(rig)
    rig.welcome_to(s2)
    attest = rig.peer.expect(m.Attest, strict=False)
    # From the new session, quoting the old session's lease, with a fresh slot and the identity.
    assert (attest.session_id, attest.session_generation, attest.fact) == (s2.session_id, s2.generation, "running")
    assert (attest.lease.offer_id, attest.lease.lease_generation, attest.lease.lease_token) == (
        offer.offer_id, offer.lease_generation, pull.offers[0].lease_token)
    assert (attest.lease_session_id, attest.lease_session_generation) == (s1.session_id, s1.generation)
    assert (attest.pid, attest.pgid, attest.start_ticks) == (started.pid, started.pgid, started.start_ticks)
    assert attest.new_slot is not None and attest.new_slot.offer_id != offer.offer_id
    # Until the answer, its old-session lease is not renewed (it would be fenced).
    held = rig.heartbeat()
    assert (held.session_id, held.renewals) == (s2.session_id, [])
    rig.answer_heartbeat(held)

    answer = rig.answer_attest(attest)
    assert (answer.result, answer.lease_generation) == ("applied", offer.lease_generation + 1)
    wait_until(lambda: rig.ctx.executor_side.journal.get(offer.attempt_id).lease.session_id == s2.session_id,
               what="the journal re-bound")
    entry = rig.ctx.executor_side.journal.get(offer.attempt_id)
    assert (entry.lease.offer_id, entry.lease.lease_token, entry.lease.lease_generation) == (
        attest.new_slot.offer_id, attest.new_slot.lease_token, answer.lease_generation)
    beat = rig.heartbeat()
    assert [(r.offer_id, r.lease_generation) for r in beat.renewals] == [
        (attest.new_slot.offer_id, answer.lease_generation)]
    ack = rig.answer_heartbeat(beat)
    assert (ack.session_ended, ack.fenced, len(ack.renewed)) == (False, [], 1)

    release(rig)
    completed = rig.peer.expect(m.Completed, strict=False)
    assert (completed.exit_code, completed.stopped_by) == (0, "exit")  # never signalled
    assert rig.ack_completed(completed) == "applied"
    run = rig.repo.runs.get(offer.run_id)
    assert (run.state, run.attempts[0].exit_code, len(run.attempts)) == ("succeeded", 0, 1)
    assert [(l["status"], l["session_id"]) for l in leases(rig.repo, offer.run_id)] == [
        ("released", s1.session_id), ("completed", s2.session_id)]
    assert "event=stop_term" not in caplog.text and "event=lease_fenced" not in caplog.text


def test_a_re_register_gives_back_an_accepted_offer_that_was_never_launched(make_rig):
    rig = make_rig()
    s1 = rig.new_session()
    rig.welcome_to(s1)
    pull = rig.peer.expect(m.Pull)
    rig.repo.tasks.add(spec("job"), actor_name="tester")
    rig.repo.runs.request("job")
    offer = rig.offer_for(pull)
    rig.send_offers(pull, offer)
    act = rig.peer.expect(m.Activate)  # never answered: the session ends first
    s2 = end_session_by_heartbeat(rig)
    rig.welcome_to(s2)
    attest = rig.peer.expect(m.Attest, strict=False)
    assert (attest.attempt_id, attest.fact, attest.lease.offer_id, attest.lease_session_id) == (
        offer.attempt_id, "never_launched", offer.offer_id, s1.session_id)
    answer = rig.answer_attest(attest)
    assert (answer.result, answer.detail) == ("applied", "released")
    # The claim is given back at once (SEMANTICS.md §10), not held until its offer expires.
    (lease,) = leases(rig.repo, offer.run_id)
    assert (lease["status"], lease["release_reason"], lease["version"]) == ("released", "declined", 2)
    assert attempt_row(rig.repo, offer.attempt_id).evidence is None
    assert rig.ctx.executor_side.journal.get(offer.attempt_id) is None
    rig.peer.expect(m.Pull, strict=False)  # its slot is free again
    # A late Activated for the old session's offer launches nothing.
    assert rig.ctx.control_side.dispatch.reports.activate(fence_of(act, act.worker_id), act.callback_token_hash,
                                     act.log_artifact_id).result == "fenced"
    rig.peer.send(m.Activated(answer_to=act.request_id, run_id=offer.run_id, attempt_id=offer.attempt_id, offer_id=offer.offer_id,
                              lease_version=1, deadline_at_ms=None))
    rig.peer.quiet()


def test_a_running_re_attest_fenced_by_a_lease_no_longer_held_stops_the_job_by_identity(make_rig, caplog):
    rig = make_rig()
    s1 = rig.new_session()
    offer, _pull, _started = rig.launch_on(s1, held_job(rig))
    ready(rig)
    s2 = end_session_by_heartbeat(rig)
    rig.welcome_to(s2)
    attest = rig.peer.expect(m.Attest, strict=False)
    rig.peer.send(m.Attested(answer_to=attest.request_id, run_id=attest.run_id, attempt_id=attest.attempt_id, fact="running",
                             result="fenced", offer_id=None, lease_generation=None, lease_version=None,
                             lease_expires_at_ms=None, detail="lease_released"))
    completed = rig.peer.expect(m.Completed, strict=False)
    assert (completed.attempt_id, completed.exit_code, completed.stopped_by) == (offer.attempt_id, 143, "term")
    assert "event=rebind_refused_process_stopped" in caplog.text


def test_a_running_re_attest_fenced_by_its_session_is_attested_again_from_the_next_one(make_rig, caplog):
    rig = make_rig()
    s1 = rig.new_session()
    offer, pull, _started = rig.launch_on(s1, held_job(rig))
    ready(rig)
    s2 = end_session_by_heartbeat(rig)
    rig.welcome_to(s2)
    first = rig.peer.expect(m.Attest, strict=False)
    s3 = rig.new_session()  # s2 ends before its attestation is answered
    assert rig.answer_attest(first).result == "fenced"
    rig.peer.quiet()  # not stopped, nothing renewed
    assert "event=rebind_fenced_by_session" in caplog.text
    rig.answer_heartbeat(rig.heartbeat())  # session ended: registers anew
    rig.peer.expect(m.Register, strict=False)
    rig.welcome_to(s3)
    again = rig.peer.expect(m.Attest, strict=False)
    assert (again.session_id, again.fact, again.lease.offer_id, again.lease.lease_token, again.lease_session_id) == (
        s3.session_id, "running", offer.offer_id, pull.offers[0].lease_token, s1.session_id)
    assert rig.answer_attest(again).result == "applied"
    release(rig)
    completed = rig.peer.expect(m.Completed, strict=False)
    assert (completed.exit_code, rig.ack_completed(completed)) == (0, "applied")


# -- the facts of journal rows after a start --------------------------------------------------


def _leased_attempt(h: ActorHarness, session, state: str, identity=None) -> tuple[str, str, LeaseFacts]:
    """An attempt offered to (and activated by) `session`, journalled in `state` as the dead
    instance left it."""
    h.repo.tasks.add(spec("job"), actor_name="tester")
    run_id = h.repo.runs.request("job").run.id
    offer_id, lease_token, callback = new_id(), new_token(), new_token()
    view = h.ctx.control_side.dispatch.offers.one(session.worker_id, session.session_id, session.generation, offer_id,
                                token_hash(lease_token), log_cap_bytes=0)
    lease = LeaseFacts(offer_id, view.lease_generation, lease_token, session.session_id, session.generation)
    attempt_id = view.attempt_id
    act = m.Activate(request_id=new_id(), worker_id=session.worker_id, session_id=session.session_id,
                     session_generation=session.generation, run_id=run_id, attempt_id=attempt_id,
                     offer_id=offer_id, lease_generation=view.lease_generation, lease_token=lease_token,
                     lease_version=view.lease_version, callback_token_hash=token_hash(callback),
                     log_artifact_id=h.ctx.executor_side.logs.artifact_id(run_id, attempt_id))
    assert h.ctx.control_side.dispatch.reports.activate(fence_of(act, session.worker_id), act.callback_token_hash,
                                   act.log_artifact_id).result == "applied"
    h.ctx.executor_side.journal.accept(attempt_id, run_id, str(h.ctx.executor_side.logs.path_for(run_id, attempt_id)),
                         str(h.ctx.executor_side.receipts.final_path(attempt_id)), token_hash(callback), lease)
    h.ctx.executor_side.journal.set_state(attempt_id, state, identity=identity)
    return run_id, attempt_id, lease


def _first_session(h: ActorHarness):
    return h.ctx.control_side.dispatch.sessions.register(h.ctx.executor_side.session.worker_id, 1, boot_id=BOOT_ID,
                                           session_lease_ms=LEASES["session_lease_ms"])


def test_a_launching_row_without_a_marker_is_attested_launch_unknown_never_ended_never_relaunched(make_rig):
    made: dict[str, Any] = {}

    def journal_it(h: ActorHarness) -> None:
        made["session"] = _first_session(h)
        made["run_id"], made["attempt_id"], made["lease"] = _leased_attempt(h, made["session"], "launching")

    rig = make_rig(before=journal_it)
    s2 = rig.new_session()  # the restarted worker registers anew
    rig.welcome_to(s2)
    attest = rig.peer.expect(m.Attest)
    lease = made["lease"]
    assert (attest.attempt_id, attest.fact, attest.stopped_by) == (made["attempt_id"], "launch_unknown", None)
    assert (attest.lease.offer_id, attest.lease.lease_token, attest.lease_session_id) == (
        lease.offer_id, lease.lease_token, lease.session_id)
    assert rig.answer_attest(attest).result == "applied"
    row = attempt_row(rig.repo, made["attempt_id"])
    assert (row.status, row.evidence) == ("starting", "launch_unknown")  # never trusted: it waits
    # Nothing more is said about it, after the publish grace and a heartbeat: no `ended`, no
    # Activate, no spawn; the journal row stays `launching` (its Pull is for the free slot).
    rig.answer_heartbeat(rig.heartbeat())
    rig.peer.expect(m.Pull, strict=False)
    rig.peer.pending = [msg for msg in rig.peer.pending if not isinstance(msg, m.Heartbeat)]
    rig.peer.quiet(0.5)
    assert not rig.ctx.executor_side.receipts.marker_path(made["attempt_id"]).exists()
    assert rig.ctx.executor_side.journal.get(made["attempt_id"]).state == "launching"
    assert rig.ctx.executor_side.journal.get(made["attempt_id"]).identity is None


def test_a_launch_unknown_row_is_asked_about_again_and_finished_once_its_attempt_is_over(make_rig):
    """Simulation seed 310007: a row `launching` without a marker is attested `launch_unknown` and
    waits for an operator; once `confirm-stopped` and recovery have ended its attempt `lost`, the
    worker learns it when it asks again (every few heartbeats, while the row waits): `superseded`,
    and the row is finished instead of staying in flight for good."""
    made: dict[str, Any] = {}

    def journal_it(h: ActorHarness) -> None:
        made["session"] = _first_session(h)
        made["run_id"], made["attempt_id"], made["lease"] = _leased_attempt(h, made["session"], "launching")

    rig = make_rig(before=journal_it)
    rig.welcome_to(rig.new_session())
    attest = rig.peer.expect(m.Attest)
    assert (attest.fact, rig.answer_attest(attest).result) == ("launch_unknown", "applied")
    expire_lease(rig.repo, made["attempt_id"])
    assert ConfirmStopped(rig.repo.store).confirm_stopped(made["run_id"], "alice").result == "applied"
    cases = ClusterRecoveryCases(rig.repo.store, recovery_grace_ms=120_000, drain_grace_ms=120_000)
    (candidate,) = [c for c in cases.page(16)[0] if c.attempt_id == made["attempt_id"]]
    assert cases.resolve(candidate).result == "applied"
    assert rig.repo.runs.get(made["run_id"]).state == "lost"
    for _ in range(ASK_UNDECIDED_EVERY):
        rig.answer_heartbeat(rig.heartbeat())
    again = rig.peer.expect(m.Attest, strict=False)
    assert (again.attempt_id, again.fact) == (made["attempt_id"], "launch_unknown")
    assert rig.answer_attest(again).result == "superseded"
    wait_until(lambda: rig.ctx.executor_side.journal.get(made["attempt_id"]) is None, what="the row finished")


def test_an_unreadable_proc_is_no_fact_and_the_row_is_probed_again_at_the_next_heartbeat(make_rig, monkeypatch):
    made: dict[str, Any] = {}
    real = evidence.liveness_of
    unreadable = {"on": True}
    monkeypatch.setattr(evidence, "liveness_of",
                        lambda *a, **k: evidence.Alive.UNREADABLE if unreadable["on"] else real(*a, **k))

    def journal_a_survivor(h: ActorHarness) -> None:
        _proc, identity = h.spawn_sleep(30)
        made["identity"] = identity
        made["session"] = _first_session(h)
        made["run_id"], made["attempt_id"], made["lease"] = _leased_attempt(h, made["session"], "started",
                                                                            identity)

    rig = make_rig(before=journal_a_survivor)
    s2 = rig.new_session()
    rig.welcome_to(s2)
    rig.peer.expect(m.Pull)  # not adopted (yet): its slot looks free, which the store bounds anyway
    rig.peer.quiet()  # no fact: not `ended`, not `running`
    unreadable["on"] = False
    rig.ref.tell(HeartbeatDue())
    attest = rig.peer.expect(m.Attest, strict=False)
    assert (attest.attempt_id, attest.fact, attest.pid) == (made["attempt_id"], "running", made["identity"].pid)
    assert rig.answer_attest(attest).result == "applied"


def test_a_restarted_receipt_consumer_consumes_only_the_rows_whose_process_has_ended(make_rig, monkeypatch):
    """Resume: a gone process is consumed; one running, one being launched (no identity) and one
    whose /proc is unreadable are the Executor's."""
    rig = make_rig()
    h = rig.h
    gone = h.dead_identity()
    _proc, alive = h.spawn_sleep(30)
    _proc2, blind = h.spawn_sleep(30)
    rows = {}
    for name, state, identity in (("gone", "started", gone), ("alive", "started", alive),
                                  ("launching", "launching", None), ("blind", "started", blind)):
        attempt_id = f"att-{name}"
        h.ctx.executor_side.journal.accept(attempt_id, f"run-{name}", str(h.ctx.executor_side.logs.path_for("r", attempt_id)),
                             str(h.ctx.executor_side.receipts.final_path(attempt_id)), token_hash(new_token()))
        h.ctx.executor_side.journal.set_state(attempt_id, state, identity=identity)
        rows[name] = attempt_id
    real = evidence.probe  # /proc unreadable for `blind` (what process.identity.probe says then)
    monkeypatch.setattr(evidence, "probe", lambda identity, **k: Liveness.UNKNOWN
                        if identity.pid == blind.pid else real(identity, **k))
    h.stub("executor")  # the NoReceipt of a consumed row with no receipt lands here
    h.directory.tell("receipts", Resume())
    [no_receipt] = h.inbox.wait("executor", NoReceipt)
    assert no_receipt.attempt_id == rows["gone"]
    rig.peer.quiet(0.5)
    assert [n.attempt_id for n in h.inbox.items("executor", NoReceipt)] == [rows["gone"]]
    assert not h.inbox.items("executor", Consume)


def test_an_activate_left_unanswered_is_sent_again_and_the_job_launches_once(make_rig, caplog):
    """A replica that answered a later frame and died before it committed this Activate: the link
    took that frame as the answer, so the Executor repeats the Activate each heartbeat interval
    until `Activated` comes; a late answer to the first copy launches nothing more."""
    caplog.set_level(logging.INFO, logger="qlactors")
    rig = make_rig()
    rig.welcome_to(rig.new_session(), heartbeat_ms=300)
    pull = rig.peer.expect(m.Pull, strict=False)
    runs = rig.h.config.home.parent / "RUNS"
    shell, flag, script = held_job(rig)
    rig.repo.tasks.add(spec("job", [shell, flag, f"echo run >> {runs}; {script}"]), actor_name="tester")
    rig.repo.runs.request("job")
    rig.send_offers(pull, rig.offer_for(pull))
    lost = rig.peer.expect(m.Activate, strict=False)  # never answered
    again = rig.peer.expect(m.Activate, strict=False)
    assert again == lost
    activated = rig.activate(again)
    started = rig.peer.expect(m.Started, strict=False)
    rig.h.track_group(started.pgid)
    rig.ack_started(started)
    rig.peer.send(activated)  # the answer to a copy, late: nothing more is launched
    ready(rig)
    release(rig)
    assert rig.peer.expect(m.Completed, strict=False).exit_code == 0
    assert "event=activate_repeated" in caplog.text
    assert runs.read_text() == "run\n"  # launched once


def attest_from(rig: ClusterRig, session) -> m.Attest:
    """The next Attest sent from `session`; those from older sessions are answered on the way
    (`fenced` for their session: the worker re-makes them from the current one)."""
    while True:
        attest = rig.peer.expect(m.Attest, strict=False)
        if attest.session_id == session.session_id:
            return attest
        assert rig.answer_attest(attest).result == "fenced"


def _offered(rig: ClusterRig, session) -> m.Activate:
    rig.welcome_to(session)
    pull = rig.peer.expect(m.Pull, strict=False)
    rig.repo.tasks.add(spec("job", ["/bin/sh", "-c", "exit 0"]), actor_name="tester")
    rig.repo.runs.request("job")
    rig.send_offers(pull, rig.offer_for(pull))
    return rig.peer.expect(m.Activate, strict=False)


def test_an_activation_fenced_for_its_session_is_given_back_by_the_next_session(make_rig):
    """An earlier copy of the Activate may have been committed (the soak, seed 1796144509): the
    attempt is never launched, and the new session attests `never_launched` for it, the evidence
    recovery trusts, instead of forgetting it."""
    from actor_harness import ack_message

    rig = make_rig()
    act = _offered(rig, rig.new_session())
    committed = rig.ctx.control_side.dispatch.reports.activate(fence_of(act, act.worker_id), act.callback_token_hash,
                                          act.log_artifact_id)  # the first copy, committed
    assert committed.result == "applied"
    rig.peer.send(ack_message("activate", act.run_id, act.attempt_id, "fenced", "session_expired",
                              offer_id=act.offer_id, answer_to=act.request_id))  # the answer to the re-sent copy
    rig.peer.send(m.Activated(answer_to=act.request_id, run_id=act.run_id, attempt_id=act.attempt_id, offer_id=act.offer_id,
                              lease_version=committed.value.lease_version, deadline_at_ms=None))  # late
    s2 = end_session_by_heartbeat(rig)
    rig.welcome_to(s2)
    attest = attest_from(rig, s2)  # the give-back sent from the ended session is re-made from this one
    assert (attest.attempt_id, attest.fact, attest.lease.offer_id) == (act.attempt_id, "never_launched", act.offer_id)
    assert rig.answer_attest(attest).result == "applied"
    assert attempt_row(rig.repo, act.attempt_id).evidence == "never_launched"
    assert rig.ctx.executor_side.journal.get(act.attempt_id) is None
    assert not list(rig.h.config.home.parent.glob("**/markers/*"))  # never launched


def test_an_activation_fenced_for_its_lease_is_given_back_at_once(make_rig):
    from actor_harness import ack_message

    rig = make_rig()
    act = _offered(rig, rig.new_session())
    rig.peer.send(ack_message("activate", act.run_id, act.attempt_id, "fenced", "lease_expired",
                              offer_id=act.offer_id, answer_to=act.request_id))
    attest = rig.peer.expect(m.Attest, strict=False)
    assert (attest.attempt_id, attest.fact) == (act.attempt_id, "never_launched")
    wait_until(lambda: rig.ctx.executor_side.journal.get(act.attempt_id) is None, what="the row cleared (kept, hidden, while owed)")
    rig.peer.expect(m.Pull, strict=False)  # the slot is free again
