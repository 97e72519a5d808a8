"""The soak's invariant checker on synthetic records (no process, no database)."""

from __future__ import annotations

from invariants import Attempt, Chunk, Execution, Run, check, log_problem


def _ok_run(run_id: str, *, idempotent: bool = False, size: int = 10):
    """A run that succeeded in one attempt, its job started and ended, its log whole."""
    a = f"{run_id}-a1"
    return (Run(run_id, "t", "succeeded", idempotent),
            Attempt(a, run_id, 1, "succeeded", 2_000, size),
            (run_id, "run.succeeded"),
            Execution(a, 1_000, 1_500),
            [Chunk(a, 0, 4), Chunk(a, 4, size - 4)])


def _check(parts, *, extra_events=(), extra_exec=(), killed=None, waiting=None, logs=None):
    runs = [p[0] for p in parts]
    attempts = [a for p in parts for a in (p[1] if isinstance(p[1], list) else [p[1]])]
    events = [p[2] for p in parts if p[2] is not None] + list(extra_events)
    execs = [e for p in parts for e in (p[3] if isinstance(p[3], list) else [p[3]]) if e] + list(extra_exec)
    chunks = [c for p in parts for c in p[4]]
    return check(runs, attempts, events, execs, chunks, killed_at_ms=killed or {}, horizon_ms=99_000,
                 waiting_why=waiting, logs=logs)


def _kinds(found):
    return sorted(v.kind for v in found.violations)


def test_a_clean_soak_has_no_violation_and_counts_runs_by_state_and_task():
    found = _check([_ok_run("r1"), _ok_run("r2", idempotent=True)])
    assert found.violations == []
    assert found.runs_by_state == {"succeeded": 2}
    assert found.runs_by_task == {"t": {"succeeded": 2}}
    assert (found.attempts, found.executions, found.retried_runs) == (2, 2, 0)


def test_two_terminal_events_or_none_for_a_terminal_run_is_a_violation():
    run, attempt, event, execution, chunks = _ok_run("r1")
    assert _kinds(_check([(run, attempt, event, execution, chunks)], extra_events=[event])) == ["terminal_events"]
    assert _kinds(_check([(run, attempt, None, execution, chunks)])) == ["terminal_events"]
    # a non-terminal event type is not counted
    assert _check([(run, attempt, event, execution, chunks)],
                  extra_events=[("r1", "attempt.lost")]).violations == []


def test_a_run_not_terminal_at_the_end_is_reported_with_what_status_says():
    run = Run("r1", "t", "running", False)
    attempt = Attempt("a1", "r1", 1, "running", None, None)
    found = _check([(run, attempt, None, Execution("a1", 1_000, None), [])],
                   waiting={"r1": "unknown safety: waits for worker w1"})
    assert [(v.kind, v.detail) for v in found.violations] == [
        ("not_terminal", "running at the end: unknown safety: waits for worker w1")]


def test_overlapping_attempts_of_a_run_that_is_not_idempotent_are_a_violation_not_of_an_idempotent_one():
    def retried(idempotent: bool, second_start: int):
        run = Run("r1", "t", "succeeded", idempotent)
        attempts = [Attempt("a1", "r1", 1, "lost", 5_000, None), Attempt("a2", "r1", 2, "succeeded", 9_000, 3)]
        execs = [Execution("a1", 1_000, None), Execution("a2", second_start, 8_000)]
        return _check([(run, attempts, ("r1", "run.succeeded"), execs, [Chunk("a2", 0, 3)])])

    assert _kinds(retried(False, 4_000)) == ["concurrent_attempts"]  # a1's bound: its finish, 5 000
    assert retried(False, 6_000).violations == []
    both = retried(True, 4_000)
    assert both.violations == [] and both.idempotent_overlaps == 1 and both.retried_runs == 1


def test_a_killed_process_group_bounds_the_execution_before_the_attempt_s_recorded_finish():
    run = Run("r1", "t", "failed", False)
    attempts = [Attempt("a1", "r1", 1, "lost", 50_000, None), Attempt("a2", "r1", 2, "failed", 60_000, None)]
    execs = [Execution("a1", 1_000, None), Execution("a2", 30_000, 40_000)]
    parts = [(run, attempts, ("r1", "run.failed"), execs, [])]
    assert _kinds(_check(parts)) == ["concurrent_attempts"]
    assert _check(parts, killed={"a1": 20_000}).violations == []


def test_an_attempt_started_twice_or_an_unknown_attempt_is_a_violation():
    run, attempt, event, execution, chunks = _ok_run("r1")
    twice = _check([(run, attempt, event, [execution, Execution(attempt.attempt_id, 1_200, 1_600)], chunks)])
    assert _kinds(twice) == ["attempt_ran_twice"]
    stray = _check([_ok_run("r1")], extra_exec=[Execution("nobody", 1, 2)])
    assert _kinds(stray) == ["unknown_attempt"]


def test_a_succeeded_attempt_whose_job_never_wrote_its_end_is_a_violation():
    run, attempt, event, _execution, chunks = _ok_run("r1")
    assert _kinds(_check([(run, attempt, event, Execution(attempt.attempt_id, 1_000, None), chunks)])) == [
        "succeeded_without_execution"]
    assert _kinds(_check([(run, attempt, event, [], chunks)])) == ["succeeded_without_execution"]


def test_a_succeeded_run_s_log_must_be_whole_up_to_its_final_offset():
    run, attempt, event, execution, _chunks = _ok_run("r1", size=10)
    a = attempt.attempt_id
    short = _check([(run, attempt, event, execution, [Chunk(a, 0, 4)])])
    assert [v.kind for v in short.violations] == ["log_incomplete"]
    assert "chunks end at 4, the final offset is 10" in short.violations[0].detail
    assert _kinds(_check([(run, attempt, event, execution, [Chunk(a, 0, 4), Chunk(a, 5, 5)])])) == ["log_incomplete"]


def test_log_problem_names_each_failure():
    assert log_problem(0, []) is None
    assert log_problem(None, []) == "no log_final_offset"
    assert log_problem(6, [Chunk("a", 3, 3), Chunk("a", 0, 3)]) is None
    assert log_problem(6, [Chunk("a", 0, 4), Chunk("a", 3, 3)]).startswith("a gap or an overlap at offset 4")
    assert log_problem(6, [Chunk("a", 0, 3), Chunk("a", 3, 4)]) == "chunks end at 7, the final offset is 6"


def test_a_succeeded_run_s_log_must_be_its_own_job_s_output_when_the_logs_are_given():
    run = Run("r1", "t", "succeeded", False)
    own = b"begin 42\ndone 42\n"
    attempt = Attempt("a1", "r1", 1, "succeeded", 2_000, len(own))
    parts = [(run, attempt, ("r1", "run.succeeded"), Execution("a1", 1_000, 1_500, pgid=42),
              [Chunk("a1", 0, len(own))])]
    assert _check(parts, logs={"a1": own}).violations == []
    other = _check(parts, logs={"a1": b"begin 43\ndone 43\n"})
    assert _kinds(other) == ["log_content"]


def test_a_run_failed_with_a_nonzero_exit_is_a_stop_recorded_as_the_job_s_failure():
    run = Run("r1", "t", "failed", False, "EXIT_NONZERO")
    attempt = Attempt("a1", "r1", 1, "failed", 2_000, 0)
    parts = [(run, attempt, ("r1", "run.failed"), Execution("a1", 1_000, None), [])]
    assert _kinds(_check(parts)) == ["stop_as_failure"]
    lost = Run("r1", "t", "failed", False, "RUN_LOST_RETRY_DISABLED")
    assert _check([(lost, attempt, ("r1", "run.failed"), Execution("a1", 1_000, None), [])]).violations == []


def _lost_unsafe(execution, *, idempotent=False, lost_at=10_000):
    run = Run("r1", "t", "failed", idempotent, "RUN_LOST_RETRY_DISABLED")
    attempt = Attempt("a1", "r1", 1, "lost", lost_at, None)
    return [(run, attempt, ("r1", "run.failed"), execution, [])]


def test_an_unknown_safety_attempt_marked_lost_while_its_job_ran_is_a_violation():
    # ran to its end after it was marked lost (the runs)
    assert _kinds(_check(_lost_unsafe(Execution("a1", 1_000, 20_000)))) == ["lost_while_running"]
    # no end line (killed with its host, or stopped): bounded by the recorded finish, not judged
    assert _check(_lost_unsafe(Execution("a1", 1_000, None)), killed={"a1": 5_000}).violations == []
    assert _check(_lost_unsafe(Execution("a1", 1_000, None))).violations == []
    # an idempotent run's attempt may be lost while it runs (it may run twice by its own word)
    assert _check(_lost_unsafe(Execution("a1", 1_000, 20_000), idempotent=True)).violations == []
    # an execution that began after the attempt was marked lost is not this invariant's
    assert _check(_lost_unsafe(Execution("a1", 11_000, 12_000))).violations == []


def test_an_unknown_safety_attempt_marked_lost_after_its_job_ended_on_its_own_is_a_violation():
    assert _kinds(_check(_lost_unsafe(Execution("a1", 1_000, 5_000)))) == ["lost_after_its_end"]
    # killed with its host just after it wrote its end: its outcome may have died with it
    assert _check(_lost_unsafe(Execution("a1", 1_000, 5_000)), killed={"a1": 5_000}).violations == []


def test_a_worker_running_more_jobs_than_its_slots_is_a_violation():
    def runs(n, *, worker="w1", overlap=True):
        parts = []
        for i in range(n):
            run, attempt, event, _e, chunks = _ok_run(f"r{i}")
            start = 1_000 + (0 if overlap else 1_000 * i)
            parts.append((run, attempt, event, Execution(attempt.attempt_id, start, start + 500, worker=worker),
                          chunks))
        return parts

    def check_slots(parts, slots=2):
        from invariants import check as check_
        runs_ = [p[0] for p in parts]
        return check_(runs_, [p[1] for p in parts], [p[2] for p in parts], [p[3] for p in parts],
                      [c for p in parts for c in p[4]], killed_at_ms={}, horizon_ms=99_000, slots=slots)

    found = check_slots(runs(3))
    assert _kinds(found) == ["slots_exceeded"]
    assert "worker w1 ran 3 jobs at 1000 (2 slots)" in found.violations[0].detail
    assert check_slots(runs(2)).violations == []
    assert check_slots(runs(3, overlap=False)).violations == []  # one after another
    assert check_slots(runs(2) + runs(2, worker="w2")[:0]).violations == []
    # back to back (one ends at the millisecond the next starts) is within the slots
    parts = runs(2)
    run, attempt, event, _e, chunks = _ok_run("r9")
    parts.append((run, attempt, event, Execution(attempt.attempt_id, 1_500, 1_900, worker="w1"), chunks))
    assert check_slots(parts).violations == []


# -- an operator's confirm-stopped on a frozen worker's lapsed lease (issue 26) ------------------

def _confirmed(status, *, error_code=None, generation=1, evidence=None, by=None, execution=None,
               idempotent=False, withdrawn=False, run_status=None, code=None):
    """A run whose attempt a1 (lease generation 1) was confirmed stopped by soak-fault-3, as the
    attempt ended: `status` under lease `generation`, with its evidence at the end."""
    from invariants import Confirmation, Withdrawal

    run = Run("r1", "t", run_status or ("succeeded" if status == "succeeded" else "failed"), idempotent, code)
    attempt = Attempt("a1", "r1", 1, status, 10_000, 3 if status == "succeeded" else None, error_code,
                      generation, evidence, by, 1 if evidence else None)
    execution = execution or Execution("a1", 1_000, 20_000 if status == "succeeded" else None)
    chunks = [Chunk("a1", 0, 3)] if status == "succeeded" else []
    terminal = "run.succeeded" if status == "succeeded" else "run.failed"
    runs, attempts = [run], [attempt]
    return dict(runs=runs, attempts=attempts, events=[("r1", terminal)], execs=[execution], chunks=chunks,
                confirmations=[Confirmation("a1", "r1", 1, "soak-fault-3")],
                withdrawals=[Withdrawal("a1", "confirmed_stopped", "soak-fault-3", 1)] if withdrawn else [])


def _check_confirmed(parts, extra_attempts=(), extra_execs=()):
    return check(parts["runs"], parts["attempts"] + list(extra_attempts), parts["events"],
                 parts["execs"] + list(extra_execs), parts["chunks"], killed_at_ms={}, horizon_ms=99_000,
                 confirmations=parts["confirmations"], withdrawals=parts["withdrawals"])


LOST_ON_WORD = dict(error_code="RECOVERY_CONFIRMED_STOPPED", evidence="confirmed_stopped", by="soak-fault-3",
                    code="RUN_LOST_RETRY_DISABLED")


def test_a_confirmation_the_worker_s_renewal_withdrew_lets_the_job_end_on_its_own():
    found = _check_confirmed(_confirmed("succeeded", withdrawn=True))
    assert found.violations == [] and found.confirm_outcomes == {"withdrawn": 1}
    assert found.confirmed == [("soak-fault-3", "a1", "withdrawn")]


def test_a_confirmation_voided_by_a_re_bind_or_beaten_by_the_job_s_own_report_is_legitimate():
    assert _check_confirmed(_confirmed("succeeded", generation=2)).confirm_outcomes == {"rebound": 1}
    ended = _check_confirmed(_confirmed("succeeded"))
    assert ended.violations == [] and ended.confirm_outcomes == {"ended": 1}


def test_a_confirmation_recovery_acted_on_ends_the_attempt_lost_and_excuses_what_the_word_allowed():
    # the job ran on to its end after the word ended its attempt (the worker was frozen): the
    # operator's statement was false, so `lost_while_running` is excused and names the fault
    found = _check_confirmed(_confirmed("lost", execution=Execution("a1", 1_000, 20_000), **LOST_ON_WORD))
    assert found.violations == [] and found.confirm_outcomes == {"lost": 1}
    assert [(v.kind, "soak-fault-3" in v.detail) for v in found.excused] == [("lost_while_running", True)]
    # it had ended before the word (its receipt not yet reported): its outcome dropped, excused
    found = _check_confirmed(_confirmed("lost", execution=Execution("a1", 1_000, 5_000), **LOST_ON_WORD))
    assert found.violations == [] and [v.kind for v in found.excused] == ["lost_after_its_end"]


def test_a_retry_that_ran_beside_an_attempt_ended_on_the_operator_s_word_is_excused():
    parts = _confirmed("lost", execution=Execution("a1", 1_000, None), **LOST_ON_WORD)
    parts["runs"] = [Run("r1", "t", "failed", False, "RUN_LOST_RETRY_DISABLED")]
    retry = Attempt("a2", "r1", 2, "failed", 30_000, None)
    # a1's execution has no end line: bounded by its recorded finish, 10 000; a2 began at 5 000
    found = _check_confirmed(parts, extra_attempts=[retry], extra_execs=[Execution("a2", 5_000, 25_000)])
    assert found.violations == [] and [v.kind for v in found.excused] == ["concurrent_attempts"]


def test_the_same_faults_without_an_operator_s_word_are_still_violations():
    parts = _confirmed("lost", execution=Execution("a1", 1_000, 20_000), **LOST_ON_WORD)
    parts["confirmations"] = []
    found = _check_confirmed(parts)
    assert _kinds(found) == ["lost_while_running"] and found.excused == []
    # ended lost on another operator's word: this confirmation does not excuse it either
    other = dict(LOST_ON_WORD, by="soak-fault-9")
    found = _check_confirmed(_confirmed("lost", execution=Execution("a1", 1_000, 20_000), **other))
    assert _kinds(found) == ["confirm_outcome", "lost_while_running"]


def test_a_withdrawn_or_void_word_that_still_ended_the_attempt_is_a_violation():
    found = _check_confirmed(_confirmed("lost", withdrawn=True, **LOST_ON_WORD))
    assert _kinds(found) == ["confirm_outcome"] and "withdrawn by a renewal" in found.violations[0].detail
    assert found.confirm_outcomes == {"violated": 1}
    found = _check_confirmed(_confirmed("lost", generation=2, **LOST_ON_WORD))
    assert _kinds(found) == ["confirm_outcome"] and "void (lease generation 2)" in found.violations[0].detail


def test_an_attempt_ended_lost_otherwise_while_the_word_stood_is_a_violation():
    found = _check_confirmed(_confirmed("lost", error_code="RECOVERY_PROCESS_STOPPED", evidence="stopped",
                                        code="RUN_LOST_RETRY_DISABLED"))
    assert _kinds(found) == ["confirm_outcome"]
    assert "ended lost (RECOVERY_PROCESS_STOPPED) under lease generation 1 while the word stood" in \
        found.violations[0].detail
