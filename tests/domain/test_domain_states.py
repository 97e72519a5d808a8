"""The pure run/attempt/lease state machines and their plan builders (SEMANTICS.md §2, §3, §5, §7)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qlactors.domain.states import (
    ATTEMPT_ACTIVE,
    ATTEMPT_TERMINAL,
    ATTEMPT_TRANSITIONS,
    EVENT_TYPES,
    LEASE_TRANSITIONS,
    RUN_CANCEL_REQUESTED,
    RUN_CREATED,
    RUN_RETRY_SCHEDULED,
    RUN_STATUS_ATTEMPT,
    RUN_TERMINAL,
    RUN_TRANSITIONS,
    AttemptStatus,
    CancelReason,
    LeaseStatus,
    RunStatus,
    attempt_event,
    run_event,
)
from qlactors.domain.transitions import (
    adoption_payload,
    plan_adopted,
    AttemptSnapshot,
    ErrorCode,
    InvalidTransition,
    Plan,
    RunSnapshot,
    plan_activate,
    plan_admission,
    plan_cancel,
    plan_completion,
    plan_end_by_intent,
    plan_lost,
    plan_lost_failed,
    plan_offer,
    plan_requeue,
    plan_retry_wait,
    plan_start_failed,
    plan_started,
    transition,
)

R, A, L = RunStatus, AttemptStatus, LeaseStatus

RUN_STATUS_EVENTS = {run_event(s): s for s in RunStatus}
ATTEMPT_STATUS_EVENTS = {attempt_event(s): s for s in AttemptStatus}


# --- folding plans into snapshots ------------------------------------------------------------


def fold(run: RunSnapshot | None, attempt: AttemptSnapshot | None, plan: Plan,
         new_number: int | None = None) -> tuple[RunSnapshot, AttemptSnapshot | None]:
    """Apply a plan as the store would: new statuses, version, event sequence, sticky cancel reason."""
    cancel_reason = plan.cancel_reason or (run.cancel_reason if run else None)
    new_run = RunSnapshot(id=plan.run_id, status=plan.run_to, version=plan.version,
                          event_sequence=plan.event_sequence, cancel_reason=cancel_reason)
    if plan.attempt_id is None:
        return new_run, attempt
    if attempt is None or plan.attempt_id != attempt.id:
        number = new_number if new_number is not None else 1
        return new_run, AttemptSnapshot(id=plan.attempt_id, number=number, status=plan.attempt_to)
    return new_run, replace(attempt, status=plan.attempt_to)


def admitted() -> tuple[RunSnapshot, AttemptSnapshot]:
    return fold(None, None, plan_admission("run-1", "att-1"))


def apply(state, plan, new_number=None):
    run, attempt = state
    return fold(run, attempt, plan, new_number)


def to_running(reason: CancelReason | None = None):
    state = admitted()
    for build in (plan_offer, plan_activate, plan_started):
        state = apply(state, build(*state))
    if reason is not None:
        state = apply(state, plan_cancel(*state, reason))
    return state


def to_lost(reason: CancelReason | None = None):
    state = to_running(reason)
    return apply(state, plan_lost(*state, ErrorCode.RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT))


def types(plan: Plan) -> list[str]:
    return [e.type for e in plan.events]


# --- table facts -----------------------------------------------------------------------------


@pytest.mark.parametrize("table, statuses", [
    (RUN_TRANSITIONS, RunStatus), (ATTEMPT_TRANSITIONS, AttemptStatus), (LEASE_TRANSITIONS, LeaseStatus),
])
def test_every_status_is_a_key_of_its_table(table, statuses):
    assert set(table) == set(statuses)
    for targets in table.values():
        assert targets <= set(statuses)


def test_terminal_run_states_have_no_outgoing_edges():
    assert RUN_TERMINAL == {R.SUCCEEDED, R.FAILED, R.CANCELLED, R.TIMED_OUT}
    for s in RunStatus:
        assert s.terminal == (s in RUN_TERMINAL)
        assert (RUN_TRANSITIONS[s] == frozenset()) == s.terminal


def test_terminal_attempt_states_have_no_outgoing_edges():
    assert ATTEMPT_TERMINAL == {A.SUCCEEDED, A.FAILED, A.CANCELLED, A.TIMED_OUT, A.LOST}
    for s in AttemptStatus:
        assert s.terminal == (s in ATTEMPT_TERMINAL)
        assert (ATTEMPT_TRANSITIONS[s] == frozenset()) == s.terminal
    assert ATTEMPT_ACTIVE.isdisjoint(ATTEMPT_TERMINAL)


def test_ended_leases_have_no_outgoing_edges_and_renew_keeps_leased():
    assert LEASE_TRANSITIONS[L.RELEASED] == frozenset()
    assert LEASE_TRANSITIONS[L.COMPLETED] == frozenset()
    assert L.LEASED in LEASE_TRANSITIONS[L.LEASED]


def test_no_state_returns_to_itself_except_lease_renew():
    assert all(s not in RUN_TRANSITIONS[s] for s in RunStatus)
    assert all(s not in ATTEMPT_TRANSITIONS[s] for s in AttemptStatus)


def test_run_table_matches_semantics():
    assert RUN_TRANSITIONS[R.QUEUED] == {R.DISPATCHING, R.CANCELLED}
    assert RUN_TRANSITIONS[R.LOST] == {R.RETRY_WAIT, R.FAILED, R.CANCELLED, R.TIMED_OUT}
    assert RUN_TRANSITIONS[R.RETRY_WAIT] == {R.QUEUED, R.CANCELLED}
    # `failed`: an offer that cannot be built or encoded (OFFER_UNENCODABLE, issue 9).
    assert ATTEMPT_TRANSITIONS[A.CLAIMED] == {A.STARTING, A.FAILED, A.CANCELLED, A.LOST}


def test_status_event_names_are_known_event_types():
    for s in RunStatus:
        assert run_event(s) == f"run.{s.value}" and run_event(s) in EVENT_TYPES
    for s in AttemptStatus:
        assert attempt_event(s) == f"attempt.{s.value}" and attempt_event(s) in EVENT_TYPES
    assert {RUN_CREATED, RUN_CANCEL_REQUESTED, RUN_RETRY_SCHEDULED} <= EVENT_TYPES
    assert {"attempt.output_left_open", "attempt.evidence_withdrawn", "attempt.adopted"} <= EVENT_TYPES
    assert len(EVENT_TYPES) == 6 + len(RunStatus) + len(AttemptStatus)


def test_run_status_attempt_covers_every_run_status_with_consistent_terminality():
    assert set(RUN_STATUS_ATTEMPT) == set(RunStatus)
    for s in RUN_TERMINAL:
        assert RUN_STATUS_ATTEMPT[s] <= ATTEMPT_TERMINAL


# --- random walk over the builders -----------------------------------------------------------

reasons = st.sampled_from(list(CancelReason))
error_codes = st.sampled_from([v for k, v in vars(ErrorCode).items() if k.isupper()] + ["X", ""])
times = st.integers(0, 10_000)
exit_codes = st.sampled_from([0, 1, 137, 255]) | st.integers(-1, 256)
BUILDERS = ["offer", "activate", "started", "completion", "lost", "retry_wait", "requeue",
            "cancel", "end_by_intent", "start_failed", "lost_failed"]
# Half the steps aim at a builder that usually fits the run's status, so walks get deep (running,
# retry, requeue); the other half pick any builder, mostly invalid ones.
AIMED = {
    (R.QUEUED, A.CLAIMED): ["offer"],
    (R.DISPATCHING, A.CLAIMED): ["activate", "lost", "cancel"],
    (R.DISPATCHING, A.STARTING): ["started", "completion", "cancel", "lost", "end_by_intent",
                                  "start_failed"],
    (R.RUNNING, A.RUNNING): ["completion", "cancel", "lost", "end_by_intent"],
    (R.LOST, A.LOST): ["retry_wait", "end_by_intent", "cancel", "lost_failed"],
    (R.RETRY_WAIT, A.LOST): ["requeue", "cancel"],
}


def draw_step(data, run: RunSnapshot, attempt: AttemptSnapshot, name: str | None = None):
    """Pick a builder (unless named) and random arguments; return (name, thunk, new attempt number)."""
    if name is None:
        aimed = AIMED.get((run.status, attempt.status))
        wild = not aimed or data.draw(st.booleans(), label="wild")
        name = data.draw(st.sampled_from(BUILDERS if wild else aimed), label="builder")
    if name == "cancel":
        reason = data.draw(reasons, label="reason")
        return name, lambda: plan_cancel(run, attempt, reason), None
    if name == "end_by_intent":
        return name, lambda: plan_end_by_intent(run, attempt), None
    if name == "completion":
        exit_code = data.draw(exit_codes, label="exit_code")
        finished = data.draw(times, label="finished_at_ms")
        deadline = data.draw(st.none() | times, label="deadline_at_ms")
        return name, lambda: plan_completion(run, attempt, exit_code=exit_code, finished_at_ms=finished,
                                             deadline_at_ms=deadline), None
    if name in ("lost", "lost_failed"):
        code = data.draw(error_codes, label="error_code")
        build = plan_lost if name == "lost" else plan_lost_failed
        return name, lambda: build(run, attempt, code), None
    if name == "retry_wait":
        at = data.draw(times, label="next_attempt_at_ms")
        return name, lambda: plan_retry_wait(run, attempt, at), None
    if name == "requeue":
        number = attempt.number + 1
        return name, lambda: plan_requeue(run, f"att-{number}", number), number
    build = {"offer": plan_offer, "activate": plan_activate, "started": plan_started,
             "start_failed": plan_start_failed}[name]
    return name, lambda: build(run, attempt), None


def check_plan(run: RunSnapshot, attempt: AttemptSnapshot, plan: Plan, name: str) -> None:
    # (d) no plan without events
    assert plan.events, f"{name} planned no events"
    # (b) versions and event sequences move by one per event, contiguously
    assert plan.run_from == run.status and plan.expected_version == run.version
    assert plan.version == plan.expected_version + len(plan.events)
    assert plan.event_sequence == run.event_sequence + len(plan.events)
    assert [e.sequence for e in plan.events] == list(
        range(run.event_sequence + 1, run.event_sequence + len(plan.events) + 1))
    assert all(e.type in EVENT_TYPES for e in plan.events)
    # (c) every change is an edge of its table
    if plan.changes_run:
        assert plan.run_to in RUN_TRANSITIONS[run.status], (name, run.status, plan.run_to)
    same_attempt = plan.attempt_id is not None and plan.attempt_id == attempt.id
    new_attempt = plan.attempt_id is not None and plan.attempt_id != attempt.id
    if same_attempt:
        assert plan.attempt_from == attempt.status
        if plan.changes_attempt:
            assert plan.attempt_to in ATTEMPT_TRANSITIONS[attempt.status], (
                name, attempt.status, plan.attempt_to)
    if new_attempt:  # only a requeue opens a new attempt, and only `claimed`
        assert name == "requeue" and (plan.attempt_from, plan.attempt_to) == (None, A.CLAIMED)
    # (a) a terminal attempt never changes
    if attempt.status.terminal and same_attempt:
        assert plan.attempt_to == attempt.status
    # (e) one status event per status change, none without a change
    run_events = [e for e in plan.events if e.type in RUN_STATUS_EVENTS]
    attempt_events = [e for e in plan.events if e.type in ATTEMPT_STATUS_EVENTS]
    assert [e.type for e in run_events] == ([run_event(plan.run_to)] if plan.changes_run else [])
    assert [e.type for e in attempt_events] == (
        [attempt_event(plan.attempt_to)] if plan.changes_attempt else [])
    assert all(e.attempt_id == plan.attempt_id for e in attempt_events)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_random_walk_keeps_every_invariant(data):
    run, attempt = admitted()
    assert (run.status, run.version, run.event_sequence, attempt.status) == (R.QUEUED, 3, 3, A.CLAIMED)
    for _ in range(data.draw(st.integers(1, 40), label="steps")):
        if run.status.terminal:
            # (a) no path leaves a terminal run: every builder refuses, plan_cancel answers None
            for name in BUILDERS:
                build = draw_step(data, run, attempt, name)[1]
                try:
                    plan = build()
                except InvalidTransition:
                    continue
                assert plan is None and name == "cancel", f"{name} left terminal {run.status.value}"
            return
        name, build, new_number = draw_step(data, run, attempt)
        try:
            plan = build()
        except InvalidTransition:
            continue
        if plan is None:
            assert name == "cancel" and run.cancel_reason is not None
            continue
        check_plan(run, attempt, plan, name)
        run, attempt = fold(run, attempt, plan, new_number)
        assert attempt.status in RUN_STATUS_ATTEMPT[run.status], (name, run.status, attempt.status)


@pytest.mark.parametrize("status", sorted(RUN_TERMINAL))
@pytest.mark.parametrize("reason", list(CancelReason))
def test_no_builder_leaves_a_terminal_run(status, reason):
    attempt = AttemptSnapshot(id="att-1", number=1, status=A.SUCCEEDED)
    for cancel_reason in (None, reason):
        run = RunSnapshot(id="run-1", status=status, version=9, event_sequence=9,
                          cancel_reason=cancel_reason)
        assert plan_cancel(run, attempt, reason) is None
        builders = [
            lambda: plan_end_by_intent(run, attempt),
            lambda: plan_completion(run, attempt, exit_code=0, finished_at_ms=1, deadline_at_ms=None),
            lambda: plan_offer(run, attempt), lambda: plan_activate(run, attempt),
            lambda: plan_started(run, attempt), lambda: plan_start_failed(run, attempt),
            lambda: plan_lost(run, attempt, "X"), lambda: plan_retry_wait(run, attempt, 5),
            lambda: plan_lost_failed(run, attempt, "X"), lambda: plan_requeue(run, "att-2", 2),
            lambda: transition(run, attempt, lead_events=(RUN_CANCEL_REQUESTED,)),
        ]
        for build in builders:
            with pytest.raises(InvalidTransition):
                build()


# --- behaviour, by example -------------------------------------------------------------------


def test_admission_plans_created_queued_and_attempt_one_claimed_at_version_three():
    plan = plan_admission("run-1", "att-1", {"trigger": "manual"})
    assert types(plan) == ["run.created", "run.queued", "attempt.claimed"]
    assert [e.sequence for e in plan.events] == [1, 2, 3]
    assert (plan.expected_version, plan.version, plan.event_sequence) == (0, 3, 3)
    assert (plan.run_to, plan.attempt_to, plan.events[2].attempt_id) == (R.QUEUED, A.CLAIMED, "att-1")
    assert plan.events[0].payload == {"trigger": "manual"}
    # The claim is the runtime's step, not the person's who asked for the run (issue 28).
    assert [e.by_system for e in plan.events] == [False, False, True]


def test_an_adoption_is_an_event_of_its_own_and_a_starting_attempt_becomes_running():
    """issue 28: a re-bind after a restart bumps the run's version with `attempt.adopted`;
    a `starting` attempt (its Started never landed) also records the `running` a Started would."""
    offered = apply(admitted(), plan_offer(*admitted()))
    state = apply(offered, plan_activate(*offered))  # starting
    payload = adoption_payload(2, 1, "w1", "s2")
    from_starting = plan_adopted(*state, payload)
    assert types(from_starting) == ["attempt.adopted", "attempt.running", "run.running"]
    assert from_starting.events[0].payload == {"lease_generation": 2, "from_generation": 1, "worker_id": "w1",
                                               "session_id": "s2"}
    running = apply(state, plan_started(*state))
    again = plan_adopted(*running, adoption_payload(3, 2, "w1", "s3"))
    assert types(again) == ["attempt.adopted"]
    assert (again.run_to, again.attempt_to) == (R.RUNNING, A.RUNNING)
    assert (again.version, again.event_sequence) == (running[0].version + 1, running[0].event_sequence + 1)
    with pytest.raises(InvalidTransition):
        plan_adopted(*admitted(), payload)  # only a live attempt is adopted


def test_happy_path_offer_activate_started_completion_succeeds():
    state = admitted()
    offer = plan_offer(*state)
    assert types(offer) == ["run.dispatching"] and offer.attempt_to is A.CLAIMED
    state = apply(state, offer)
    activate = plan_activate(*state)
    assert types(activate) == ["attempt.starting"] and activate.run_to is R.DISPATCHING
    state = apply(state, activate)
    started = plan_started(*state)
    assert types(started) == ["attempt.running", "run.running"]
    state = apply(state, started)
    done = plan_completion(*state, exit_code=0, finished_at_ms=5, deadline_at_ms=10)
    assert types(done) == ["attempt.succeeded", "run.succeeded"]
    assert (done.error_code, done.version, done.events[0].payload) == (None, 9, {"exit_code": 0})


def test_cancel_of_queued_run_ends_cancelled_with_three_events():
    run, attempt = admitted()
    plan = plan_cancel(run, attempt, CancelReason.USER)
    assert types(plan) == ["run.cancel_requested", "attempt.cancelled", "run.cancelled"]
    assert [e.sequence for e in plan.events] == [4, 5, 6] and plan.version == 6
    assert (plan.run_to, plan.attempt_to) == (R.CANCELLED, A.CANCELLED)
    assert (plan.cancel_reason, plan.error_code) == (CancelReason.USER, ErrorCode.EXECUTION_CANCELLED)
    assert plan.events[0].payload == {"reason": "user"}


def test_cancel_of_offered_but_unactivated_run_ends_at_once():
    state = admitted()
    state = apply(state, plan_offer(*state))
    plan = plan_cancel(*state, CancelReason.POLICY)
    assert types(plan) == ["run.cancel_requested", "attempt.cancelled", "run.cancelled"]


@pytest.mark.parametrize("build", ["starting", "running"])
def test_cancel_of_running_run_records_intent_only(build):
    state = admitted()
    state = apply(state, plan_offer(*state))
    state = apply(state, plan_activate(*state))
    if build == "running":
        state = apply(state, plan_started(*state))
    run, attempt = state
    plan = plan_cancel(run, attempt, CancelReason.USER)
    assert types(plan) == ["run.cancel_requested"]
    assert not plan.changes_run and not plan.changes_attempt
    assert (plan.run_to, plan.attempt_to) == (run.status, attempt.status)
    assert plan.cancel_reason is CancelReason.USER and plan.version == run.version + 1
    run2, attempt2 = fold(run, attempt, plan)
    end = plan_end_by_intent(run2, attempt2)
    assert types(end) == ["attempt.cancelled", "run.cancelled"]
    assert end.error_code == ErrorCode.EXECUTION_CANCELLED


def test_second_cancel_adds_no_event():
    run, attempt = to_running(CancelReason.TIMEOUT)
    assert run.cancel_reason is CancelReason.TIMEOUT
    for reason in CancelReason:
        assert plan_cancel(run, attempt, reason) is None


def test_shutdown_never_overwrites_an_earlier_reason():
    run, attempt = to_running(CancelReason.USER)
    assert plan_cancel(run, attempt, CancelReason.SHUTDOWN) is None
    assert plan_end_by_intent(run, attempt).run_to is R.CANCELLED


def test_end_by_intent_without_intent_is_refused():
    with pytest.raises(InvalidTransition):
        plan_end_by_intent(*to_running())


def test_completion_after_timeout_intent_is_timed_out_unless_finished_by_deadline():
    state = to_running(CancelReason.TIMEOUT)
    late = plan_completion(*state, exit_code=0, finished_at_ms=1001, deadline_at_ms=1000)
    assert types(late) == ["attempt.timed_out", "run.timed_out"]
    assert late.error_code == ErrorCode.EXECUTION_TIMED_OUT
    on_time = plan_completion(*state, exit_code=0, finished_at_ms=1000, deadline_at_ms=1000)
    assert types(on_time) == ["attempt.succeeded", "run.succeeded"] and on_time.error_code is None
    on_time_failed = plan_completion(*state, exit_code=3, finished_at_ms=999, deadline_at_ms=1000)
    assert (on_time_failed.run_to, on_time_failed.error_code) == (R.FAILED, ErrorCode.EXIT_NONZERO)


def test_a_cluster_job_the_timeout_stop_signalled_is_timed_out_though_its_worker_says_in_time():
    # The worker's deadline is its activation + timeout, later than the database's: the control
    # side's stop at the database's deadline kills the job before the worker's. Found by the soak.
    state = to_running(CancelReason.TIMEOUT)
    killed = plan_completion(*state, exit_code=143, finished_at_ms=1, deadline_at_ms=None,
                             signalled=True, finished_in_time=True)
    assert (killed.run_to, killed.error_code) == (R.TIMED_OUT, ErrorCode.EXECUTION_TIMED_OUT)
    own = plan_completion(*state, exit_code=0, finished_at_ms=1, deadline_at_ms=None,
                          signalled=False, finished_in_time=True)
    assert (own.run_to, own.error_code) == (R.SUCCEEDED, None)
    late = plan_completion(*state, exit_code=0, finished_at_ms=1, deadline_at_ms=None,
                           signalled=False, finished_in_time=False)
    assert late.run_to is R.TIMED_OUT


def test_completion_exit_nonzero_fails():
    for exit_code in (1, 2, 128 + 9, 255):
        plan = plan_completion(*to_running(), exit_code=exit_code, finished_at_ms=1, deadline_at_ms=None)
        assert types(plan) == ["attempt.failed", "run.failed"]
        assert plan.error_code == ErrorCode.EXIT_NONZERO
        assert plan.events[1].payload == {"exit_code": exit_code}


@pytest.mark.parametrize("reason", [CancelReason.USER, CancelReason.POLICY, CancelReason.SHUTDOWN])
def test_user_cancel_intent_wins_over_exit_zero(reason):
    plan = plan_completion(*to_running(reason), exit_code=0, finished_at_ms=1, deadline_at_ms=10**9)
    assert types(plan) == ["attempt.cancelled", "run.cancelled"]
    assert plan.error_code == ErrorCode.EXECUTION_CANCELLED


@pytest.mark.parametrize("reason", [CancelReason.USER, CancelReason.POLICY, CancelReason.SHUTDOWN])
def test_a_job_the_stop_signalled_is_cancelled_even_when_its_clock_says_it_ended_first(reason):
    # The launcher's clock and the commit's differ by up to a tick: a job the cancel's own TERM
    # killed 5 ms after the commit may carry an earlier finish time. Only an unsignalled job that
    # ended before the intent keeps its own outcome.
    state = to_running(reason)
    killed = plan_completion(*state, exit_code=143, finished_at_ms=995, deadline_at_ms=None,
                             cancel_requested_at_ms=1000, signalled=True)
    assert (killed.run_to, killed.error_code) == (R.CANCELLED, ErrorCode.EXECUTION_CANCELLED)
    own = plan_completion(*state, exit_code=3, finished_at_ms=995, deadline_at_ms=None,
                          cancel_requested_at_ms=1000, signalled=False)
    assert (own.run_to, own.error_code) == (R.FAILED, ErrorCode.EXIT_NONZERO)


def test_completion_before_running_report_ends_a_starting_attempt():
    state = admitted()
    state = apply(state, plan_offer(*state))
    state = apply(state, plan_activate(*state))
    plan = plan_completion(*state, exit_code=0, finished_at_ms=1, deadline_at_ms=None)
    assert (plan.run_from, plan.attempt_from) == (R.DISPATCHING, A.STARTING)
    assert types(plan) == ["attempt.succeeded", "run.succeeded"]


def test_completion_of_lost_attempt_is_refused():
    with pytest.raises(InvalidTransition):
        plan_completion(*to_lost(), exit_code=0, finished_at_ms=1, deadline_at_ms=None)


def test_start_failure_fails_attempt_and_run():
    state = admitted()
    state = apply(state, plan_offer(*state))
    state = apply(state, plan_activate(*state))
    plan = plan_start_failed(*state)
    assert types(plan) == ["attempt.failed", "run.failed"]
    assert plan.error_code == ErrorCode.EXECUTOR_START_FAILED


def test_activation_is_refused_after_a_cancel_intent_or_outside_dispatching():
    run, attempt = admitted()
    with pytest.raises(InvalidTransition):
        plan_activate(run, attempt)
    state = apply((run, attempt), plan_offer(run, attempt))
    with pytest.raises(InvalidTransition):
        plan_activate(replace(state[0], cancel_reason=CancelReason.USER), state[1])


def test_offer_twice_is_refused():
    state = admitted()
    state = apply(state, plan_offer(*state))
    with pytest.raises(InvalidTransition, match="must change something|not claimed"):
        plan_offer(*state)


def test_requeue_creates_next_attempt_claimed():
    run, attempt = to_lost()
    wait = plan_retry_wait(run, attempt, 5000)
    assert types(wait) == ["run.retry_scheduled", "run.retry_wait"]
    assert wait.events[0].payload == {"next_attempt_at_ms": 5000} and not wait.changes_attempt
    run, attempt = fold(run, attempt, wait)
    plan = plan_requeue(run, "att-2", 2)
    assert types(plan) == ["attempt.claimed", "run.queued"]
    assert all(e.attempt_id == "att-2" for e in plan.events)
    assert plan.events[0].payload == {"number": 2}
    assert (plan.run_from, plan.run_to, plan.attempt_from, plan.attempt_to) == (
        R.RETRY_WAIT, R.QUEUED, None, A.CLAIMED)
    assert plan.version == run.version + 2 and plan.event_sequence == run.event_sequence + 2
    run, attempt = fold(run, attempt, plan, 2)
    assert (attempt.id, attempt.number, attempt.status) == ("att-2", 2, A.CLAIMED)
    assert plan_offer(run, attempt).run_to is R.DISPATCHING


def test_requeue_only_from_retry_wait():
    with pytest.raises(InvalidTransition):
        plan_requeue(to_lost()[0], "att-2", 2)


def test_lost_run_cancel_ends_cancelled_without_attempt_event():
    run, attempt = to_lost()
    assert attempt.status is A.LOST
    plan = plan_cancel(run, attempt, CancelReason.USER)
    assert types(plan) == ["run.cancel_requested", "run.cancelled"]
    assert plan.attempt_id is None and all(e.attempt_id is None for e in plan.events)
    assert (plan.run_to, plan.error_code) == (R.CANCELLED, ErrorCode.EXECUTION_CANCELLED)
    new_run, new_attempt = fold(run, attempt, plan)
    assert new_attempt.status is A.LOST and new_run.status is R.CANCELLED


def test_retry_wait_run_cancel_ends_cancelled_without_attempt_event():
    state = to_lost()
    state = apply(state, plan_retry_wait(*state, 10))
    plan = plan_cancel(*state, CancelReason.USER)
    assert types(plan) == ["run.cancel_requested", "run.cancelled"]


def test_lost_run_with_timeout_intent_ends_timed_out_by_intent():
    plan = plan_end_by_intent(*to_lost(CancelReason.TIMEOUT))
    assert types(plan) == ["run.timed_out"] and plan.error_code == ErrorCode.EXECUTION_TIMED_OUT


def test_lost_failed_ends_run_failed_and_keeps_the_lost_attempt():
    plan = plan_lost_failed(*to_lost(), ErrorCode.RUN_LOST_RETRY_UNSAFE)
    assert types(plan) == ["run.failed"]
    assert (plan.attempt_to, plan.error_code) == (A.LOST, ErrorCode.RUN_LOST_RETRY_UNSAFE)


def test_transition_refuses_an_edge_outside_the_table():
    run, attempt = admitted()
    with pytest.raises(InvalidTransition, match="run cannot go from queued to running"):
        transition(run, attempt, run_to=R.RUNNING)
    with pytest.raises(InvalidTransition, match="attempt cannot go from claimed to running"):
        transition(run, attempt, attempt_to=A.RUNNING)
    with pytest.raises(InvalidTransition, match="must change something"):
        transition(run, attempt)
    with pytest.raises(InvalidTransition, match="no attempt"):
        transition(run, None, attempt_to=A.CANCELLED)


# --- builders refuse what their caller should never ask -------------------------------------


def test_lost_failed_refuses_a_run_that_is_not_lost():
    run, attempt = to_running()
    with pytest.raises(InvalidTransition, match="not lost"):
        plan_lost_failed(run, attempt, ErrorCode.RUN_LOST_RETRY_DISABLED)


def test_retry_wait_refuses_a_run_with_a_cancel_intent():
    run, attempt = to_lost(CancelReason.USER)
    with pytest.raises(InvalidTransition, match="cancel intent"):
        plan_retry_wait(run, attempt, 10)
