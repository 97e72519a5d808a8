"""Actor-level integration tests: each actor started alone with the real store, driven through its
real ZeroMQ endpoint by a test peer sending wire messages (ARCHITECTURE.md "The wire",
docs/protocol.md, SEMANTICS.md §4-§6, §10).

The harness (tests/harness/actor_harness.py) builds the EdgeContext on a SQLite file in a temp
home and starts one actor; the other names in the Directory are recording stubs.
"""

from __future__ import annotations

import dataclasses
import secrets
import signal
import stat
import time
from typing import Any

import msgpack
import pytest

from qlactors.control import scheduler as scheduler_module
from qlactors.executor.executor import Executor
from qlactors.executor.receipt_consumer import ReceiptConsumer
from qlactors.control.recovery import Recovery
from qlactors.control.retry import Retry
from qlactors.control.scheduler import Scheduler
from qlactors.runtime.signals import (
    ActorFailed,
    AttemptEnded,
    Consume,
    CycleDone,
    NoReceipt,
    StartupPass,
    StepDone,
    StepRequest,
    Tick,
)
from qlactors.control.gateway import Gateway
from qlactors.runtime.supervisor import Supervisor
from qlactors.domain.receipt import token_hash
from qlactors.domain.retry import RetryPolicy
from qlactors.domain.transitions import ErrorCode
from qlactors.process.identity import Liveness, probe, read_identity
from qlactors.store.repository import Repository
from qlactors.store import sqlite as sqlite_store
from qlactors.wire import codec
from qlactors.wire import messages as m

from qlactors.ids import new_id
from actor_harness import (
    QUIET_S, WAIT_S, ActorHarness, ack_message, attempt_row, db_state, leases, offers_message,
    register_message, wait_until, welcome_message,
)
from actor_rigs import (  # noqa: F401 - fixtures
    BOOT_ID, spec, new_token, now_ms, SupervisorRig, sup, ExecutorRig, make_exe, rc, sched, step_stub,
    Flights, plant_receipt, rec,
)


# =============================================================================================
# The control side: the Gateway (the face to executors) over a bound ROUTER, and the Supervisor
# =============================================================================================


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


@pytest.mark.parametrize(("low", "high"), [(1, 3), (5, 6)], ids=["older", "newer"])
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
                            timeout_ms=60_000, stop_grace_ms=2_000))
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
        sup.repo.tasks.add(spec(f"job{i}"))
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


def _body(**fields: Any) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


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
    # A protocol 2 peer (the previous release, without Leave) is judged by the header.
    sup.peer.send_frames([b"QLACTORS/2", _body(kind="register", worker_id="local", capacity=1, boot_id="b")])
    frames = sup.peer.recv_frames()
    assert frames is not None and frames[0] == codec.HEADER == b"QLACTORS/4"  # our answer speaks version 4
    ack = codec.decode(frames)
    assert isinstance(ack, m.Ack)
    assert (ack.of, ack.result) == ("unknown", "refused")
    assert "QLACTORS/2" in ack.detail and "QLACTORS/4" in ack.detail
    # A later version may have another frame layout: still judged by the header first.
    sup.peer.send_frames([b"QLACTORS/5"])
    ack = sup.peer.expect(m.Ack)
    assert "QLACTORS/5" in ack.detail and "QLACTORS/4" in ack.detail
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
    assert ended == AttemptEnded("r1", "a1")
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
    sup.repo.tasks.add(spec())
    run_id = sup.repo.runs.request("job").run.id
    answer, _, _ = sup.pull(session_generation=sup.session.generation + 1)
    assert isinstance(answer, m.Ack) and (answer.of, answer.result) == ("pull", "fenced")
    assert leases(sup.repo, run_id) == []
    assert sup.repo.runs.get(run_id).state == "queued"


def test_supervisor_cycle_done_sends_stops_and_nudges_to_the_registered_peer(sup):
    from qlactors.store.control import StopOrder

    sup.register()
    order = StopOrder(run_id="r1", attempt_id="a1", reason="user", grace_ms=1500, boot_id=None, pid=None,
                      pgid=None, start_ticks=None, attempt_status="running")
    sup.supervisor.tell(CycleDone(ok=True, stops=(order,), work_waiting=True))
    assert sup.peer.expect(m.StopRequested) == m.StopRequested(run_id="r1", attempt_id="a1", reason="user",
                                                              grace_ms=1500)
    sup.peer.expect(m.Nudge)


@pytest.mark.parametrize("idle", [False, True])
def test_supervisor_schedules_the_next_cycle_at_the_tick_or_the_idle_tick(sup, idle):
    import time as _time

    runtime = sup.h.ctx.config.runtime
    sup.register()
    sup.supervisor.tell(CycleDone(ok=True, idle=idle))
    sup.supervisor.ask(Tick("barrier"), timeout=WAIT_S)  # answered: the CycleDone before it was handled
    wait_s = sup.h.ctx.bridge.timer_due("cadence") - _time.monotonic()
    expected = (runtime.idle_tick_ms if idle else runtime.cadence_tick_ms) / 1000
    assert expected - 1.0 < wait_s <= expected + 0.1


def test_supervisor_the_cadence_timer_ticks_the_scheduler_at_a_deadline(sup):
    """An activation with a deadline wakes the cadence then (not only at the next regular tick)."""
    sup.register()
    sup.activated(timeout_ms=50)
    ticks = sup.h.inbox.wait("scheduler", Tick, timeout=3.0)
    assert ticks[0].reason == "cadence"


# -- Supervisor: contract gaps these tests found (now fixed; kept as regression tests) ---------

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
    sup.repo.tasks.add(spec("bad"))
    sup.repo.tasks.add(spec("good"))
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
    sup.repo.tasks.add(spec())
    run_id = sup.repo.runs.request("job").run.id
    sup.peer.send(pull := sup.pull_message(slots=0))  # no pair: no free slot
    assert sup.peer.recv() == sup.no_offers(pull.pull_id)
    assert leases(sup.repo, run_id) == []


def test_gateway_offers_nothing_while_the_last_cycle_failed(sup):
    sup.register()
    sup.h.ctx.control_side.authority.clear()  # as the Scheduler leaves it after a failed recovery or retry step
    sup.repo.tasks.add(spec())
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
    sup.repo.tasks.add(spec())
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


# =============================================================================================
# Executor alone: the bridge's DEALER connects to a ROUTER the test peer bound first
# =============================================================================================


def test_executor_registers_then_pulls_after_welcome(make_exe):
    rig = make_exe()
    assert rig.register == dataclasses.replace(register_message("local", BOOT_ID),
                                               request_id=rig.register.request_id,
                                               register_id=rig.register.register_id,
                                               worker_clock_ms=rig.register.worker_clock_ms)
    assert rig.register.request_id and rig.register.register_id
    assert abs(rig.register.worker_clock_ms - now_ms()) < 60_000  # its own clock, for the skew
    pull = rig.welcome()
    s = rig.ctx.executor_side.session
    assert (pull.worker_id, pull.session_id, pull.session_generation, len(pull.offers)) == (
        s.worker_id, s.session_id, s.generation, 1)
    [pair] = pull.offers
    assert pull.pull_id and pair.offer_id and len(pair.lease_token) >= 32


def test_executor_pulls_one_pair_per_free_slot_and_accepts_a_batch_of_offers_in_one_go(make_exe):
    rig = make_exe(slots=3)
    assert rig.register.capacity == 3
    pull = rig.welcome()
    assert len(pull.offers) == 3  # one (offer id, lease token) pair per free slot
    assert len({p.offer_id for p in pull.offers}) == 3 and len({p.lease_token for p in pull.offers}) == 3
    for i in range(2):
        rig.repo.tasks.add(spec(f"job{i}", sleeper(rig)))
        rig.repo.runs.request(f"job{i}")
    first, second = rig.offer_for(pull, 0), rig.offer_for(pull, 2)  # any of the pairs may be used
    rig.send_offers(pull, first, second)
    acts = {a.attempt_id: a for a in (rig.peer.expect(m.Activate), rig.peer.expect(m.Activate))}
    assert set(acts) == {first.attempt_id, second.attempt_id}
    assert acts[first.attempt_id].lease_token == pull.offers[0].lease_token
    assert acts[second.attempt_id].lease_token == pull.offers[2].lease_token
    assert {e.attempt_id for e in rig.ctx.executor_side.journal.list()} == set(acts)
    # Fewer offers than pairs: nothing more to offer now, so no pull until a Nudge; then one pair.
    rig.peer.quiet()
    rig.peer.send(m.Nudge())
    again = rig.peer.expect(m.Pull)
    assert len(again.offers) == 1 and again.pull_id != pull.pull_id


def test_executor_runs_an_offer_end_to_end_through_the_real_receipt_consumer(make_exe):
    rig = make_exe()
    pull = rig.welcome()
    rig.repo.tasks.add(spec("job", ["/bin/sh", "-c", "echo hi; exit 4"]))
    run_id = rig.repo.runs.request("job").run.id
    offer = rig.offer_for(pull)
    rig.send_offers(pull, offer)

    act = rig.peer.expect(m.Activate)
    assert (act.worker_id, act.session_id, act.session_generation, act.run_id, act.attempt_id, act.offer_id,
            act.lease_generation, act.lease_version) == (
        pull.worker_id, pull.session_id, pull.session_generation, run_id, offer.attempt_id, offer.offer_id,
        offer.lease_generation, offer.lease_version)
    assert act.lease_token == pull.offers[0].lease_token
    assert len(act.callback_token_hash) == 64 and int(act.callback_token_hash, 16) >= 0
    log_path = rig.ctx.executor_side.logs.path_for(run_id, offer.attempt_id)
    assert act.log_artifact_id == rig.ctx.executor_side.logs.artifact_id(run_id, offer.attempt_id)
    assert log_path.is_file() and stat.S_IMODE(log_path.stat().st_mode) == 0o600
    entry = rig.ctx.executor_side.journal.get(offer.attempt_id)
    assert (entry.state, entry.run_id, entry.callback_token_hash) == ("accepted", run_id, act.callback_token_hash)

    activated = rig.activate(act)
    started = rig.peer.expect(m.Started)
    rig.h.track_group(started.pgid)
    assert (started.run_id, started.attempt_id, started.lease_token, started.lease_version) == (
        run_id, offer.attempt_id, pull.offers[0].lease_token, activated.lease_version)
    assert started.boot_id == BOOT_ID
    assert started.pgid == started.pid  # its own session and group (setsid)
    entry = rig.ctx.executor_side.journal.get(offer.attempt_id)
    assert entry.state in ("started", "completed")
    assert (entry.identity.pid, entry.identity.pgid, entry.identity.start_ticks) == (
        started.pid, started.pgid, started.start_ticks)
    rig.ack_started(started)

    completed = rig.peer.expect(m.Completed, strict=False)
    assert (completed.run_id, completed.attempt_id, completed.exit_code) == (run_id, offer.attempt_id, 4)
    assert token_hash(completed.token) == act.callback_token_hash
    assert (completed.schema_version, completed.callback_sequence) == (2, 1)
    assert completed.session_id == rig.ctx.executor_side.session.session_id
    assert completed.started_at_ms <= completed.finished_at_ms
    assert rig.ack_completed(completed) == "applied"

    wait_until(lambda: rig.ctx.executor_side.journal.get(offer.attempt_id) is None, what="journal row cleared")
    assert not rig.ctx.executor_side.receipts.final_path(offer.attempt_id).exists()
    run = rig.repo.runs.get(run_id)
    assert (run.state, run.attempts[0].exit_code) == ("failed", 4)
    assert log_path.read_bytes() == b"hi\n"
    # Its slot is free again, in the database too: nudged as the Supervisor does after a committed
    # completion, it pulls once more, with a fresh offer id and lease token.
    rig.peer.send(m.Nudge())
    again = rig.peer.expect(m.Pull, strict=False)
    assert again.pull_id != pull.pull_id and again.offers[0] != pull.offers[0]
    assert rig.alive()


# The job announces itself (a file next to the home) before sleeping, and stops are sent only once
# it runs: a TERM that lands while the launcher is still setting up is ignored by it (its
# `trap '' TERM` phase), so the stop would only take effect by KILL after the grace.
def sleeper(rig: ExecutorRig) -> list[str]:
    return ["/bin/sh", "-c", f"echo ready; : > {rig.h.config.home.parent / 'READY'}; exec sleep 30"]


def job_running(rig: ExecutorRig) -> None:
    ready = rig.h.config.home.parent / "READY"
    wait_until(ready.exists, what="the job runs")


def test_executor_stop_requested_terms_the_process_group_and_the_receipt_says_143(make_exe):
    rig = make_exe()
    offer, _, started = rig.launch(sleeper(rig), stop_grace_ms=5_000)
    identity = read_identity(started.pid, boot_id=BOOT_ID)  # the real launcher, from /proc
    assert (identity.pgid, identity.start_ticks) == (started.pgid, started.start_ticks)
    assert probe(identity, current_boot_id=BOOT_ID) is Liveness.RUNNING
    rig.ack_started(started)
    assert rig.repo.runs.cancel(offer.run_id).outcome == "requested"
    job_running(rig)

    rig.peer.send(m.StopRequested(run_id=offer.run_id, attempt_id=offer.attempt_id, reason="user", grace_ms=5_000))
    completed = rig.peer.expect(m.Completed, strict=False)
    assert completed.exit_code == 128 + signal.SIGTERM
    assert rig.ack_completed(completed) == "applied"
    run = rig.repo.runs.get(offer.run_id)
    assert (run.state, run.attempts[0].exit_code) == ("cancelled", 143)
    wait_until(lambda: probe(identity, current_boot_id=BOOT_ID) is not Liveness.RUNNING, what="group gone")
    wait_until(lambda: rig.ctx.executor_side.journal.get(offer.attempt_id) is None, what="journal row cleared")


def test_executor_a_fenced_started_stops_the_process_by_identity(make_exe):
    rig = make_exe()
    offer, _, started = rig.launch(sleeper(rig), stop_grace_ms=5_000)
    identity = read_identity(started.pid, boot_id=BOOT_ID)
    job_running(rig)
    rig.peer.send(ack_message("started", offer.run_id, offer.attempt_id, "fenced", "lease_token",
                              offer_id=offer.offer_id, answer_to=started.request_id))
    completed = rig.peer.expect(m.Completed, strict=False)
    assert completed.exit_code == 143
    wait_until(lambda: probe(identity, current_boot_id=BOOT_ID) is not Liveness.RUNNING, what="group gone")


def test_executor_a_running_jobs_output_reaches_its_log(make_exe):
    rig = make_exe()
    offer, _, started = rig.launch(sleeper(rig))
    job_running(rig)
    log = rig.ctx.executor_side.logs.path_for(offer.run_id, offer.attempt_id)
    wait_until(lambda: log.read_bytes() == b"ready\n", timeout=1.0, what="the output in the log")


def test_executor_refused_activation_clears_the_journal_and_frees_the_slot(make_exe):
    rig = make_exe()
    pull = rig.welcome()
    rig.repo.tasks.add(spec())
    rig.repo.runs.request("job")
    offer = rig.offer_for(pull)
    rig.send_offers(pull, offer)
    act = rig.peer.expect(m.Activate)
    assert rig.ctx.executor_side.journal.get(act.attempt_id) is not None
    rig.peer.send(ack_message("activate", act.run_id, act.attempt_id, "refused", "cancel_requested",
                              offer_id=act.offer_id, answer_to=act.request_id))
    again = rig.peer.expect(m.Pull)  # the slot is free: it pulls again, never spawns
    assert again.offers[0].offer_id != pull.offers[0].offer_id and len(again.offers) == 1
    assert rig.ctx.executor_side.journal.get(act.attempt_id) is None
    rig.peer.quiet()
    assert rig.alive()


def test_executor_no_offers_means_no_activity_until_a_nudge(make_exe):
    rig = make_exe()
    pull = rig.welcome()
    rig.send_offers(pull)
    rig.peer.quiet()
    rig.peer.send(m.Nudge())
    again = rig.peer.expect(m.Pull)
    assert again.pull_id != pull.pull_id and again.offers[0] != pull.offers[0]


def test_executor_a_stray_heartbeat_ack_or_attested_changes_nothing(make_exe):
    """Edge sends no heartbeat, and an Attested only answers: neither starts or stops anything."""
    rig = make_exe()
    pull = rig.welcome()
    rig.peer.send(m.HeartbeatAck(answer_to="", seq=1, session_ended=True, session_expires_at_ms=None, renewed=[],
                                 fenced=[m.FencedLease(attempt_id="a1", lease_generation=1, reason="lease_released")],
                                 detail="stale session"))
    rig.peer.send(m.Attested(answer_to="", run_id="r1", attempt_id="a1", fact="ended", result="fenced", offer_id=None,
                             lease_generation=None, lease_version=None, lease_expires_at_ms=None,
                             detail="stale session"))
    rig.peer.quiet()
    assert rig.alive() and rig.ctx.executor_side.journal.list() == []
    # Its Pull is still the one waiting: the answer to it is accepted.
    rig.repo.tasks.add(spec())
    rig.repo.runs.request("job")
    rig.send_offers(pull, offer := rig.offer_for(pull))
    assert rig.peer.expect(m.Activate).attempt_id == offer.attempt_id


def test_executor_ignores_an_offer_for_a_pull_it_did_not_send(make_exe):
    rig = make_exe()
    pull = rig.welcome()
    rig.repo.tasks.add(spec())
    rig.repo.runs.request("job")
    offer = rig.offer_for(pull)
    rig.peer.send(dataclasses.replace(offers_message(pull, offer), pull_id="stranger"))
    # Not its pull: it holds nothing for that attempt and says so (recovery then frees the lease).
    given_back = rig.peer.expect(m.Attest)
    assert (given_back.attempt_id, given_back.fact, given_back.lease) == (offer.attempt_id, "never_launched", None)
    assert rig.ctx.executor_side.journal.list() == []
    rig.send_offers(pull, offer)  # the genuine one is still accepted
    rig.peer.expect(m.Activate)


def test_executor_drops_malformed_frames_from_the_control_side_and_keeps_working(make_exe):
    rig = make_exe()
    pull = rig.welcome()
    rig.peer.send_frames([b"\x00garbage"])
    no_offers = dict(kind="offers", answer_to=pull.request_id, worker_id=pull.worker_id, session_id=pull.session_id,
                     session_generation=pull.session_generation, pull_id=pull.pull_id, offers=[])
    rig.peer.send_frames([b"QLACTORS/1", _body(kind="idle", offer_id=pull.offers[0].offer_id)])
    rig.peer.send_frames([codec.HEADER, _body(**no_offers, extra=True)])
    rig.peer.quiet()  # the executor side has nothing to answer a bad frame with
    wait_until(lambda: rig.h.bridge.rejected_frames == 3, what="three rejected frames")
    assert rig.alive()
    rig.peer.send_frames([codec.HEADER, _body(**no_offers)])
    rig.peer.send(m.Nudge())
    rig.peer.expect(m.Pull)


def test_executor_re_adopts_a_surviving_launcher_from_its_journal(make_exe, tmp_path):
    survivor: dict[str, Any] = {}

    def journal_a_survivor(h: ActorHarness) -> None:
        proc, identity = h.spawn_sleep(30)
        attempt_id, run_id = "att-survivor", "run-survivor"
        h.ctx.executor_side.journal.accept(attempt_id, run_id, str(tmp_path / "x.log"), str(tmp_path / "x.json"),
                             token_hash(new_token()))
        h.ctx.executor_side.journal.set_state(attempt_id, "started", identity=identity)
        survivor.update(identity=identity, run_id=run_id, attempt_id=attempt_id)

    rig = make_exe(before=journal_a_survivor, real_receipts=False)
    rig.peer.send(welcome_message(rig.ctx.executor_side.session))
    rig.peer.quiet()  # its one slot is the survivor's: no pull
    assert rig.alive(), rig.h.inbox.items("supervisor", ActorFailed)
    rig.peer.send(m.StopRequested(run_id=survivor["run_id"], attempt_id=survivor["attempt_id"],
                                  reason="user", grace_ms=5_000))
    # Re-adopted: stopped by its exact identity (the test process is its parent, so the executor
    # may reap it itself: judge by /proc, not by an exit status).
    wait_until(lambda: probe(survivor["identity"], current_boot_id=BOOT_ID) is not Liveness.RUNNING,
               what="the survivor stopped")
    [consume] = rig.h.inbox.wait("receipts", Consume)  # its end was noticed (pidfd), not polled
    assert consume == Consume(survivor["run_id"], survivor["attempt_id"], stopped_by="term")
    rig.peer.quiet()  # no pull of its own: the slot is free only once control has recorded the end
    rig.peer.send(m.Nudge())  # as the Supervisor does then
    rig.peer.expect(m.Pull)


def test_executor_keeps_no_state_for_an_attempt_that_completed(make_exe):
    rig = make_exe()
    offer, _, started = rig.launch(["true"])
    rig.ack_started(started)
    completed = rig.peer.expect(m.Completed, strict=False)
    rig.ack_completed(completed)
    wait_until(lambda: rig.ctx.executor_side.journal.get(offer.attempt_id) is None, what="journal row cleared")
    proxy = rig.ref.proxy()
    wait_until(lambda: proxy.slots.live.get() == {}, what="its exit processed")
    assert not hasattr(rig.ref.proxy(), "ended_without_receipt")  # how it ended travels with Consume


# =============================================================================================
# ReceiptConsumer alone: it reports receipts to a ROUTER peer and acts on the answer
# =============================================================================================


@pytest.mark.parametrize(("exit_code", "state"), [(0, "succeeded"), (7, "failed")])
def test_receipts_a_planted_receipt_is_reported_and_removed_after_an_applied_ack(rc, exit_code, state):
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    path = rc.plant(run_id, attempt_id, token, exit_code)
    rc.ref.tell(Consume(run_id, attempt_id))
    completed = rc.peer.expect(m.Completed)
    s = rc.ctx.executor_side.session
    assert (completed.worker_id, completed.session_id, completed.session_generation) == (
        s.worker_id, s.session_id, s.generation)
    assert (completed.run_id, completed.attempt_id, completed.token, completed.exit_code) == (
        run_id, attempt_id, token, exit_code)
    assert (completed.schema_version, completed.callback_sequence, completed.log_dropped_bytes) == (1, 1, None)
    # Nothing is removed before the answer; the row is marked `completed` only if the answer is
    # fenced (the fast path spends no write on it).
    assert rc.ctx.executor_side.journal.get(attempt_id).state == "started"
    assert path.exists()

    assert rc.answer(completed) == "applied"
    wait_until(lambda: rc.ctx.executor_side.journal.get(attempt_id) is None, what="journal row cleared")
    assert not path.exists()
    assert rc.h.repo.runs.get(run_id).state == state
    assert rc.h.inbox.items("executor") == []


def test_receipts_an_already_terminal_ack_removes_the_receipt_too(rc):
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    path = rc.plant(run_id, attempt_id, token)
    rc.ref.tell(Consume(run_id, attempt_id))
    rc.answer(rc.peer.expect(m.Completed), "already_terminal")
    wait_until(lambda: rc.ctx.executor_side.journal.get(attempt_id) is None, what="journal row cleared")
    assert not path.exists()


def test_receipts_a_duplicate_ack_keeps_a_row_handed_to_log_retention(rc):
    """A link that failed over re-sends its unanswered Completed, so a second Ack can come after
    the first was handled: a cluster worker's row then waits `completed` for its log to ship, and
    that Ack must not clear it (the LogSender's next acknowledgement found no row and failed).
    The Ack to a receipt an instance that died sent still clears its row."""
    retained_run, retained = rc.journalled_attempt(new_token())
    rc.ctx.executor_side.journal.final_offset(retained, 6)
    rc.ctx.executor_side.journal.complete(retained, now_ms() + 60_000)  # as the first Ack left it
    died_run, died = rc.journalled_attempt(new_token())
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    rc.plant(run_id, attempt_id, token)
    rc.ref.tell(Consume(run_id, attempt_id))
    completed = rc.peer.expect(m.Completed)  # the worker side has spoken: the peer can answer
    rc.peer.send(ack_message("completed", retained_run, retained, "applied"))
    rc.peer.send(ack_message("completed", died_run, died, "applied"))
    assert rc.answer(completed) == "applied"
    wait_until(lambda: rc.ctx.executor_side.journal.get(died) is None and rc.ctx.executor_side.journal.get(attempt_id) is None,
               what="the dead instance's row and the answered one cleared")
    entry = rc.ctx.executor_side.journal.get(retained)  # the Acks are handled in order: the duplicate was too
    assert entry is not None and entry.state == "completed" and entry.final_offset == 6


def test_receipts_a_cluster_completed_left_unanswered_is_sent_again_until_answered(rc, monkeypatch):
    """A replica killed after it answered an earlier frame, before it committed this completion:
    the link counts the Completed answered and never re-sends it, so the ReceiptConsumer does,
    after RESEND_COMPLETED_S, until an Ack comes (edge's, in-process, is never re-sent)."""
    from qlactors.executor import receipt_consumer as receipts

    monkeypatch.setattr(receipts, "RESEND_COMPLETED_S", 0.5)
    monkeypatch.setattr(rc.ctx.executor_side, "completion_facts", lambda _a, _r: (0, True))  # as a cluster worker's
    rc.h.stub("logs")
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    rc.plant(run_id, attempt_id, token)
    rc.ref.tell(Consume(run_id, attempt_id))
    first = rc.peer.expect(m.Completed)
    t0 = time.monotonic()
    assert first.final_log_offset == 0
    again = rc.peer.expect(m.Completed)  # no answer: sent again, the same
    assert again == first and time.monotonic() - t0 >= 0.4
    assert rc.peer.expect(m.Completed) == first  # and again, while unanswered
    assert rc.answer(again) == "applied"
    wait_until(lambda: rc.ctx.executor_side.journal.get(attempt_id).state == "completed", what="the row kept for its log")
    assert rc.h.repo.runs.get(run_id).state == "succeeded"
    rc.peer.quiet(1.5)  # answered: never sent again


def test_receipts_an_edge_completed_is_not_sent_again(rc, monkeypatch):
    from qlactors.executor import receipt_consumer as receipts

    monkeypatch.setattr(receipts, "RESEND_COMPLETED_S", 0.3)
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    rc.plant(run_id, attempt_id, token)
    rc.ref.tell(Consume(run_id, attempt_id))
    rc.peer.expect(m.Completed)
    rc.peer.quiet(1.0)  # unanswered, and not sent again
    assert not rc.ref.proxy().waiting.get()[attempt_id].crosses_a_link


def test_receipts_a_refused_ack_quarantines_the_receipt(rc):
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    forged = new_token()
    path = rc.plant(run_id, attempt_id, forged)  # a token the attempt was not activated with
    before = db_state(rc.h.repo, run_id)
    rc.ref.tell(Consume(run_id, attempt_id))
    completed = rc.peer.expect(m.Completed)
    t0 = now_ms()
    assert rc.answer(completed) == "refused"

    [no_receipt] = rc.h.inbox.wait("executor", NoReceipt)
    assert no_receipt == NoReceipt(run_id, attempt_id, quarantined=True)
    entry = rc.ctx.executor_side.journal.get(attempt_id)
    retention = rc.h.config.runtime.quarantine_retention_ms
    assert entry.state == "quarantined"
    assert t0 + retention <= entry.purge_after_ms <= now_ms() + retention
    assert not path.exists()
    qroot = rc.h.config.receipts_dir / ".quarantine"
    moved = qroot / path.parent.name / path.name
    assert moved.is_file()
    assert stat.S_IMODE(qroot.stat().st_mode) == 0o700
    assert stat.S_IMODE(moved.parent.stat().st_mode) == 0o700
    assert db_state(rc.h.repo, run_id) == before  # run and attempt untouched


def test_receipts_a_fenced_ack_leaves_the_receipt_for_the_next_try(rc):
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    path = rc.plant(run_id, attempt_id, token)
    rc.ref.tell(Consume(run_id, attempt_id))
    completed = rc.peer.expect(m.Completed)
    rc.answer(completed, "fenced")
    wait_until(lambda: rc.ref.proxy().waiting.get() == {}, what="the fenced answer handled")
    # Consume again: it reports the same receipt, so the fenced answer left the file in place.
    rc.ref.tell(Consume(run_id, attempt_id))
    assert rc.peer.expect(m.Completed) == completed
    assert path.exists()
    assert rc.ctx.executor_side.journal.get(attempt_id).state == "completed"
    assert rc.h.inbox.items("executor") == []
    assert rc.answer(completed) == "applied"
    wait_until(lambda: not path.exists(), what="receipt removed")


def test_receipts_a_missing_receipt_is_reported_to_the_executor_after_the_publish_grace(rc):
    t0 = time.monotonic()
    rc.ref.tell(Consume("run-x", "att-x"))
    [no_receipt] = rc.h.inbox.wait("executor", NoReceipt)
    assert time.monotonic() - t0 >= rc.h.config.runtime.publish_grace_ms / 1000
    assert no_receipt == NoReceipt("run-x", "att-x", quarantined=False)
    rc.peer.quiet()  # nothing is reported to the control side


def test_receipts_a_receipt_published_during_the_grace_is_still_consumed(rc):
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    rc.ref.tell(Consume(run_id, attempt_id))
    rc.plant(run_id, attempt_id, token)  # lands before the one re-check, 50 ms later
    completed = rc.peer.expect(m.Completed)
    assert completed.attempt_id == attempt_id
    assert rc.h.inbox.items("executor") == []


def test_receipts_an_unreadable_receipt_is_quarantined_without_asking(rc):
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    path = rc.plant(run_id, attempt_id, token, data=b'{"schemaVersion": 1, "runId": ')
    rc.ref.tell(Consume(run_id, attempt_id))
    [no_receipt] = rc.h.inbox.wait("executor", NoReceipt)
    assert no_receipt.quarantined
    assert not path.exists()
    assert rc.ctx.executor_side.journal.get(attempt_id).state == "quarantined"
    rc.peer.quiet()


def test_receipts_an_ack_for_nothing_pending_is_ignored(rc):
    token = new_token()
    first = rc.journalled_attempt(token)
    rc.plant(*first, token)
    rc.ref.tell(Consume(*first))
    rc.answer(rc.peer.expect(m.Completed), "applied")
    second = rc.journalled_attempt(token)
    second_path = rc.plant(*second, token)
    rc.ref.tell(Consume(*second))
    completed = rc.peer.expect(m.Completed)
    # Acks nobody waits for: an unknown attempt, and a late second answer about the first one.
    for run_id, attempt_id in (("run-z", "att-z"), first):
        rc.peer.send(ack_message("completed", run_id, attempt_id, "refused"))
    rc.answer(completed)  # same connection, so handled after the two above
    wait_until(lambda: not second_path.exists(), what="the second receipt removed")
    assert rc.ref.is_alive()
    assert rc.ctx.executor_side.journal.get(first[1]) is None  # the late refusal neither resurrected nor moved anything
    assert not (rc.h.config.receipts_dir / ".quarantine").exists()
    assert rc.h.inbox.items("executor") == []


# =============================================================================================
# Scheduler alone, with stub recovery / retry / supervisor actors
# =============================================================================================


def test_scheduler_a_tick_runs_recovery_then_retry_then_reports_the_cycle(sched):
    step_stub(sched, "recovery")
    step_stub(sched, "retry")
    sched.stub("supervisor")
    ref = sched.start("scheduler", Scheduler)
    ref.tell(Tick("test"))
    [done] = sched.inbox.wait("supervisor", CycleDone)
    # Nothing in flight and no step reported work: the idle tick may apply.
    assert done == CycleDone(ok=True, next_due_ms=None, stops=(), work_waiting=False, idle=True)
    assert sched.inbox.log() == [("recovery", StepRequest(1)), ("retry", StepRequest(1)), ("supervisor", done)]


def test_scheduler_a_cycle_commits_timeouts_and_reports_stops_and_waiting_work(sched):
    step_stub(sched, "recovery")
    step_stub(sched, "retry")
    sched.stub("supervisor")
    repo, d, s = sched.repo, sched.ctx.control_side.dispatch, sched.ctx.executor_side.session
    repo.tasks.add(spec("slow", timeout_ms=1, stop_grace_ms=700))
    run_id = repo.runs.request("slow").run.id
    lease_hash = token_hash(new_token())
    view = d.offers.one(s.worker_id, s.session_id, s.generation, "o1", lease_hash, log_cap_bytes=0)
    fence = view.fence(lease_hash)
    assert d.reports.activate(fence, token_hash(new_token()), "ab/x.log").result == "applied"
    assert d.reports.started(fence, BOOT_ID, 4242, 4242, 1).result == "applied"
    repo.tasks.add(spec("waiting"))
    repo.runs.request("waiting")
    time.sleep(0.005)  # past the 1 ms deadline
    ref = sched.start("scheduler", Scheduler)
    ref.tell(Tick("test"))
    [done] = sched.inbox.wait("supervisor", CycleDone)
    assert done.ok and done.work_waiting
    [stop] = set(done.stops)
    assert (stop.run_id, stop.attempt_id, stop.reason, stop.grace_ms, stop.pid) == (
        run_id, view.attempt_id, "timeout", 700, 4242)
    assert repo.runs.get(run_id).cancel_reason == "timeout"


def test_scheduler_a_cycle_lists_each_stop_order_once(sched):
    step_stub(sched, "recovery")
    step_stub(sched, "retry")
    sched.stub("supervisor")
    repo, d, s = sched.repo, sched.ctx.control_side.dispatch, sched.ctx.executor_side.session
    repo.tasks.add(spec("slow", timeout_ms=1))
    repo.runs.request("slow")
    lease_hash = token_hash(new_token())
    fence = d.offers.one(s.worker_id, s.session_id, s.generation, "o1", lease_hash, log_cap_bytes=0).fence(lease_hash)
    d.reports.activate(fence, token_hash(new_token()), "ab/x.log")
    time.sleep(0.005)
    sched.start("scheduler", Scheduler).tell(Tick("test"))
    [done] = sched.inbox.wait("supervisor", CycleDone)
    assert len(done.stops) == len(set(done.stops)) == 1


def test_scheduler_a_silent_step_ends_the_cycle_at_its_deadline_and_is_reported(sched, monkeypatch):
    monkeypatch.setattr(scheduler_module, "STEP_DEADLINE_S", 0.2)
    step_stub(sched, "recovery", silent=True)
    step_stub(sched, "retry")
    sched.stub("supervisor")
    ref = sched.start("scheduler", Scheduler)
    t0 = time.monotonic()
    ref.tell(Tick("test"))
    [done] = sched.inbox.wait("supervisor", CycleDone)
    assert time.monotonic() - t0 >= 0.2
    assert not done.ok and done.stops == () and not done.work_waiting
    [failed] = sched.inbox.wait("supervisor", ActorFailed)
    assert failed.name == "recovery"
    assert sched.inbox.items("retry") == []  # nothing after a step whose authority is unknown


def test_scheduler_a_failing_step_stops_the_cycle_before_retry(sched):
    step_stub(sched, "recovery", ok=False)
    step_stub(sched, "retry")
    sched.stub("supervisor")
    ref = sched.start("scheduler", Scheduler)
    ref.tell(Tick("test"))
    [done] = sched.inbox.wait("supervisor", CycleDone)
    assert not done.ok
    time.sleep(QUIET_S)
    assert sched.inbox.items("retry") == []
    assert sched.inbox.items("supervisor", ActorFailed) == []  # it answered: no restart needed


def test_scheduler_a_failed_cycle_withholds_authority_until_a_cycle_gets_through(sched):
    answers = {"ok": False}

    def recovery(message: Any) -> None:
        if isinstance(message, StepRequest):
            sched.directory.tell("scheduler", StepDone(message.cycle, "recovery", answers["ok"], detail="db down"))

    sched.stub("recovery", recovery)
    step_stub(sched, "retry")
    sched.stub("supervisor")
    assert sched.ctx.control_side.authority.is_set()  # nothing has failed yet
    ref = sched.start("scheduler", Scheduler)
    ref.tell(Tick("test"))
    [done] = sched.inbox.wait("supervisor", CycleDone)
    assert not done.ok and not sched.ctx.control_side.authority.is_set()
    answers["ok"] = True
    ref.tell(Tick("test"))
    done = sched.inbox.wait("supervisor", CycleDone, count=2)
    assert done[-1].ok and sched.ctx.control_side.authority.is_set()


def test_scheduler_a_step_actor_that_is_not_running_fails_the_cycle(sched):
    step_stub(sched, "recovery")
    sched.stub("supervisor")  # no "retry" in the directory
    ref = sched.start("scheduler", Scheduler)
    ref.tell(Tick("test"))
    [done] = sched.inbox.wait("supervisor", CycleDone)
    assert not done.ok


def test_scheduler_ticks_during_a_cycle_are_coalesced_into_one_more_cycle(sched):
    step_stub(sched, "recovery", silent=True)  # the test answers for it, when it chooses
    step_stub(sched, "retry")
    sched.stub("supervisor")
    ref = sched.start("scheduler", Scheduler)
    for _ in range(4):
        ref.tell(Tick("test"))
    sched.inbox.wait("recovery", StepRequest)
    ref.tell(StepDone(0, "recovery", True))  # a late answer of another cycle changes nothing
    ref.tell(StepDone(1, "recovery", True))
    sched.inbox.wait("recovery", StepRequest, count=2)
    ref.tell(StepDone(2, "recovery", True))
    done = sched.inbox.wait("supervisor", CycleDone, count=2)
    assert all(d.ok for d in done)
    time.sleep(QUIET_S)
    assert sched.inbox.items("recovery") == [StepRequest(1), StepRequest(2)]
    assert sched.inbox.items("retry") == [StepRequest(1), StepRequest(2)]
    assert len(sched.inbox.items("supervisor", CycleDone)) == 2


def test_scheduler_a_due_schedule_is_admitted_in_the_cycle_and_the_next_fire_is_reported(sched):
    from qlactors.store.triggers import TriggerOptions

    step_stub(sched, "recovery")
    step_stub(sched, "retry")
    sched.stub("supervisor")
    # max_queued 4: a slow first cycle may admit the fire it initialised on, which (queued, no
    # executor here) must not make the next fire a `skipped` one.
    sched.repo.tasks.add(spec("every-second", max_queued=4), trigger=TriggerOptions(cron="* * * * * *",
                                                                                  tz="UTC"))
    ref = sched.start("scheduler", Scheduler)
    ref.tell(Tick("test"))
    [done] = sched.inbox.wait("supervisor", CycleDone)
    # First sight initialises the cursor (and admits a fire that falls exactly on it).
    assert done.ok and done.next_due_ms is not None and not done.idle
    time.sleep(max(0.0, done.next_due_ms / 1000 - time.time()) + 0.01)
    ref.tell(Tick("due"))
    [_, second] = sched.inbox.wait("supervisor", CycleDone, count=2)
    runs = [r for r in sched.repo.runs.list().runs if r.trigger_type == "cron"]
    assert second.ok and second.work_waiting and runs
    assert done.next_due_ms in {r.scheduled_for_ms for r in runs}
    assert second.next_due_ms > done.next_due_ms  # the cursor moved past the admitted fire


def test_scheduler_a_failing_cron_step_ends_the_cycle_before_stops_and_admission(sched, monkeypatch):
    step_stub(sched, "recovery")
    step_stub(sched, "retry")
    sched.stub("supervisor")
    sched.repo.tasks.add(spec("waiting"))
    sched.repo.runs.request("waiting")

    def broken(*_a, **_k):
        raise RuntimeError("database is locked")
    monkeypatch.setattr(sched.ctx.control_side.cron, "due", broken)
    sched.start("scheduler", Scheduler).tell(Tick("test"))
    [done] = sched.inbox.wait("supervisor", CycleDone)
    assert not done.ok and not done.work_waiting and done.stops == ()


# =============================================================================================
# Recovery and Retry alone, on the real store
# =============================================================================================


def test_recovery_startup_pass_judges_every_kind_of_in_flight_attempt(rec):
    old = rec.ctx.executor_side.session  # the session of the runtime that "crashed"
    flights = Flights(rec, old)
    proc, live = rec.spawn_sleep(30)
    dead = rec.dead_identity()
    token = new_token()
    claimed = flights.make("claimed")
    surviving = flights.make("running", live)
    gone = flights.make("running", dead)
    receipted = flights.make("running", dead, token)
    receipt = plant_receipt(rec, *receipted, token, exit_code=5)
    cancelled = flights.make("running", dead)
    rec.repo.runs.cancel(cancelled[0])
    backlog = flights.make("queued")
    rec.ctx.control_side.local.session = rec.ctx.control_side.dispatch.sessions.register("local", 8)  # this start's session

    ref = rec.start("recovery", Recovery)
    totals = ref.ask(StartupPass(), timeout=WAIT_S)
    assert totals == {"lost": 1, "released": 1, "running": 1, "completed": 1, "ended_by_intent": 1}

    # Offered, never activated: its lease is released and it is offered again, never lost.
    run = rec.repo.runs.get(claimed[0])
    assert (run.state, run.attempts[0].state, run.attempts[0].error_code) == ("dispatching", "claimed", None)
    assert [(lease["status"], lease["release_reason"]) for lease in leases(rec.repo, claimed[0])] == [
        ("released", "lease_expired")]
    assert rec.ctx.control_side.control.status.queued_waiting()  # the Scheduler nudges executors for it

    run = rec.repo.runs.get(gone[0])
    assert (run.state, run.attempts[0].state, run.attempts[0].error_code) == (
        "lost", "lost", ErrorCode.RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT)

    run = rec.repo.runs.get(receipted[0])
    assert (run.state, run.attempts[0].exit_code) == ("failed", 5)
    assert not receipt.exists()

    assert rec.repo.runs.get(cancelled[0]).state == "cancelled"
    assert rec.repo.runs.get(backlog[0]).state == "queued"

    # The survivor keeps running, re-bound to the new session with a fresh lease.
    assert proc.poll() is None
    run = rec.repo.runs.get(surviving[0])
    assert (run.state, run.attempts[0].state) == ("running", "running")
    row = attempt_row(rec.repo, surviving[1])
    new = rec.ctx.control_side.local.session
    assert (row.session_id, row.session_generation, row.pid, row.start_ticks) == (
        new.session_id, new.generation, live.pid, live.start_ticks)
    assert [(lease["session_id"], lease["status"]) for lease in leases(rec.repo, surviving[0])] == [
        (old.session_id, "released"), (new.session_id, "leased")]
    assert rec.ctx.control_side.control.recovery.candidates(64)[0] == [rec.ctx.control_side.control.recovery.candidate(surviving[1])]
    assert ref.is_alive()
    # The released claim is offered again, to the new session, under the next lease generation.
    again = rec.ctx.control_side.dispatch.offers.one(new.worker_id, new.session_id, new.generation, "offer-again",
                                   token_hash(new_token()), log_cap_bytes=0)
    assert (again.run_id, again.attempt_id, again.lease_generation) == (claimed[0], claimed[1], 2)


def test_recovery_startup_pass_recovers_200_in_flight_attempts_in_one_call(rec, monkeypatch):
    dead = rec.dead_identity()
    kinds = {"claimed": 80, "dead": 80, "receipt": 40}
    # Setting up 200 attempts takes ~700 transactions: do them without fsync, on a second store
    # over the same file. The pass itself runs on the harness's store (synchronous=FULL).
    with monkeypatch.context() as patch:
        patch.setattr(sqlite_store, "PRAGMAS", tuple(
            "PRAGMA synchronous=OFF" if p.startswith("PRAGMA synchronous") else p for p in sqlite_store.PRAGMAS))
        setup = Repository.open(rec.config.database_url)
    try:
        flights = Flights(rec, rec.ctx.executor_side.session, setup)
        for _ in range(kinds["claimed"]):
            flights.make("claimed")
        for _ in range(kinds["dead"]):
            flights.make("running", dead)
        for _ in range(kinds["receipt"]):
            token = new_token()
            plant_receipt(rec, *flights.make("running", dead, token), token, exit_code=0)
    finally:
        setup.close()
    assert rec.ctx.control_side.control.recovery.candidates(64)[1]  # more than one page
    ref = rec.start("recovery", Recovery)
    t0 = time.monotonic()
    totals = ref.ask(StartupPass(), timeout=60)
    elapsed = time.monotonic() - t0
    print(f"\nstartup recovery of 200 in-flight attempts took {elapsed:.3f} s: {totals}")
    assert totals == {"released": 80, "lost": 80, "completed": 40}
    assert rec.ctx.control_side.control.recovery.candidates(64) == ([], False)


def test_recovery_continuous_pass_judges_what_the_executor_attests(rec):
    flights = Flights(rec, rec.ctx.executor_side.session)
    _, live = rec.spawn_sleep(30)
    dead = rec.dead_identity()
    ended = flights.make("running", dead)
    unreported = flights.make("running", dead)  # not attested: the live Executor still owns it
    healthy = flights.make("running", live)
    ref = rec.start("recovery", Recovery)
    ref.tell(AttemptEnded(*ended))
    ref.tell(StepRequest(3))
    [done] = rec.inbox.wait("scheduler", StepDone)
    assert done == StepDone(3, "recovery", True, pending=True)  # it had an attested attempt to judge
    run = rec.repo.runs.get(ended[0])
    assert (run.state, run.attempts[0].error_code) == ("lost", ErrorCode.RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT)
    assert rec.repo.runs.get(unreported[0]).state == "running"
    assert rec.repo.runs.get(healthy[0]).state == "running"


def test_recovery_takes_the_identity_from_the_journal_when_started_never_committed(rec):
    flights = Flights(rec, rec.ctx.executor_side.session)
    proc, live = rec.spawn_sleep(30)
    token = new_token()
    run_id, attempt_id = flights.make("starting", token=token)
    j = rec.ctx.executor_side.journal
    j.accept(attempt_id, run_id, str(rec.ctx.executor_side.logs.path_for(run_id, attempt_id)),
             str(rec.ctx.executor_side.receipts.final_path(attempt_id)), token_hash(token))
    j.set_state(attempt_id, "started", identity=live)
    rec.ctx.control_side.local.session = rec.ctx.control_side.dispatch.sessions.register("local", 8)
    ref = rec.start("recovery", Recovery)
    assert ref.ask(StartupPass(), timeout=WAIT_S) == {"running": 1}
    run = rec.repo.runs.get(run_id)
    assert (run.state, run.attempts[0].state) == ("running", "running")
    assert proc.poll() is None


def test_retry_resolves_a_lost_run_without_policy_as_failed(rec):
    flights = Flights(rec, rec.ctx.executor_side.session)
    run_id, attempt_id = flights.make("claimed")
    assert rec.ctx.control_side.control.recovery.mark_lost(run_id, attempt_id, ErrorCode.RECOVERY_UNSTARTED_CLAIM).result == "applied"
    ref = rec.start("retry", Retry)
    ref.tell(StepRequest(5))
    [done] = rec.inbox.wait("scheduler", StepDone)
    assert done == StepDone(5, "retry", True, pending=True)  # it resolved a lost run
    run = rec.repo.runs.get(run_id)
    assert (run.state, run.error_code) == ("failed", ErrorCode.RUN_LOST_RETRY_DISABLED)


def test_retry_requeues_a_lost_run_whose_policy_allows_it(rec):
    rec.repo.tasks.add(spec("again", retry=RetryPolicy(max_attempts=2, retry_on_lost=True, safety="idempotent",
                                                       backoff_base_ms=0, backoff_max_ms=0)))
    run_id = rec.repo.runs.request("again").run.id
    s, lease_hash = rec.ctx.executor_side.session, token_hash(new_token())
    view = rec.ctx.control_side.dispatch.offers.one(s.worker_id, s.session_id, s.generation, "o1", lease_hash, log_cap_bytes=0)
    rec.ctx.control_side.control.recovery.mark_lost(run_id, view.attempt_id, ErrorCode.RECOVERY_UNSTARTED_CLAIM)
    ref = rec.start("retry", Retry)
    ref.tell(StepRequest(1))
    assert rec.inbox.wait("scheduler", StepDone)[0].ok
    run = rec.repo.runs.get(run_id)
    assert run.state == "queued"
    assert [(a.number, a.state) for a in run.attempts] == [(1, "lost"), (2, "claimed")]
