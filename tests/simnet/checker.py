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
        run = runs.get(a.run_id)
        ran_to_end = f.ends[a.attempt_id] > 0
        if a.status in ATTEMPT_ACTIVE:
            out.append(f"left {a.status}: attempt {a.attempt_id} of run {a.run_id}")
        if a.status == "lost" and ran_to_end and run is not None and run.safety == "unknown":
            out.append(f"lost while its job ran: attempt {a.attempt_id} of unknown-safety run {a.run_id} "
                       f"is lost ({a.error_code}) but its job ran to its end")
        elif ran_to_end and a.status != "lost" and run is not None:
            want = "succeeded" if run.exit_code == 0 else "failed"
            if (a.status, a.exit_code) != (want, run.exit_code):
                out.append(f"report not applied: attempt {a.attempt_id} of run {a.run_id} is {a.status} "
                           f"exit {a.exit_code}, its job exited {run.exit_code}")
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
