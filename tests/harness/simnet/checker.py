"""The invariants a settled seed must hold, checked on plain facts (no I/O): the store's runs and
attempts, the worker's journal rows left in flight, and what the rig saw (launches per attempt,
the jobs' ledger, the most launchers alive at once)."""

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


def violations(f: Facts) -> list[str]:
    """Every invariant broken, one line each (empty when the seed is sound)."""
    out: list[str] = []
    runs = {r.run_id: r for r in f.runs}
    for r in f.runs:
        if r.status not in RUN_TERMINAL:
            out.append(f"not terminal: run {r.run_id} is {r.status}")
    for a in f.attempts:
        out.extend(_of_attempt(a, runs.get(a.run_id), f))
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


def _of_attempt(a: Attempt, run: Run | None, f: Facts) -> list[str]:
    """What one attempt broke. Nothing in a seed asks for a stop (no cancel, no timeout, no
    worker restart), so a job that started and did not run to its end was stopped by the system."""
    out = []
    if a.status in ATTEMPT_ACTIVE:
        out.append(f"left {a.status}: attempt {a.attempt_id} of run {a.run_id}")
    if run is None or a.status in ATTEMPT_ACTIVE:
        return out
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
