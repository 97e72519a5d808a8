"""The soak's invariant checker (issue 11): pure, on plain records the soak collected from the
database (runs, attempts, terminal events, log chunks), the jobs' ledger (each execution's
start and end as the job itself wrote them, with the attempt it ran for) and the faults
(process groups the soak killed, when). Nothing here does I/O, so it is tested on synthetic
data (test_invariants.py).

The invariants:
- `terminal_events`: a terminal run has exactly one terminal event (run.succeeded, run.failed,
  run.cancelled, run.timed_out); a run not terminal has none.
- `not_terminal`: every run is terminal at the end (one that is not is reported with the
  reason `status` gives).
- `attempt_ran_twice`: an attempt's job started more than once (any safety).
- `unknown_attempt`: a job ran for an attempt the database does not have.
- `concurrent_attempts`: two executions of a run that is not idempotent overlap in time.
- `succeeded_without_execution`: a succeeded attempt whose job never wrote its end to the
  ledger (it did not run, or not to its end).
- `log_incomplete`: a succeeded run's log is not whole: the chunks of its succeeded attempt
  are not contiguous from 0 up to the attempt's `log_final_offset`, or that offset is missing.
- `stop_as_failure`: a run `failed` with `EXIT_NONZERO`: the soak's jobs exit 0 whenever they
  run to their end, so a job that exited otherwise was stopped or killed, and a stop is
  `timed_out`, `cancelled` or `lost`, never the job's own failure.
- `log_content`: a succeeded run's log is not what its job wrote (`begin G`, `done G`, G the
  process group of the execution that ended), when the logs' bytes are given.
- `lost_while_running` (issue 17): an attempt of a run of unknown safety marked `lost` while
  its job still ran: an execution of that attempt began before the attempt's recorded finish
  and wrote its end line after it. (An execution with no end line is bounded by that finish, as
  for `concurrent_attempts`: the ledger cannot tell how long a stopped job went on.) Nothing
  runs is what `lost` of such a run claims.
- `lost_after_its_end` (issue 17): such an attempt marked `lost` although its job had run to its
  end before (its end line) and was not killed with its host: the job's own outcome dropped.
- `slots_exceeded`: at some moment a worker ran more jobs than its slots (the executions the
  ledger tells of, each named by the worker whose state directory its output went to; bounded as
  for `concurrent_attempts`), when `slots` is given.
- `confirm_outcome` (issue 26): an operator's `confirm-stopped` recorded for an attempt's lease
  generation G (the soak's `confirm_stopped_thawed`, while the worker was frozen) ends in one of
  the legitimate ways only: `lost` (recovery acted on the word first: the attempt ended `lost`,
  RECOVERY_CONFIRMED_STOPPED, on that word, under G), `withdrawn` (the worker's renewal of G
  landed first: an `attempt.evidence_withdrawn` of that word, and the attempt never ended on it),
  `rebound` (the worker, registered anew, re-bound the attempt to a new lease generation first,
  which voids the word), or `ended` (the attempt's own report, or its timeout or cancel intent,
  ended it first under G: `succeeded`, `failed`, `timed_out` or `cancelled`). A withdrawn or
  voided word that still ended the attempt, or an attempt that ended `lost` otherwise under G
  while the word stood, is a violation; one not ended at all is `not_terminal`'s.
  What an operator's word ended is excused, and named, in `Findings.excused` (not a violation):
  its job may still have run (`lost_while_running`), may have ended before the word with its
  outcome dropped (`lost_after_its_end`), and a retry may have run beside it
  (`concurrent_attempts`): the operator's statement, not the runtime, allowed each.
Overlapping executions of an idempotent run are allowed (it may run twice by its own word) and
only counted.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "timed_out"})
TERMINAL_EVENTS = frozenset({"run.succeeded", "run.failed", "run.cancelled", "run.timed_out"})
CONFIRMED_STOPPED = "confirmed_stopped"
CONFIRMED_STOPPED_CODE = "RECOVERY_CONFIRMED_STOPPED"
# The violations an operator's false `confirm-stopped` explains (see `confirm_outcome`).
EXCUSABLE = frozenset({"lost_while_running", "lost_after_its_end", "concurrent_attempts"})


@dataclass(frozen=True)
class Run:
    run_id: str
    task: str
    status: str
    idempotent: bool  # its retry policy's safety says it may run twice
    error_code: str | None = None


@dataclass(frozen=True)
class Attempt:
    attempt_id: str
    run_id: str
    number: int
    status: str
    finished_at_ms: int | None
    log_final_offset: int | None
    error_code: str | None = None
    lease_generation: int | None = None  # the attempt's last lease generation
    evidence: str | None = None  # its not-running fact at the end, and who said it
    evidence_by: str | None = None
    evidence_lease_generation: int | None = None


@dataclass(frozen=True)
class Execution:
    """One start of a job as its ledger lines tell it: `end_ms` None when it never wrote its end
    (killed, stopped, timed out)."""
    attempt_id: str
    start_ms: int
    end_ms: int | None
    pgid: int = 0  # the job's process group, which it also wrote into its log
    worker: str | None = None  # the worker whose state directory its output went to


@dataclass(frozen=True)
class Chunk:
    attempt_id: str
    start_offset: int
    length: int


@dataclass(frozen=True)
class Confirmation:
    """An operator's `confirm-stopped` that was recorded (`applied`) for an attempt's lease
    generation, by `by` (the soak names each fault's operator: `soak-fault-K`)."""
    attempt_id: str
    run_id: str
    lease_generation: int
    by: str


@dataclass(frozen=True)
class Withdrawal:
    """An `attempt.evidence_withdrawn` event: a renewal of `lease_generation` cleared `fact`,
    said by `by`."""
    attempt_id: str
    fact: str
    by: str | None
    lease_generation: int


@dataclass(frozen=True)
class Violation:
    kind: str
    run_id: str | None
    detail: str


@dataclass
class Findings:
    violations: list[Violation] = field(default_factory=list)
    runs_by_state: dict[str, int] = field(default_factory=dict)
    runs_by_task: dict[str, dict[str, int]] = field(default_factory=dict)
    attempts: int = 0
    executions: int = 0
    retried_runs: int = 0  # runs with more than one attempt
    idempotent_overlaps: int = 0
    # what each operator's confirmation came to (`confirm_outcome`): outcome -> how many
    confirm_outcomes: dict[str, int] = field(default_factory=dict)
    # (by, attempt id, outcome) of each confirmation
    confirmed: list[tuple[str, str, str]] = field(default_factory=list)
    # violations an operator's word explains (EXCUSABLE), each detail naming whose word
    excused: list[Violation] = field(default_factory=list)

    def add(self, kind: str, run_id: str | None, detail: str) -> None:
        self.violations.append(Violation(kind, run_id, detail))

    def add_or_excuse(self, kind: str, run_id: str | None, detail: str, word: str | None) -> None:
        """A violation, or excused when `word` (the operator whose confirm-stopped ended one of
        the attempts it concerns) explains it."""
        if word is not None and kind in EXCUSABLE:
            self.excused.append(Violation(kind, run_id, f"{detail} (excused: ended on the word of {word})"))
        else:
            self.add(kind, run_id, detail)


def check(runs: list[Run], attempts: list[Attempt], terminal_events: list[tuple[str, str]],
          executions: list[Execution], chunks: list[Chunk], *, killed_at_ms: dict[str, int],
          horizon_ms: int, waiting_why: dict[str, str] | None = None,
          logs: dict[str, bytes] | None = None, slots: int | None = None,
          confirmations: list[Confirmation] | None = None,
          withdrawals: list[Withdrawal] | None = None) -> Findings:
    """Every invariant over the whole soak. `terminal_events`: (run_id, type) of each terminal
    event; `killed_at_ms`: attempt id -> when the soak killed its process group (a host death),
    the latest its execution can have lasted; `horizon_ms`: the end of the soak (the bound of
    an execution that never ended and has no other); `waiting_why`: run id -> what `status`
    says a run still waits for; `logs`: attempt id -> its log's bytes (checked when given);
    `slots`: each worker's slots (`slots_exceeded` checked when given); `confirmations`: the
    operator's recorded `confirm-stopped`s, `withdrawals`: every `attempt.evidence_withdrawn`
    (`confirm_outcome` checked, and what a word ended excused)."""
    found = Findings(attempts=len(attempts), executions=len(executions))
    by_run_attempts: dict[str, list[Attempt]] = defaultdict(list)
    for a in attempts:
        by_run_attempts[a.run_id].append(a)
    attempt_of = {a.attempt_id: a for a in attempts}
    _terminal_events(found, runs, terminal_events, waiting_why or {})
    runs_by_id = {r.run_id: r for r in runs}
    ended_on_word = _confirm_outcomes(found, confirmations or [], withdrawals or [], attempt_of)
    by_run_exec = _executions(found, executions, attempt_of, runs_by_id, killed_at_ms, horizon_ms)
    for run in runs:
        _no_concurrent_attempts(found, run, by_run_exec.get(run.run_id, []), ended_on_word)
    _succeeded_ran_and_logged(found, runs, by_run_attempts, executions, chunks, logs)
    _not_lost_while_it_ran(found, runs_by_id, attempt_of, executions, killed_at_ms, horizon_ms, ended_on_word)
    if slots is not None:
        _within_slots(found, executions, attempt_of, killed_at_ms, horizon_ms, slots)
    found.runs_by_state = dict(Counter(r.status for r in runs))
    per_task: dict[str, Counter] = defaultdict(Counter)
    for r in runs:
        per_task[r.task][r.status] += 1
    found.runs_by_task = {t: dict(c) for t, c in sorted(per_task.items())}
    found.retried_runs = sum(1 for v in by_run_attempts.values() if len(v) > 1)
    return found


def _terminal_events(found: Findings, runs: list[Run], events: list[tuple[str, str]],
                     waiting_why: dict[str, str]) -> None:
    counts = Counter(run_id for run_id, kind in events if kind in TERMINAL_EVENTS)
    for run in runs:
        n = counts.get(run.run_id, 0)
        if run.status == "failed" and run.error_code == "EXIT_NONZERO":
            found.add("stop_as_failure", run.run_id, "failed EXIT_NONZERO: a stop recorded as the job's failure")
        if run.status in TERMINAL_STATES:
            if n != 1:
                found.add("terminal_events", run.run_id, f"{run.status} with {n} terminal events")
        else:
            if n:
                found.add("terminal_events", run.run_id, f"{run.status} with {n} terminal events")
            why = waiting_why.get(run.run_id, "no reason in status")
            found.add("not_terminal", run.run_id, f"{run.status} at the end: {why}")


def _executions(found: Findings, executions: list[Execution], attempt_of: dict[str, Attempt],
                runs: dict[str, Run], killed_at_ms: dict[str, int],
                horizon_ms: int) -> dict[str, list[tuple[int, int, str]]]:
    """Each run's executions as (start, end bound, attempt id); an attempt started twice and
    an attempt nobody knows are violations on the way."""
    starts = Counter(e.attempt_id for e in executions)
    for attempt_id, n in starts.items():
        if n > 1:
            run_id = attempt_of[attempt_id].run_id if attempt_id in attempt_of else None
            found.add("attempt_ran_twice", run_id, f"attempt {attempt_id} started {n} times")
    by_run: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for e in executions:
        attempt = attempt_of.get(e.attempt_id)
        if attempt is None or attempt.run_id not in runs:
            found.add("unknown_attempt", None, f"a job ran for attempt {e.attempt_id}, unknown")
            continue
        by_run[attempt.run_id].append((e.start_ms, _end_bound(e, attempt, killed_at_ms, horizon_ms),
                                       e.attempt_id))
    return by_run


def _end_bound(e: Execution, attempt: Attempt, killed_at_ms: dict[str, int], horizon_ms: int) -> int:
    """When the execution ended at the latest: its own end line; else the kill of its process
    group, or else the attempt's recorded finish (a stop by the runtime precedes it); else the
    end of the soak."""
    if e.end_ms is not None:
        return e.end_ms
    bounds = [b for b in (killed_at_ms.get(e.attempt_id), attempt.finished_at_ms) if b is not None]
    return min(bounds) if bounds else horizon_ms


def _no_concurrent_attempts(found: Findings, run: Run, spans: list[tuple[int, int, str]],
                            ended_on_word: dict[str, str]) -> None:
    spans = sorted(spans)
    for (s1, e1, a1), (s2, e2, a2) in zip(spans, spans[1:]):
        if a1 == a2:
            continue  # one attempt started twice: reported as attempt_ran_twice
        if s2 < e1:
            if run.idempotent:
                found.idempotent_overlaps += 1
            else:
                found.add_or_excuse("concurrent_attempts", run.run_id,
                                    f"attempt {a2} started at {s2} while {a1} ran ({s1}..{e1})",
                                    ended_on_word.get(a1) or ended_on_word.get(a2))


def _succeeded_ran_and_logged(found: Findings, runs: list[Run], by_run: dict[str, list[Attempt]],
                              executions: list[Execution], chunks: list[Chunk],
                              logs: dict[str, bytes] | None) -> None:
    ended = {e.attempt_id: e for e in executions if e.end_ms is not None}
    by_attempt: dict[str, list[Chunk]] = defaultdict(list)
    for c in chunks:
        by_attempt[c.attempt_id].append(c)
    for run in runs:
        if run.status != "succeeded":
            continue
        winners = [a for a in by_run.get(run.run_id, []) if a.status == "succeeded"]
        if len(winners) != 1:
            found.add("terminal_events", run.run_id, f"succeeded with {len(winners)} succeeded attempts")
            continue
        attempt = winners[0]
        if attempt.attempt_id not in ended:
            found.add("succeeded_without_execution", run.run_id,
                      f"attempt {attempt.attempt_id} succeeded, its job never wrote its end")
        problem = log_problem(attempt.log_final_offset, by_attempt.get(attempt.attempt_id, []))
        if problem:
            found.add("log_incomplete", run.run_id, f"attempt {attempt.attempt_id}: {problem}")
        elif logs is not None and attempt.attempt_id in ended:
            g = ended[attempt.attempt_id].pgid
            data = logs.get(attempt.attempt_id, b"")
            if data != f"begin {g}\ndone {g}\n".encode():
                found.add("log_content", run.run_id, f"attempt {attempt.attempt_id}: log {data[:80]!r}")


def log_problem(final_offset: int | None, chunks: list[Chunk]) -> str | None:
    """None when the chunks cover [0, final_offset) exactly, contiguous; otherwise what is wrong."""
    if final_offset is None:
        return "no log_final_offset"
    at = 0
    for c in sorted(chunks, key=lambda c: c.start_offset):
        if c.start_offset != at:
            return f"a gap or an overlap at offset {at} (next chunk starts at {c.start_offset})"
        at += c.length
    if at != final_offset:
        return f"chunks end at {at}, the final offset is {final_offset}"
    return None


def _not_lost_while_it_ran(found: Findings, runs: dict[str, Run], attempt_of: dict[str, Attempt],
                           executions: list[Execution], killed_at_ms: dict[str, int], horizon_ms: int,
                           ended_on_word: dict[str, str]) -> None:
    """A `lost` attempt of a run of unknown safety: no execution of it went on past the moment it
    was marked lost, and none had ended on its own before it (the job's outcome was there)."""
    for e in executions:
        attempt = attempt_of.get(e.attempt_id)
        run = runs.get(attempt.run_id) if attempt is not None else None
        if run is None or run.idempotent or attempt.status != "lost":
            continue
        if e.end_ms is None:
            continue
        lost_at = attempt.finished_at_ms if attempt.finished_at_ms is not None else horizon_ms
        killed = killed_at_ms.get(e.attempt_id)
        if e.start_ms <= lost_at < e.end_ms:
            found.add_or_excuse("lost_while_running", run.run_id,
                                f"attempt {e.attempt_id} marked lost at {lost_at}, its job ran "
                                f"{e.start_ms}..{e.end_ms} to its end", ended_on_word.get(e.attempt_id))
        elif e.end_ms <= lost_at and (killed is None or killed < e.end_ms):
            found.add_or_excuse("lost_after_its_end", run.run_id,
                                f"attempt {e.attempt_id} marked lost at {lost_at}, its job ran to its end at "
                                f"{e.end_ms}", ended_on_word.get(e.attempt_id))


def _confirm_outcomes(found: Findings, confirmations: list[Confirmation], withdrawals: list[Withdrawal],
                      attempt_of: dict[str, Attempt]) -> dict[str, str]:
    """Each recorded confirmation's outcome (`confirm_outcome`, in the module's doc), counted in
    `found.confirm_outcomes`; returns attempt id -> the operator whose word ended it `lost`."""
    withdrawn = {(w.attempt_id, w.by, w.lease_generation) for w in withdrawals if w.fact == CONFIRMED_STOPPED}
    ended_on_word: dict[str, str] = {}
    outcomes: Counter = Counter()
    for c in confirmations:
        a = attempt_of.get(c.attempt_id)
        if a is None:
            found.add("confirm_outcome", c.run_id, f"{c.by} confirmed attempt {c.attempt_id}, unknown")
            continue
        said = f"{c.by}'s confirm-stopped of attempt {a.attempt_id} (lease generation {c.lease_generation})"
        on_word = (a.status == "lost" and a.error_code == CONFIRMED_STOPPED_CODE and a.evidence == CONFIRMED_STOPPED
                   and a.evidence_by == c.by and a.evidence_lease_generation == c.lease_generation)
        was_withdrawn = (a.attempt_id, c.by, c.lease_generation) in withdrawn
        moved = a.lease_generation is not None and a.lease_generation > c.lease_generation
        if on_word:
            outcome = "lost"
            ended_on_word[a.attempt_id] = c.by
            if was_withdrawn or moved:
                found.add("confirm_outcome", a.run_id, f"{said} ended it lost although the word was "
                          + ("withdrawn by a renewal" if was_withdrawn else f"void (lease generation {a.lease_generation})"))
                outcome = "violated"
        elif was_withdrawn:
            outcome = "withdrawn"
        elif moved:
            outcome = "rebound"
        elif a.lease_generation == c.lease_generation and a.status in TERMINAL_STATES:
            outcome = "ended"
        elif a.status in ("starting", "running", "claimed"):
            outcome = "unresolved"  # not terminal: reported as not_terminal
        else:
            outcome = "violated"
            found.add("confirm_outcome", a.run_id, f"{said}: the attempt ended {a.status} ({a.error_code}) under "
                      f"lease generation {a.lease_generation} while the word stood, not on it")
        outcomes[outcome] += 1
        found.confirmed.append((c.by, a.attempt_id, outcome))
    found.confirm_outcomes = dict(outcomes)
    return ended_on_word


def _within_slots(found: Findings, executions: list[Execution], attempt_of: dict[str, Attempt],
                  killed_at_ms: dict[str, int], horizon_ms: int, slots: int) -> None:
    """At no moment did a worker run more jobs than its slots (a sweep over each worker's
    executions, an end counted before a start at the same millisecond)."""
    marks: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for e in executions:
        attempt = attempt_of.get(e.attempt_id)
        if e.worker is None or attempt is None:
            continue
        end = _end_bound(e, attempt, killed_at_ms, horizon_ms)
        marks[e.worker] += [(e.start_ms, 1, e.attempt_id), (end, 0, e.attempt_id)]
    for worker, points in sorted(marks.items()):
        running: set[str] = set()
        worst: tuple[int, int, list[str]] | None = None
        for at, is_start, attempt_id in sorted(points):
            if is_start:
                running.add(attempt_id)
                if len(running) > slots and (worst is None or len(running) > worst[1]):
                    worst = (at, len(running), sorted(running))
            else:
                running.discard(attempt_id)
        if worst is not None:
            found.add("slots_exceeded", None,
                      f"worker {worker} ran {worst[1]} jobs at {worst[0]} ({slots} slots): {', '.join(worst[2])}")
