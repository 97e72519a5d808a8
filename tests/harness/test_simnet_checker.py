"""The simulated network's invariants, on hand-made facts; its fault plan and replay line."""

from __future__ import annotations

import random
from collections import Counter

from simnet.checker import Asked, Attempt, Facts, Run, Stop, cause_of, explained, violations
from simnet.facts import read_ledger
from simnet.net import FaultPlan
from simnet.process import KILL_KINDS
from simnet.schedule import ProcessTiming, schedule_of
from simnet.seeds import replay_line


def _facts(**kw) -> Facts:
    base = dict(runs=[Run("r1", "succeeded", "unknown", 0)], attempts=[Attempt("a1", "r1", "succeeded", 0)],
                slots=2, launches=Counter(a1=1), starts=Counter(a1=1), ends=Counter(a1=1), most_alive=1)
    return Facts(**{**base, **kw})


def test_a_sound_seed_breaks_nothing():
    assert violations(_facts()) == []


def test_a_run_left_queued_or_an_attempt_left_running_is_not_terminal():
    broken = violations(_facts(runs=[Run("r1", "queued", "unknown", 0)],
                               attempts=[Attempt("a1", "r1", "running")], ends=Counter()))
    assert broken == ["not terminal: run r1 is queued", "left running: attempt a1 of run r1"]


def test_an_unknown_safety_attempt_lost_after_its_job_ran_to_its_end_is_a_violation():
    broken = violations(_facts(runs=[Run("r1", "failed", "unknown", 0)],
                               attempts=[Attempt("a1", "r1", "lost", None, "lost")]))
    assert len(broken) == 1 and broken[0].startswith("lost while its job ran: attempt a1")
    stopped = violations(_facts(runs=[Run("r1", "failed", "unknown", 0)], ends=Counter(),
                                attempts=[Attempt("a1", "r1", "lost", None, "lost")]))
    assert len(stopped) == 1 and "after its job started" in stopped[0]


def test_an_idempotent_attempt_may_be_lost_and_retried_and_a_lost_attempt_never_started_is_fine():
    runs = [Run("r1", "succeeded", "idempotent", 0), Run("r2", "failed", "unknown", 0)]
    attempts = [Attempt("a1", "r1", "lost"), Attempt("a2", "r1", "succeeded", 0), Attempt("b1", "r2", "lost")]
    assert violations(_facts(runs=runs, attempts=attempts, launches=Counter(a1=1, a2=1),
                             starts=Counter(a1=1, a2=1), ends=Counter(a1=1, a2=1))) == []


def test_a_job_that_ran_to_its_end_must_have_its_exit_applied():
    runs = [Run("r1", "succeeded", "unknown", 3)]
    broken = violations(_facts(runs=runs, attempts=[Attempt("a1", "r1", "succeeded", 0)]))
    assert broken == ["a stop recorded as the job's exit: attempt a1 of unknown-safety run r1 is succeeded "
                      "exit 0, its job exits 3"]
    late = violations(_facts(attempts=[Attempt("a1", "r1", "failed", None, "START_FAILED")]))
    assert late == ["report not applied: attempt a1 of unknown-safety run r1 is failed exit None, its job exited 0"]
    assert violations(_facts(runs=[Run("r1", "failed", "unknown", 3)],
                             attempts=[Attempt("a1", "r1", "failed", 3)])) == []


def test_a_job_stopped_before_its_end_and_recorded_as_its_exit_is_a_violation():
    """Nothing in a seed asks for a stop: a TERM'd job (exit 143) or one stopped without an exit."""
    runs = [Run("r1", "failed", "unknown", 3)]
    assert violations(_facts(runs=runs, attempts=[Attempt("a1", "r1", "failed", 143, "EXIT_NONZERO")],
                             ends=Counter())) == [
        "a stop recorded as the job's exit: attempt a1 of unknown-safety run r1 is failed exit 143, its job exits 3"]
    assert violations(_facts(runs=runs, attempts=[Attempt("a1", "r1", "cancelled")], ends=Counter())) == [
        "stopped before its end: attempt a1 of unknown-safety run r1 is cancelled and its job started but "
        "never ran to its end"]
    idempotent = [Run("r1", "succeeded", "idempotent", 0)]
    assert violations(_facts(runs=idempotent, attempts=[Attempt("a1", "r1", "lost"), Attempt("a2", "r1", "succeeded", 0)],
                             launches=Counter(a1=1, a2=1), starts=Counter(a1=1, a2=1), ends=Counter(a2=1))) == []


def test_two_launches_or_two_starts_of_one_attempt_are_a_violation():
    assert violations(_facts(launches=Counter(a1=2), starts=Counter(a1=2))) == [
        "launched twice: attempt a1 was spawned 2 times"]
    assert violations(_facts(starts=Counter(a1=2))) == ["launched twice: attempt a1's job started 2 times"]


def test_a_journal_row_left_in_flight_is_a_report_owed():
    assert violations(_facts(journal_in_flight=["a1"])) == ["report owed: journal row of attempt a1 still in flight"]


def test_more_launchers_alive_than_slots_is_a_violation():
    assert violations(_facts(most_alive=3)) == ["over its slots: 3 launchers alive at once on a worker of 2 slots"]


def test_the_ledger_counts_starts_and_ends_per_attempt(tmp_path):
    ledger = tmp_path / "ledger.txt"
    ledger.write_text("start a1\nstart a2\nend a1\nstart a1\n")
    assert read_ledger(ledger) == (Counter(a1=2, a2=1), Counter(a1=1))
    assert read_ledger(tmp_path / "none.txt") == (Counter(), Counter())


def test_the_fault_plan_is_a_function_of_its_seed_and_bounded():
    plan = FaultPlan(drop=0.2, duplicate=0.2, max_delay_s=0.05, reorder=0.2, reorder_delay_s=0.25)
    first = [plan.delays(random.Random("s:1")) for _ in range(3)]
    again = [plan.delays(random.Random("s:1")) for _ in range(3)]
    assert first == again
    rng = random.Random(7)
    seen = [plan.delays(rng) for _ in range(2000)]
    assert {len(d) for d in seen} == {0, 1, 2}  # dropped, delivered, duplicated
    assert all(0.0 <= x <= 0.3 for d in seen for x in d)
    assert FaultPlan(0, 0, 0, 0, 0).delays(rng) == [0.0]


def test_a_failing_seed_prints_a_one_line_replay():
    assert replay_line(1234) == "replay: QLACTORS_SIMNET_SEED=1234 pytest tests/profiles/test_simnet.py -k replay"
    assert replay_line(7, "postgres") == ("replay: QLACTORS_SIMNET_SEED=7 QLACTORS_SIMNET_DB=postgres "
                                          "pytest tests/profiles/test_simnet.py -k replay")


# -- issue 26: stops the runtime makes, and what asked for them ---------------------------------

def _stopped(status="failed", exit_code=143, **kw) -> Facts:
    """Attempt a1 of unknown-safety run r1 (its job exits 0) on worker w1, its job started and
    stopped (no `end`) by the Executor at 2.0 s."""
    base = dict(runs=[Run("r1", "failed", "unknown", 0)],
                attempts=[Attempt("a1", "r1", status, exit_code, "EXIT_NONZERO", "w1")], ends=Counter(),
                stops=[Stop("a1", "rebind_fenced", 2.0)])
    return _facts(**{**base, **kw})


def test_a_job_stopped_by_the_runtime_with_nothing_asking_is_a_violation_naming_the_stop():
    broken = violations(_stopped())
    assert ("stopped by the runtime: attempt a1 of unknown-safety run r1 (worker w1), its job running, was "
            "stopped (rebind_fenced) at 2.0 s and nothing asked for it (no timeout, cancel, revoke, retire, "
            "confirm-stopped, idempotent-safety recovery)") in broken
    assert "a stop recorded as the job's exit: attempt a1 of unknown-safety run r1 is failed exit 143, its job exits 0" \
        in broken
    assert explained(_stopped()) == ["stop of attempt a1 (rebind_fenced) at 2.0 s: nothing asked for it"]


def test_each_cause_that_asked_first_excuses_the_stop_and_is_named():
    cases = {
        "cancel of run r1 at 1.5 s": [Asked("cancel", "r1", 1.5)],
        "confirm-stopped of run r1 at 1.0 s": [Asked("confirm-stopped", "r1", 1.0)],
        "revoke of worker w1 at 0.5 s": [Asked("revoke", "w1", 0.5)],
        "retire of worker w1 at 1.9 s": [Asked("retire", "w1", 1.9)],
    }
    for cause, asked in cases.items():
        f = _stopped(asked=asked)
        assert violations(f) == [], cause
        assert explained(f) == [f"stop of attempt a1 (rebind_fenced) at 2.0 s: asked for by {cause}"]
    timed_out = _stopped(runs=[Run("r1", "timed_out", "unknown", 0)],
                         attempts=[Attempt("a1", "r1", "timed_out", 143, "TIMED_OUT", "w1")])
    assert violations(timed_out) == [] and explained(timed_out)[0].endswith("asked for by timeout")
    idem = _stopped(runs=[Run("r1", "succeeded", "idempotent", 0)],
                    attempts=[Attempt("a1", "r1", "lost", None, "lost", "w1"), Attempt("a2", "r1", "succeeded", 0)],
                    launches=Counter(a1=1, a2=1), starts=Counter(a1=1, a2=1), ends=Counter(a2=1))
    assert violations(idem) == [] and explained(idem)[0].endswith("asked for by idempotent-safety recovery")


def test_a_cause_asked_after_the_stop_or_of_another_run_or_worker_excuses_nothing():
    for asked in ([Asked("cancel", "r1", 2.5)], [Asked("cancel", "r2", 1.0)], [Asked("revoke", "w2", 1.0)],
                  [Asked("retire", "w2", 0.1)]):
        assert any(line.startswith("stopped by the runtime") for line in violations(_stopped(asked=asked))), asked


def test_a_stop_of_a_job_already_gone_or_that_ran_to_its_end_stops_nothing():
    assert violations(_stopped(status="succeeded", exit_code=0, stops=[Stop("a1", "fenced", 2.0, alive=False)],
                               ends=Counter(a1=1))) == []
    assert violations(_stopped(status="succeeded", exit_code=0, ends=Counter(a1=1))) == []


def test_a_cancelled_run_may_end_cancelled_with_its_job_stopped():
    f = _stopped(runs=[Run("r1", "cancelled", "unknown", 0)], attempts=[Attempt("a1", "r1", "cancelled", 143,
                                                                               None, "w1")],
                 stops=[Stop("a1", "user", 1.6)], asked=[Asked("cancel", "r1", 1.5)])
    assert violations(f) == []
    assert cause_of(f.attempts[0], f.runs[0], f, 1.6) == "cancel of run r1 at 1.5 s"


def test_a_process_schedule_is_a_function_of_its_seed_and_in_time_order():
    import random

    first = schedule_of(random.Random("simnet:5:process"))
    assert first == schedule_of(random.Random("simnet:5:process"))
    assert [e.at_s for e in first] == sorted(e.at_s for e in first)
    kinds = set()
    for n in range(200):
        events = schedule_of(random.Random(f"simnet:{n}:process"))
        assert 1 <= sum(e.kind == "kill" for e in events) <= 2
        assert all(0.2 <= e.at_s <= ProcessTiming().fault_s for e in events)
        assert all(e.point in KILL_KINDS for e in events if e.kind == "kill")
        kinds |= {e.kind for e in events} | {e.during for e in events if e.during}
    assert kinds == {"kill", "replica", "drain", "revoke", "cancel", "clock", "confirm-stopped", "retire"}


def test_a_process_seed_replays_with_its_flag():
    assert replay_line(300_002, process=True) == ("replay: QLACTORS_SIMNET_SEED=300002 QLACTORS_SIMNET_PROCESS=1 "
                                                  "pytest tests/profiles/test_simnet.py -k replay")
