"""The invariants a settled seed must hold, checked on plain facts (no I/O): the store's runs and
attempts, the worker's journal rows left in flight, and what the rig saw (launches per attempt,
the jobs' ledger, the most launchers alive at once, the stops the Executor began and the stops
the seed asked for: timeouts, cancels, revokes, retires, confirm-stopped)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

RUN_TERMINAL = {"succeeded", "failed", "cancelled", "timed_out"}
ATTEMPT_ACTIVE = {"claimed", "starting", "running"}


@dataclass(frozen=True)
class Run:
    run_id: str
    status: str
    safety: str  # "unknown" (the default) or "idempotent" (retry_on_lost)
    exit_code: int  # what its job exits with when it runs to its end


@dataclass(frozen=True)
class Attempt:
    attempt_id: str
    run_id: str
    status: str
    exit_code: int | None = None
    error_code: str | None = None
    worker_id: str | None = None


@dataclass(frozen=True)
class Stop:
    """A stop the Executor began (`Launching.begin_stop`): TERM, then KILL, to the job's group."""

    attempt_id: str
    reason: str  # the Executor's: fenced, superseded, rebind_*, refused, timeout, cancel, ...
    at_s: float  # seconds from the seed's start
    alive: bool = True  # the job's launcher was alive when it began (False: nothing to stop)


@dataclass(frozen=True)
class Asked:
    """Something the seed did that asks for a stop (applied by the store): `cancel` and
    `confirm-stopped` of a run, `revoke` and `retire` of a worker."""

    kind: str
    target: str  # a run id, or a worker id
    at_s: float


@dataclass
class Facts:
    runs: list[Run]
    attempts: list[Attempt]
    slots: int
    launches: Counter = field(default_factory=Counter)  # attempt id -> launcher spawns
    starts: Counter = field(default_factory=Counter)  # attempt id -> `start` lines in the ledger
    ends: Counter = field(default_factory=Counter)  # attempt id -> `end` lines (ran to its end)
    most_alive: int = 0  # the most launchers alive at once (seen at each spawn)
    journal_in_flight: list[str] = field(default_factory=list)  # attempt ids
    stops: list[Stop] = field(default_factory=list)
    asked: list[Asked] = field(default_factory=list)


# The causes that may stop a job or end its run otherwise than with its own exit (issue 26).
CAUSES = ("timeout", "cancel", "revoke", "retire", "confirm-stopped", "idempotent-safety recovery")


def cause_of(a: Attempt, run: Run | None, f: Facts, before_s: float = float("inf")) -> str | None:
    """What asked for this attempt's stop (or an end other than its job's exit) before `before_s`,
    named as in CAUSES with its target; None when nothing did."""
    if a.status == "timed_out" or (run is not None and run.status == "timed_out") \
            or (a.error_code or "").upper().startswith("TIMED_OUT"):
        return "timeout"
    for ask in f.asked:
        if ask.at_s > before_s:
            continue
        if ask.kind in ("cancel", "confirm-stopped") and ask.target == a.run_id:
            return f"{ask.kind} of run {a.run_id} at {ask.at_s:.1f} s"
        if ask.kind in ("revoke", "retire") and a.worker_id is not None and ask.target == a.worker_id:
            return f"{ask.kind} of worker {a.worker_id} at {ask.at_s:.1f} s"
    if run is not None and run.safety == "idempotent" and a.status == "lost":
        return "idempotent-safety recovery"
    return None


def explained(f: Facts) -> list[str]:
    """Each stop the Executor began on a live job, and what asked for it (or that nothing did)."""
    runs = {r.run_id: r for r in f.runs}
    attempts = {a.attempt_id: a for a in f.attempts}
    out = []
    for s in f.stops:
        a = attempts.get(s.attempt_id)
        if a is None or not s.alive:
            continue
        cause = cause_of(a, runs.get(a.run_id), f, s.at_s)
        out.append(f"stop of attempt {s.attempt_id} ({s.reason}) at {s.at_s:.1f} s: "
                   f"{'asked for by ' + cause if cause else 'nothing asked for it'}")
    return out


def violations(f: Facts) -> list[str]:
    """Every invariant broken, one line each (empty when the seed is sound)."""
    out: list[str] = []
    runs = {r.run_id: r for r in f.runs}
    for r in f.runs:
        if r.status not in RUN_TERMINAL:
            out.append(f"not terminal: run {r.run_id} is {r.status}")
    for a in f.attempts:
        out.extend(_of_attempt(a, runs.get(a.run_id), f))
    out.extend(_unasked_stops(f, runs))
    for attempt_id, n in sorted((f.launches + Counter()).items()):
        if n > 1:
            out.append(f"launched twice: attempt {attempt_id} was spawned {n} times")
    for attempt_id, n in sorted(f.starts.items()):
        if n > 1 and f.launches[attempt_id] <= 1:
            out.append(f"launched twice: attempt {attempt_id}'s job started {n} times")
    for attempt_id in f.journal_in_flight:
        out.append(f"report owed: journal row of attempt {attempt_id} still in flight")
    if f.most_alive > f.slots:
        out.append(f"over its slots: {f.most_alive} launchers alive at once on a worker of {f.slots} slots")
    return out


def _unasked_stops(f: Facts, runs: dict[str, Run]) -> list[str]:
    """A job whose ledger shows it started is never stopped by the runtime unless a cause in
    CAUSES asked for it first (issue 26). A stop of a job already gone (its launcher not alive, or
    its job's last act, the ledger's `end`, done) stopped nothing."""
    attempts = {a.attempt_id: a for a in f.attempts}
    out, seen = [], set()
    for s in f.stops:
        a = attempts.get(s.attempt_id)
        if not s.alive or f.starts[s.attempt_id] == 0 or f.ends[s.attempt_id] > 0 or s.attempt_id in seen:
            continue
        if a is None or cause_of(a, runs.get(a.run_id), f, s.at_s) is None:
            seen.add(s.attempt_id)
            run = runs.get(a.run_id) if a is not None else None
            name = (f"attempt {s.attempt_id} of {run.safety}-safety run {run.run_id}" if run is not None
                    else f"attempt {s.attempt_id}")
            out.append(f"stopped by the runtime: {name} (worker {a.worker_id if a else '?'}), its job running, "
                       f"was stopped ({s.reason}) at {s.at_s:.1f} s and nothing asked for it "
                       f"(no {', '.join(CAUSES)})")
    return out


def _of_attempt(a: Attempt, run: Run | None, f: Facts) -> list[str]:
    """What one attempt broke. Unless a cause in CAUSES asked for it (`cause_of`), a job that
    started runs to its end and its attempt ends with its own exit code: a job that started and
    did not run to its end was stopped by the system."""
    out = []
    if a.status in ATTEMPT_ACTIVE:
        out.append(f"left {a.status}: attempt {a.attempt_id} of run {a.run_id}")
    if run is None or a.status in ATTEMPT_ACTIVE:
        return out
    if cause_of(a, run, f) is not None:
        return out  # asked for: whatever its end, it is the cause's
    name = f"attempt {a.attempt_id} of {run.safety}-safety run {a.run_id}"
    started, ran_to_end = f.starts[a.attempt_id] > 0, f.ends[a.attempt_id] > 0
    if a.exit_code is not None and a.exit_code != run.exit_code:
        out.append(f"a stop recorded as the job's exit: {name} is {a.status} exit {a.exit_code}, "
                   f"its job exits {run.exit_code}")
    elif a.status == "lost":
        if run.safety == "unknown" and ran_to_end:
            out.append(f"lost while its job ran: {name} is lost ({a.error_code}) but its job ran to its end")
        elif run.safety == "unknown" and started:
            out.append(f"lost while its job ran: {name} is lost ({a.error_code}) after its job started, "
                       "and the job never ran to its end (stopped, or running until the rig ended)")
    elif ran_to_end:
        want = "succeeded" if run.exit_code == 0 else "failed"
        if (a.status, a.exit_code) != (want, run.exit_code):
            out.append(f"report not applied: {name} is {a.status} exit {a.exit_code}, "
                       f"its job exited {run.exit_code}")
    elif started and run.safety == "unknown":
        out.append(f"stopped before its end: {name} is {a.status} and its job started but never ran "
                   "to its end")
    return out
