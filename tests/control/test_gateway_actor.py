"""The Gateway actor alone (the control side's face to executors) over a bound ROUTER, with the real
Supervisor and the real store, driven through its real ZeroMQ endpoint by a test peer playing an
executor (ARCHITECTURE.md "The wire", docs/protocol.md, SEMANTICS.md §4-§6, §10).

The harness (tests/harness/actor_harness.py) builds the EdgeContext on a SQLite file in a temp
home and starts one actor; the other names in the Directory are recording stubs. The rigs are
tests/harness/actor_rigs.py's.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import pytest

from qlactors.domain.receipt import token_hash
from qlactors.domain.transitions import ErrorCode
from qlactors.ids import new_id
from qlactors.runtime.signals import AttemptEnded, Tick
from qlactors.wire import codec
from qlactors.wire import messages as m

from actor_harness import WAIT_S, attempt_row, db_state, leases, register_message, welcome_message
from actor_rigs import _body, BOOT_ID, spec, new_token, now_ms, SupervisorRig, sup  # noqa: F401 - fixtures


def test_gateway_register_answers_welcome_with_the_registered_session(sup):
    welcome = sup.register()
    s = sup.session
    assert (welcome.worker_id, welcome.session_id, welcome.session_generation) == (
        s.worker_id, s.session_id, s.generation)
    assert welcome.session_generation == 1
    # Edge: the version agreed, no resume, no lease that expires, nothing left unactivated.
    assert (welcome.protocol, welcome.resumed, welcome.session_lease_ms, welcome.run_lease_ms,
            welcome.unactivated) == (codec.VERSION, False, None, None, [])
    assert welcome.heartbeat_ms > 0 and welcome.resume_secret


@pytest.mark.parametrize(("low", "high"), [(1, 3), (6, 7)], ids=["older", "newer"])
def test_gateway_register_with_a_protocol_range_without_ours_is_refused(sup, low, high):
    sup.peer.send(register_message(sup.session.worker_id, BOOT_ID, protocol_min=low, protocol_max=high))
    ack = sup.peer.expect(m.Ack)
    assert (ack.of, ack.result) == ("register", "refused")
    assert f"{low}..{high}" in ack.detail and str(codec.VERSION) in ack.detail
    assert sup.alive()
    # A range that includes it is welcome.
    assert sup.register(protocol_min=3, protocol_max=5).protocol == codec.VERSION


def test_gateway_register_of_an_unknown_worker_is_refused(sup):
    sup.peer.send(register_message("intruder", BOOT_ID))
    ack = sup.peer.expect(m.Ack)
    assert (ack.of, ack.result, ack.run_id, ack.attempt_id) == ("register", "refused", "", "")
    assert "intruder" in ack.detail
    assert sup.alive()


def test_gateway_pull_without_queued_work_answers_no_offers(sup):
    sup.register()
    sup.peer.send(pull := sup.pull_message())
    assert sup.peer.recv() == sup.no_offers(pull.pull_id)


def test_gateway_pull_offers_the_queued_run_and_a_repeated_pull_gets_the_same_offer(sup):
    sup.register()
    sup.repo.tasks.add(spec("job", ["/bin/sh", "-c", "echo hi; exit 4"], cwd="/tmp", env={"A": "1"},
                            timeout_ms=60_000, stop_grace_ms=2_000), actor_name="tester")
    run_id = sup.repo.runs.request("job").run.id
    answer, offer_id, lease_token = sup.pull()
    assert isinstance(answer, m.Offers)
    s = sup.session
    assert (answer.worker_id, answer.session_id, answer.session_generation) == (s.worker_id, s.session_id, s.generation)
    [offer] = answer.offers
    assert offer.lease_expires_at_ms is None  # edge leases live with the runtime
    assert (offer.run_id, offer.attempt_number, offer.offer_id) == (run_id, 1, offer_id)
    assert offer.argv == ["/bin/sh", "-c", "echo hi; exit 4"]
    assert (offer.cwd, offer.env, offer.timeout_ms, offer.stop_grace_ms) == ("/tmp", {"A": "1"}, 60_000, 2_000)
    assert offer.log_cap_bytes == sup.h.config.runtime.log_cap_bytes
    [lease] = leases(sup.repo, run_id)
    assert (lease["status"], lease["offer_id"], lease["lease_generation"], lease["version"]) == (
        "leased", offer_id, offer.lease_generation, offer.lease_version)
    assert lease["token_hash"] == token_hash(lease_token)
    assert sup.repo.runs.get(run_id).state == "dispatching"
    before = db_state(sup.repo, run_id)

    again, _, _ = sup.pull(offer_id=offer_id, lease_token=lease_token)
    assert again.offers == [offer]
    assert db_state(sup.repo, run_id) == before  # no second lease, nothing changed


def test_gateway_a_pull_of_several_pairs_gets_one_offer_per_pair_in_one_answer(sup):
    sup.register()
    for i in range(3):
        sup.repo.tasks.add(spec(f"job{i}"), actor_name="tester")
    runs = {sup.repo.runs.request(f"job{i}").run.id for i in range(3)}
    pairs = [(secrets.token_hex(8), new_token()) for _ in range(2)]
    sup.peer.send(pull := sup.pull_message(pairs=pairs))
    answer = sup.peer.recv()
    assert isinstance(answer, m.Offers) and answer.pull_id == pull.pull_id
    assert [o.offer_id for o in answer.offers] == [o for o, _ in pairs]  # one per pair, in order
    offered = {o.run_id for o in answer.offers}
    assert len(offered) == 2 and offered <= runs
    for offer, (offer_id, lease_token) in zip(answer.offers, pairs):
        [lease] = leases(sup.repo, offer.run_id)
        assert (lease["offer_id"], lease["token_hash"]) == (offer_id, token_hash(lease_token))
    # More pairs than queued runs: the one left is offered, and the answer says no more.
    sup.peer.send(pull := sup.pull_message(slots=3))
    rest = sup.peer.recv()
    assert [o.run_id for o in rest.offers] == list(runs - offered)
    assert rest.offers[0].offer_id == pull.offers[0].offer_id


def test_gateway_activate_answers_activated_with_the_deadline(sup):
    sup.register()
    t0 = now_ms()
    offer, lease_token, token, activated = sup.activated(timeout_ms=60_000)
    t1 = now_ms()
    assert (activated.run_id, activated.attempt_id, activated.offer_id) == (
        offer.run_id, offer.attempt_id, offer.offer_id)
    assert activated.lease_version == offer.lease_version
    assert t0 + 60_000 <= activated.deadline_at_ms <= t1 + 60_000
    row = attempt_row(sup.repo, offer.attempt_id)
    assert (row.status, row.callback_token_hash, row.deadline_at_ms, row.log_artifact_id) == (
        "starting", token_hash(token), activated.deadline_at_ms, "ab/attempt.log")


def test_gateway_activate_without_timeout_has_no_deadline(sup):
    sup.register()
    _, _, _, activated = sup.activated()
    assert activated.deadline_at_ms is None


@pytest.mark.parametrize("wrong", [
    {"lease_token": "not-the-token-of-this-lease-xxxxxxxxxxxxxxxxxx"},
    {"session_generation": 2},
    {"lease_generation": 7},
    {"offer_id": "another-offer"},
], ids=["lease_token", "session_generation", "lease_generation", "offer_id"])
def test_gateway_fenced_activate_is_acked_fenced_and_changes_nothing(sup, wrong):
    sup.register()
    offer, lease_token = sup.offered()
    before = db_state(sup.repo, offer.run_id)
    sup.peer.send(m.Activate(request_id=new_id(), **sup.fence(offer, lease_token, **wrong),
                             callback_token_hash=token_hash(new_token()), log_artifact_id="ab/x.log"))
    ack = sup.peer.expect(m.Ack)
    assert (ack.of, ack.result, ack.run_id, ack.attempt_id) == (
        "activate", "fenced", offer.run_id, offer.attempt_id)
    assert ack.detail
    assert db_state(sup.repo, offer.run_id) == before
    # The genuine fence still works afterwards.
    sup.peer.send(m.Activate(request_id=new_id(), **sup.fence(offer, lease_token), callback_token_hash=token_hash(new_token()),
                             log_artifact_id="ab/x.log"))
    sup.peer.expect(m.Activated)


def test_gateway_activate_after_a_cancel_is_fenced(sup):
    sup.register()
    offer, lease_token = sup.offered()
    sup.repo.runs.cancel(offer.run_id)
    before = db_state(sup.repo, offer.run_id)
    sup.peer.send(m.Activate(request_id=new_id(), **sup.fence(offer, lease_token), callback_token_hash=token_hash(new_token()),
                             log_artifact_id="ab/x.log"))
    ack = sup.peer.expect(m.Ack)
    assert (ack.of, ack.result, ack.detail) == ("activate", "fenced", "attempt_cancelled")
    assert db_state(sup.repo, offer.run_id) == before
    assert sup.repo.runs.get(offer.run_id).state == "cancelled"


def test_gateway_started_is_applied_once_and_a_repeat_is_applied_again_without_an_event(sup):
    sup.register()
    offer, lease_token, _, activated = sup.activated()
    ack = sup.started(offer, lease_token, activated)
    assert (ack.of, ack.result, ack.run_id, ack.attempt_id) == ("started", "applied", offer.run_id, offer.attempt_id)
    run = sup.repo.runs.get(offer.run_id)
    assert run.state == "running" and run.attempts[0].state == "running"
    row = attempt_row(sup.repo, offer.attempt_id)
    assert (row.boot_id, row.pid, row.pgid, row.start_ticks) == (BOOT_ID, 4242, 4242, 99)
    before = db_state(sup.repo, offer.run_id)

    again = sup.started(offer, lease_token, activated)
    assert (again.of, again.result) == ("started", "applied")
    assert db_state(sup.repo, offer.run_id) == before  # no new event, nothing changed

    other = sup.started(offer, lease_token, activated, pid=4343)
    assert (other.of, other.result) == ("started", "refused")
    assert db_state(sup.repo, offer.run_id) == before


def test_gateway_fenced_started_changes_nothing(sup):
    sup.register()
    offer, lease_token, _, activated = sup.activated()
    before = db_state(sup.repo, offer.run_id)
    sup.peer.send(m.Started(request_id=new_id(), **sup.fence(offer, new_token(), lease_version=activated.lease_version),
                            boot_id=BOOT_ID, pid=4242, pgid=4242, start_ticks=99))
    ack = sup.peer.expect(m.Ack)
    assert (ack.of, ack.result) == ("started", "fenced")
    assert db_state(sup.repo, offer.run_id) == before


@pytest.mark.parametrize(("exit_code", "state"), [(0, "succeeded"), (3, "failed")])
def test_gateway_completed_with_the_callback_token_ends_the_run_by_exit_code(sup, exit_code, state):
    sup.register()
    offer, lease_token, token, activated = sup.activated()
    sup.started(offer, lease_token, activated)

    wrong = sup.completed(offer, new_token(), exit_code)
    assert (wrong.of, wrong.result) == ("completed", "refused")
    assert sup.repo.runs.get(offer.run_id).state == "running"

    ack = sup.completed(offer, token, exit_code)
    assert (ack.of, ack.result, ack.run_id, ack.attempt_id) == ("completed", "applied", offer.run_id, offer.attempt_id)
    run = sup.repo.runs.get(offer.run_id)
    assert run.state == state
    assert (run.attempts[0].state, run.attempts[0].exit_code, run.attempts[0].log_dropped_bytes) == (
        state, exit_code, 0)
    [lease] = leases(sup.repo, offer.run_id)
    assert lease["status"] == "completed"
    before = db_state(sup.repo, offer.run_id)

    replay = sup.completed(offer, token, exit_code)
    assert (replay.of, replay.result) == ("completed", "already_terminal")
    assert db_state(sup.repo, offer.run_id) == before

    late = sup.completed(offer, new_token(), exit_code)
    assert (late.of, late.result) == ("completed", "refused")
    assert db_state(sup.repo, offer.run_id) == before


def test_gateway_completed_before_started_still_lands(sup):
    """A fast job's receipt may beat its Started report (SEMANTICS.md §2: `starting` may end directly)."""
    sup.register()
    offer, lease_token, token, activated = sup.activated()
    ack = sup.completed(offer, token, 0)
    assert ack.result == "applied"
    late = sup.started(offer, lease_token, activated)
    assert (late.result, late.detail) == ("fenced", "attempt_succeeded")  # its lease completed
    assert sup.repo.runs.get(offer.run_id).state == "succeeded"


def test_gateway_completed_with_an_invalid_receipt_is_refused(sup):
    sup.register()
    offer, _, token, _ = sup.activated()
    ack = sup.completed(offer, token, 300)  # exit codes are 0..255
    assert (ack.of, ack.result) == ("completed", "refused")
    assert "invalid_receipt" in ack.detail
    assert sup.repo.runs.get(offer.run_id).state == "dispatching"
    assert sup.alive()


_GOOD_REGISTER = dict(kind="register", worker_id="local", capacity=1, boot_id="b", labels=[],
                      protocol_min=codec.VERSION, protocol_max=codec.VERSION, worker_clock_ms=1, resume_session_id=None, resume_generation=None,
                      resume_secret=None)


MALFORMED = {
    "garbage": [b"\xff\x00garbage\x13"],
    "one_frame": [codec.HEADER],
    "three_frames": [codec.HEADER, _body(**_GOOD_REGISTER), b""],
    "bad_body": [codec.HEADER, b"\xc1\xc1\xc1"],
    "unknown_kind": [codec.HEADER, _body(kind="launch_missiles")],
    "extra_field": [codec.HEADER, _body(**_GOOD_REGISTER, extra=1)],
    "bool_for_int": [codec.HEADER, _body(**dict(_GOOD_REGISTER, capacity=True))],
    "missing_field": [codec.HEADER, _body(kind="register", worker_id="local", capacity=1)],
    "wrong_protocol": [b"NOTQLACTORS/1", _body(**_GOOD_REGISTER)],
}


@pytest.mark.parametrize("frames", list(MALFORMED.values()), ids=list(MALFORMED))
def test_gateway_a_malformed_frame_is_refused_and_the_supervisor_keeps_answering(sup, frames):
    sup.peer.send_frames(frames)
    ack = sup.peer.expect(m.Ack)
    assert (ack.of, ack.run_id, ack.attempt_id, ack.result) == ("unknown", "", "", "refused")
    assert ack.detail
    assert sup.h.bridge.rejected_frames == 1
    assert sup.alive()
    assert sup.register().session_id == sup.session.session_id  # the next good message is answered
    assert sup.alive()


def test_gateway_a_peer_on_another_protocol_version_is_refused_naming_both_versions(sup):
    # A protocol 2 peer (a release without Leave) is judged by the header.
    sup.peer.send_frames([b"QLACTORS/2", _body(kind="register", worker_id="local", capacity=1, boot_id="b")])
    frames = sup.peer.recv_frames()
    # The refusal is written in the lowest version of our range, which the most peers read.
    assert frames is not None and frames[0] == codec.HEADERS[codec.PROTOCOL_MIN] == b"QLACTORS/4"
    ack = codec.decode(frames)
    assert isinstance(ack, m.Ack)
    assert (ack.of, ack.result) == ("unknown", "refused")
    assert "QLACTORS/2" in ack.detail and "QLACTORS/4..5" in ack.detail
    # A later version may have another frame layout: still judged by the header first.
    sup.peer.send_frames([b"QLACTORS/6"])
    ack = sup.peer.expect(m.Ack)
    assert "QLACTORS/6" in ack.detail and "QLACTORS/4..5" in ack.detail
    assert sup.alive()
    sup.register()


def test_gateway_a_control_side_message_from_a_peer_is_ignored(sup):
    """An executor-bound kind (here Welcome) sent to the control side has no handler: no crash."""
    sup.peer.send(welcome_message(sup.session, session_id="s"))
    sup.peer.quiet()
    assert sup.alive()
    sup.register()


def attest_message(welcome: m.Welcome, fact: str, stopped_by: str | None = None, **kw: Any) -> m.Attest:
    """An Attest of the current session about run r1 / attempt a1 quoting no lease (as edge sends it)."""
    fields: dict[str, Any] = dict(
        worker_id="local", session_id=welcome.session_id, session_generation=welcome.session_generation,
        run_id="r1", attempt_id="a1", lease=None, lease_session_id=None, lease_session_generation=None,
        fact=fact, stopped_by=stopped_by, new_slot=None, boot_id=None, pid=None, pgid=None, start_ticks=None)
    fields.update(kw)
    return m.Attest(request_id=new_id(), **fields)


@pytest.mark.parametrize(("fact", "stopped_by"), [("ended", "exit"), ("stopped", "term"),
                                                  ("never_launched", None), ("ended_with_receipt", "exit")])
def test_gateway_conclusive_attest_reaches_recovery_and_ticks_the_scheduler(sup, fact, stopped_by):
    welcome = sup.register()
    sup.peer.send(attest_message(welcome, fact, stopped_by))
    [ended] = sup.h.inbox.wait("recovery", AttemptEnded)
    assert ended == AttemptEnded("r1", "a1", stopped_by)
    [tick] = sup.h.inbox.wait("scheduler", Tick)
    assert tick.reason == "attest"


@pytest.mark.parametrize("fact", ["running", "launch_unknown"])
def test_gateway_inconclusive_attest_does_not_reach_recovery(sup, fact):
    welcome = sup.register()
    sup.peer.send(attest_message(welcome, fact))
    attested = sup.peer.expect(m.Attested)
    assert (attested.fact, attested.result) == (fact, "applied")
    assert sup.h.inbox.items("recovery") == []
    assert sup.alive()


def test_gateway_pull_from_a_superseded_session_is_fenced(sup):
    sup.register()
    sup.repo.tasks.add(spec(), actor_name="tester")
    run_id = sup.repo.runs.request("job").run.id
    answer, _, _ = sup.pull(session_generation=sup.session.generation + 1)
    assert isinstance(answer, m.Ack) and (answer.of, answer.result) == ("pull", "fenced")
    assert leases(sup.repo, run_id) == []
    assert sup.repo.runs.get(run_id).state == "queued"


# The wire admits ids up to 64 characters and any string as a token; the store's own checks are
# narrower (ids <= 36, ASCII tokens, pid >= 1). Those checks raise inside the Supervisor's
# handler, the Supervisor dies (on_failure trips Fatal) and the whole runtime stops: a peer's
# well-formed message kills the control plane (protocol.md "no actor can die of a peer's bytes").
PEER_KILLS_SUPERVISOR = {
    "pull_offer_id_40_chars": lambda rig: _send_pull(rig, offer_id="o" * 40),
    "pull_non_ascii_lease_token": lambda rig: _send_pull(rig, lease_token="jeton-\u00e9"),
    "pull_id_40_chars": lambda rig: rig.peer.send(rig.pull_message(pull_id="p" * 40)),
    "started_pid_0": lambda rig: _send_started(rig, pid=0),
    "completed_negative_dropped_bytes": lambda rig: _send_completed(rig, log_dropped_bytes=-1),
}


def _send_pull(rig: SupervisorRig, offer_id: str = "o1", lease_token: str | None = None) -> None:
    rig.peer.send(rig.pull_message(pairs=[(offer_id, lease_token or new_token())]))


def _send_started(rig: SupervisorRig, **identity: Any) -> None:
    offer, lease_token, _, activated = rig.activated()
    fields = dict(boot_id=BOOT_ID, pid=1234, pgid=1234, start_ticks=1)
    fields.update(identity)
    rig.peer.send(m.Started(request_id=new_id(), **rig.fence(offer, lease_token, lease_version=activated.lease_version), **fields))


def _send_completed(rig: SupervisorRig, **kw: Any) -> None:
    offer, _, token, _ = rig.activated()
    s = rig.session
    fields = dict(worker_id=s.worker_id, session_id=s.session_id, session_generation=s.generation,
                  run_id=offer.run_id, attempt_id=offer.attempt_id, schema_version=1, callback_sequence=1,
                  token=token, started_at_ms=now_ms(), finished_at_ms=now_ms(), exit_code=0,
                  log_dropped_bytes=0)
    fields.update(kw)
    rig.peer.send(m.Completed(request_id=new_id(), **fields))


def _answer_or_death(rig: SupervisorRig, timeout: float = WAIT_S) -> Any:
    """The Supervisor's answer, or None as soon as it is dead (or the runtime's Fatal tripped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        frames = rig.peer.recv_frames(timeout=0.02)
        if frames is not None:
            return codec.decode(frames)
        if not rig.alive():
            return None
    raise AssertionError(f"neither an answer nor a death within {timeout} s")


@pytest.mark.parametrize("send", list(PEER_KILLS_SUPERVISOR.values()), ids=list(PEER_KILLS_SUPERVISOR))
def test_gateway_a_wire_valid_report_the_store_rejects_is_refused_not_fatal(sup, send):
    sup.register()
    send(sup)
    answer = _answer_or_death(sup)
    assert sup.alive(), f"the supervisor died: {sup.h.ctx.fatal.reason}"
    assert isinstance(answer, (m.Ack, m.Offers)), answer
    if isinstance(answer, m.Ack):
        assert answer.result in ("refused", "fenced")


def test_gateway_refused_or_fenced_reports_change_nothing_about_their_attempt(sup):
    """Issue 9 §1: a report the store refuses (a ValueError inside its transaction) or fences
    leaves the attempt, its run, its lease and its events exactly as they were."""
    sup.register()
    offer, lease_token, _, activated = sup.activated()
    before = db_state(sup.repo, offer.run_id)
    fence = sup.fence(offer, lease_token, lease_version=activated.lease_version)
    reports = [
        m.Started(request_id=new_id(), **fence, boot_id=BOOT_ID, pid=0, pgid=0, start_ticks=1),  # refused: pid 0
        m.Started(request_id=new_id(), **{**fence, "session_generation": 2}, boot_id=BOOT_ID, pid=9,
                  pgid=9, start_ticks=1),  # fenced: a generation never registered
        m.StartFailed(request_id=new_id(), **{**fence, "offer_id": "another-offer"}, reason="spawn failed"),  # fenced
        m.Activate(request_id=new_id(), **{**fence, "lease_token": new_token()}, callback_token_hash="ab" * 32,
                   log_artifact_id="x"),  # fenced: another lease token
    ]
    for report in reports:
        sup.peer.send(report)
        ack = sup.peer.expect(m.Ack)
        assert ack.result in ("refused", "fenced"), (report.KIND, ack)
        assert db_state(sup.repo, offer.run_id) == before, report.KIND
    assert sup.alive()


def test_gateway_answers_a_pull_past_a_run_no_offer_can_carry(sup):
    """Issue 9 §1: the pull gets the good run's offer; the planted one ends OFFER_UNENCODABLE."""
    from sqlalchemy import select

    from qlactors.store.schema import task_revisions, tasks

    sup.register()
    sup.repo.tasks.add(spec("bad"), actor_name="tester")
    sup.repo.tasks.add(spec("good"), actor_name="tester")
    with sup.repo.store.write() as conn:
        bad_id = conn.execute(select(tasks.c.id).where(tasks.c.name == "bad")).scalar_one()
        conn.execute(task_revisions.update().where(task_revisions.c.task_id == bad_id).values(
            env_json='{"K": "' + "v" * (codec.MAX_STR_BYTES + 1) + '"}'))
    bad = sup.repo.runs.request("bad").run.id
    good = sup.repo.runs.request("good").run.id
    answer, offer_id, _ = sup.pull()
    assert isinstance(answer, m.Offers), answer
    assert [(o.run_id, o.offer_id) for o in answer.offers] == [(good, offer_id)], answer
    run = sup.repo.runs.get(bad)
    assert (run.state, run.error_code) == ("failed", ErrorCode.OFFER_UNENCODABLE)
    assert [(a.state, a.error_code) for a in run.attempts] == [("failed", ErrorCode.OFFER_UNENCODABLE)]
    assert leases(sup.repo, bad) == [] and sup.alive()


def test_gateway_pull_with_no_free_slot_is_answered_with_no_offers(sup):
    sup.register()
    sup.repo.tasks.add(spec(), actor_name="tester")
    run_id = sup.repo.runs.request("job").run.id
    sup.peer.send(pull := sup.pull_message(slots=0))  # no pair: no free slot
    assert sup.peer.recv() == sup.no_offers(pull.pull_id)
    assert leases(sup.repo, run_id) == []


def test_gateway_offers_nothing_while_the_last_cycle_failed(sup):
    sup.register()
    sup.h.ctx.control_side.authority.clear()  # as the Scheduler leaves it after a failed recovery or retry step
    sup.repo.tasks.add(spec(), actor_name="tester")
    run_id = sup.repo.runs.request("job").run.id
    sup.peer.send(pull := sup.pull_message())
    assert sup.peer.recv() == sup.no_offers(pull.pull_id)
    assert leases(sup.repo, run_id) == []
    sup.h.ctx.control_side.authority.set()  # a cycle got through
    answer, _, _ = sup.pull()
    assert [o.run_id for o in answer.offers] == [run_id]


def test_gateway_offers_nothing_before_admission_opens(sup):
    sup.register()
    sup.h.ctx.admitting.clear()
    sup.repo.tasks.add(spec(), actor_name="tester")
    run_id = sup.repo.runs.request("job").run.id
    sup.peer.send(pull := sup.pull_message())
    assert sup.peer.recv() == sup.no_offers(pull.pull_id)
    assert sup.repo.runs.get(run_id).state == "queued"


def test_gateway_answers_attest_with_attested(sup):
    welcome = sup.register()
    sup.peer.send(attest_message(welcome, "ended", "exit"))
    attested = sup.peer.expect(m.Attested, timeout=1.0)
    assert (attested.run_id, attested.attempt_id, attested.fact, attested.result) == ("r1", "a1", "ended", "applied")
    assert attested.offer_id is None  # nothing re-bound on edge


def test_gateway_attest_of_a_stale_session_is_fenced_and_reaches_nobody(sup):
    welcome = sup.register()
    sup.peer.send(attest_message(welcome, "ended", "exit", session_generation=welcome.session_generation + 5))
    attested = sup.peer.expect(m.Attested, timeout=1.0)
    assert (attested.attempt_id, attested.result) == ("a1", "fenced")
    sup.peer.quiet()
    assert sup.h.inbox.items("recovery") == []


def _heartbeat(s: Any, seq: int, renewals: list[m.LeaseRef], **kw: Any) -> m.Heartbeat:
    fields: dict[str, Any] = dict(worker_id=s.worker_id, session_id=s.session_id, session_generation=s.generation,
                                  seq=seq, free_slots=1, worker_clock_ms=now_ms(), renewals=renewals)
    fields.update(kw)
    return m.Heartbeat(request_id=new_id(), **fields)


def test_gateway_heartbeat_of_a_stale_session_is_answered_session_ended(sup):
    sup.register()
    s = sup.session
    sup.peer.send(_heartbeat(s, 7, [], session_generation=s.generation + 5))
    ack = sup.peer.expect(m.HeartbeatAck, timeout=1.0)
    assert (ack.seq, ack.session_ended, ack.renewed, ack.fenced) == (7, True, [], [])
    assert ack.detail


def test_gateway_heartbeat_of_the_session_is_answered_with_its_renewals(sup):
    sup.register()
    offer, lease_token = sup.offered()
    ref = m.LeaseRef(run_id=offer.run_id, attempt_id=offer.attempt_id, offer_id=offer.offer_id,
                     lease_generation=offer.lease_generation, lease_token=lease_token)
    before = db_state(sup.repo, offer.run_id)
    for seq in (1, 2):
        sup.peer.send(_heartbeat(sup.session, seq, [ref] if seq == 2 else []))
        ack = sup.peer.expect(m.HeartbeatAck, timeout=1.0)
        assert (ack.seq, ack.session_ended, ack.session_expires_at_ms, ack.fenced) == (seq, False, None, [])
        assert [(r.attempt_id, r.lease_generation, r.expires_at_ms) for r in ack.renewed] == (
            [(offer.attempt_id, offer.lease_generation, None)] if seq == 2 else [])
    assert db_state(sup.repo, offer.run_id) == before  # edge leases do not expire: nothing written


def test_gateway_decline_releases_the_lease_and_the_attempt_is_offered_again(sup):
    sup.register()
    offer, lease_token = sup.offered()
    sup.peer.send(m.Decline(request_id=new_id(), **sup.fence(offer, lease_token), reason="draining"))
    ack = sup.peer.expect(m.Ack)
    assert (ack.of, ack.result, ack.run_id, ack.attempt_id, ack.offer_id) == (
        "decline", "applied", offer.run_id, offer.attempt_id, offer.offer_id)
    [lease] = leases(sup.repo, offer.run_id)
    assert lease["status"] == "released"
    [tick] = sup.h.inbox.wait("scheduler", Tick)
    assert tick.reason == "decline"
    # The same attempt, under a new lease generation, goes to the next pull.
    again, offer_id, _ = sup.pull()
    [second] = again.offers
    assert (second.attempt_id, second.offer_id) == (offer.attempt_id, offer_id)
    assert second.lease_generation == offer.lease_generation + 1
    # A repeat of the Decline quotes a lease that has ended: fenced (§9), and nothing changes:
    # the new lease stays.
    before = db_state(sup.repo, offer.run_id)
    sup.peer.send(m.Decline(request_id=new_id(), **sup.fence(offer, lease_token), reason="draining"))
    repeat = sup.peer.expect(m.Ack)
    assert (repeat.result, repeat.detail) == ("fenced", "lease_released")
    assert db_state(sup.repo, offer.run_id) == before
    assert [lease["status"] for lease in leases(sup.repo, offer.run_id)].count("leased") == 1
