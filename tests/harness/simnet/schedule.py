"""A seed with process faults (issue 26): two workers (w1, w2, each its own links to both
replicas and its own state directory) under the faulty links of issue 17, and a schedule drawn
from the seed alone (`schedule_of`), run in time order:

- `kill`: the worker is killed at a kill point of the armed kind (before or after a journal
  write, before or after an answer is handled; the first `skip` such points pass), or anywhere
  when none comes within a second: its links are severed and its runtime stopped without its
  drain; its jobs keep running. While it is down (`down_s`), a long down may also see the
  operator's `confirm-stopped` of each run its live attempts hold, or `worker retire
  --confirm-stopped`, once its session lease has run out. Then a new WorkerRuntime starts on
  its state directory.
- `replica`: the replica's Gateway drops the next answer it was about to send (the store call
  behind it returned) and everything after it; the rig restarts that Gateway.
- `drain`: SIGTERM's path (the runtime's own stop: Leave, decline), a restart `down_s` later.
- `revoke`: `worker revoke`, then `worker allow` with its key `down_s` later.
- `cancel`: `cancel RUN` of one of the runs.
- `clock`: the worker's wall clock steps back or forward by `delta_ms`.

Every applied cancel, confirm-stopped, revoke and retire is handed to the checker as asked for
(checker.Asked); every stop the Executor began is recorded (process.Stop).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from qlactors.domain.results import Result
from qlactors.store.admin.worker_keys import WorkerKeys
from qlactors.store.admin.worker_retirement import WorkerRetirement
from qlactors.store.dispatch.evidence import ConfirmStopped

from .checker import Asked, Facts
from .checker import Stop as CheckedStop
from .process import KILL_KINDS, KILL_NAMES, Hooks, KillPlan
from .rig import Job, Timing, WorkerSlot, _Seed, _Thread, restart_gateway

log = logging.getLogger("simnet")

WORKERS = ("w1", "w2")
RUNS = 8


@dataclass(frozen=True)
class ProcessTiming:
    fault_s: float = 4.0  # the schedule's events fall within it (their down times stretch it)
    settle_s: float = 25.0
    kill_point_wait_s: float = 1.5  # an armed kill with no point to fire at kills anywhere
    lease_wait_s: float = 1.8  # after a kill, before the operator's confirm-stopped or retire
    rescue_after_s: float = 6.0  # after calm, before the operator settles a launch never known


@dataclass(frozen=True)
class Event:
    at_s: float
    kind: str  # kill, replica, drain, revoke, cancel, clock
    target: str  # a worker, a replica (r0, r1) or a run's index
    point: str = ""  # kill: one of KILL_KINDS
    skip: int = 0
    name: str = ""  # kill: the point's name (KILL_NAMES), "" for any
    down_s: float = 0.0
    during: str = ""  # kill: "", "confirm-stopped" or "retire"
    delta_ms: int = 0

    def __str__(self) -> str:
        extra = {"kill": f" at {self.point} {self.name or 'any'} (skip {self.skip}) down {self.down_s:.1f} s"
                         + (f" then {self.during}" if self.during else ""),
                 "drain": f" down {self.down_s:.1f} s", "revoke": f" allowed {self.down_s:.1f} s later",
                 "clock": f" {self.delta_ms:+d} ms"}.get(self.kind, "")
        return f"{self.at_s:.2f} s {self.kind} {self.target}{extra}"


def jobs_of_process(rng: random.Random, n: int = RUNS) -> list[Job]:
    """Longer jobs than issue 17's, to outlive a kill and a restart."""
    return [Job(safety="idempotent" if rng.random() < 0.3 else "unknown",
                sleep_s=round(rng.uniform(0.5, 3.0), 2),
                exit_code=3 if rng.random() < 0.25 else 0) for _ in range(n)]


def schedule_of(rng: random.Random, t: ProcessTiming = ProcessTiming()) -> list[Event]:
    """The seed's process faults, in time order: a function of the seed alone."""
    events = []

    def at() -> float:
        return round(rng.uniform(0.2, t.fault_s), 2)
    for _ in range(rng.randint(1, 2)):
        long = rng.random() < 0.4
        point = rng.choice(KILL_KINDS)
        name = rng.choice(KILL_NAMES[point.split(":")[0]]) if rng.random() < 0.7 else ""
        events.append(Event(at(), "kill", rng.choice(WORKERS), point=point, name=name,
                            skip=rng.randrange(4) if not name else rng.randrange(2),
                            down_s=round(rng.uniform(2.0, 3.0) if long else rng.uniform(0.05, 0.6), 2),
                            during=rng.choice(("", "confirm-stopped", "retire")) if long else ""))
    if rng.random() < 0.5:
        events.append(Event(at(), "replica", f"r{rng.randrange(2)}"))
    if rng.random() < 0.3:
        events.append(Event(at(), "drain", rng.choice(WORKERS), down_s=round(rng.uniform(0.1, 1.5), 2)))
    if rng.random() < 0.3:
        events.append(Event(at(), "revoke", rng.choice(WORKERS), down_s=round(rng.uniform(0.3, 1.5), 2)))
    if rng.random() < 0.3:
        events.append(Event(at(), "cancel", str(rng.randrange(RUNS))))
    for _ in range(rng.randint(0, 2)):
        events.append(Event(at(), "clock", rng.choice(WORKERS),
                            delta_ms=rng.choice((-1, 1)) * rng.randint(500, 20_000)))
    return sorted(events, key=lambda e: e.at_s)


def _journal_rows(path: Path) -> list[str]:
    """A worker's journal rows in flight and its owed reports, as lines (for a seed that did not settle)."""
    import sqlite3

    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        rows = [f"attempt {a} {st} lease generation {g} session generation {sg} clear_pending {c}"
                for a, st, g, sg, c in conn.execute(
                    "SELECT attempt_id, state, lease_generation, session_generation, clear_pending "
                    "FROM executor_journal WHERE state IN ('accepted', 'launching', 'started')")]
        rows += [f"owes {k} about {a} (request {r})"
                 for r, k, a in conn.execute("SELECT request_id, kind, attempt_id FROM executor_owed")]
        return rows
    finally:
        conn.close()


def _hard_shutdown(ctx) -> None:
    """A killed worker's end: no Leave, no Drain, nothing settled; its actors stopped without
    waiting (those of its threads blocked at a kill point stay blocked until the seed ends)."""
    for name in ("supervisor", "executor", "logs", "receipts"):
        ref = ctx.directory.get(name)
        if ref is not None:
            try:
                ref.stop(block=False)
            except Exception:
                pass
    ctx.bridge.close(timeout=2)
    time.sleep(0.1)  # a journal write under way reaches its after-point (and blocks there)
    threading.Thread(target=ctx.zmq.term, name="simnet-zmq-term", daemon=True).start()


class ProcessSeed(_Seed):
    def __init__(self, seed: int, root: Path, url: str, admin, timing: Timing, plan, slots: int,
                 ptiming: ProcessTiming) -> None:
        self.prng = random.Random(f"simnet:{seed}:process")
        self.ptiming = ptiming
        self.events = schedule_of(self.prng, ptiming)
        self.jobs = jobs_of_process(self.prng)
        super().__init__(seed, root, url, admin, timing, plan, slots)
        self.hooks = Hooks(self.recorder.alive)
        self.recorder.worker_of = self.hooks.worker_name
        self.asked: list[Asked] = []
        self.killed_contexts: list = []  # the zmq contexts of killed runtimes (closed at their end)
        self.log: list[str] = [f"schedule: {e}" for e in self.events]
        self.run_ids: list[str] = []

    def _worker_slots(self) -> list[WorkerSlot]:
        return [WorkerSlot(name, self.root / f"state-{name}") for name in WORKERS]

    def _link_name(self, worker: WorkerSlot, i: int) -> str:
        return f"{worker.name}-r{i}"

    def _admit(self) -> None:
        self.run_ids.extend(self._admit_jobs(self.jobs))

    def start(self) -> None:
        for w in self.workers:
            self.hooks.worker(w.name, str(w.state))
        self.hooks.install()
        super().start()

    def start_worker(self, w: WorkerSlot) -> None:
        self.hooks.workers[str(w.state)].new_incarnation()
        super().start_worker(w)

    def now(self) -> float:
        return time.monotonic() - self.hooks.t0

    def note(self, line: str) -> None:
        self.log.append(f"{self.now():6.2f} s {line}")
        log.info("event=simnet %s", line)

    def fault_and_settle(self) -> None:
        t0 = time.monotonic()
        for ev in self.events:
            wait = t0 + ev.at_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            getattr(self, f"_do_{ev.kind}")(ev)
        rest = t0 + self.ptiming.fault_s - time.monotonic()
        if rest > 0:
            time.sleep(rest)
        for link in self.links:
            link.calm()
        self.note("calm")
        self.settle(self.ptiming.settle_s)

    # -- the events -----------------------------------------------------------------------------

    def _worker(self, name: str) -> WorkerSlot:
        return next(w for w in self.workers if w.name == name)

    def _do_kill(self, ev: Event) -> None:
        w = self._worker(ev.target)
        handle = self.hooks.workers[str(w.state)]
        inc = handle.incarnation
        handle.arm(KillPlan(ev.point, ev.skip, ev.name))
        if not handle.fired.wait(self.ptiming.kill_point_wait_s):
            handle.kill_now(f"anywhere (no {ev.point} point came within {self.ptiming.kill_point_wait_s} s)")
        killed_at = time.monotonic()
        self.note(f"kill {w.name} (incarnation {inc.number}) {inc.point}")
        for link in w.links:
            link.sever()
        runtime = w.thread.runtime
        runtime._shutdown = _hard_shutdown  # an instance attribute: this runtime only
        self.killed_contexts.append(runtime.ctx.zmq)
        w.thread.stop()
        w.thread = None
        if ev.during:
            wait = killed_at + self.ptiming.lease_wait_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            getattr(self, "_retire" if ev.during == "retire" else "_confirm_stopped")(w)
        time.sleep(max(0.0, killed_at + ev.down_s - time.monotonic()))
        self.start_worker(w)
        self.note(f"restart {w.name} (incarnation {handle.incarnation.number})")

    def _retire(self, w: WorkerSlot) -> None:
        done = WorkerRetirement(self.admin.store).retire(w.name)
        self.asked.append(Asked("retire", w.name, self.now()))
        self.note(f"worker retire {w.name} --confirm-stopped: {done.sessions_ended} session(s) ended, "
                  f"attempts {list(done.attempts)}")

    def _confirm_stopped(self, w: WorkerSlot) -> None:
        from sqlalchemy import select

        from qlactors.store.schema import run_attempts

        with self.admin.store.read() as conn:
            run_ids = list(conn.execute(select(run_attempts.c.run_id).where(
                run_attempts.c.worker_id == w.name,
                run_attempts.c.status.in_(("starting", "running"))).order_by(run_attempts.c.run_id)).scalars())
        for run_id in run_ids:
            done = ConfirmStopped(self.admin.store).confirm_stopped(run_id, "simnet")
            if done.result is Result.APPLIED:
                self.asked.append(Asked("confirm-stopped", run_id, self.now()))
            self.note(f"confirm-stopped {run_id}: {done.result.value} {done.detail or ''}")

    def _do_replica(self, ev: Event) -> None:
        ctx = self.threads[int(ev.target[1:])].runtime.ctx
        self.hooks.replica_kill.clear()
        self.hooks.replica_armed[id(ctx)] = ev.target
        fired = self.hooks.replica_kill.wait(1.0)
        self.hooks.replica_armed.pop(id(ctx), None)
        if fired:
            restart_gateway(ctx)
            self.note(f"replica {ev.target} killed before sending its answer "
                      f"{self.hooks.replica_fired[-1][1]}; its Gateway restarted")
        else:
            self.note(f"replica {ev.target}: no answer to drop within 1 s")

    def _do_drain(self, ev: Event) -> None:
        w = self._worker(ev.target)
        w.thread.stop()
        w.thread = None
        self.note(f"drain {w.name} (SIGTERM's stop)")
        time.sleep(ev.down_s)
        self.start_worker(w)
        self.note(f"restart {w.name}")

    def _do_revoke(self, ev: Event) -> None:
        w = self._worker(ev.target)
        keys = WorkerKeys(self.admin.store)
        done = keys.revoke(w.name)
        self.asked.append(Asked("revoke", w.name, self.now()))
        self.note(f"worker revoke {w.name}: {done}")
        time.sleep(ev.down_s)
        keys.allow(w.name, w.public)
        self.note(f"worker allow {w.name}")

    def _do_cancel(self, ev: Event) -> None:
        run_id = self.run_ids[int(ev.target)]
        done = self.admin.runs.cancel(run_id, actor_name="simnet")
        if done.result in (Result.CANCELLED, Result.REQUESTED):
            self.asked.append(Asked("cancel", run_id, self.now()))
        self.note(f"cancel {run_id}: {done.result.value}")

    def _do_clock(self, ev: Event) -> None:
        handle = self.hooks.workers[str(self._worker(ev.target).state)]
        handle.offset_ms += ev.delta_ms
        self.note(f"clock of {ev.target} stepped {ev.delta_ms:+d} ms (offset {handle.offset_ms:+d} ms)")

    # -- settling ---------------------------------------------------------------------------------

    def settle(self, settle_s: float) -> None:
        """As issue 17's, and the operator's part of the contract: an attempt whose launch outcome
        is unknown (killed between journalling `launching` and spawning) waits for an operator
        (docs/reliability.md); once it has waited `rescue_after_s`, the rig, which knows that no
        launcher of it was ever spawned, says so with `confirm-stopped RUN`. A seed that does not
        settle notes what its unfinished attempts wait for."""
        from .rig import _settled

        calm_at = time.monotonic()
        rescued: set[str] = set()
        while time.monotonic() - calm_at < settle_s:
            if _settled(self.admin, list(self.runs), self.journals()):
                self.settled_s = time.monotonic() - calm_at
                return
            if time.monotonic() - calm_at > self.ptiming.rescue_after_s:
                self._rescue(rescued)
            time.sleep(0.05)
        for w in self.workers:
            for line in _journal_rows(w.state / "journal.sqlite"):
                self.note(f"{w.name} journal: {line}")
        for row in self._unfinished():
            self.note(f"unfinished: attempt {row.id} of run {row.run_id} on {row.worker_id}: {row.status}, "
                      f"evidence {row.evidence} (lease generation {row.evidence_lease_generation} of "
                      f"{row.lease_generation})")

    def _unfinished(self):
        from sqlalchemy import select

        from qlactors.store.schema import run_attempts as a

        with self.admin.store.read() as conn:
            return conn.execute(select(a.c.id, a.c.run_id, a.c.worker_id, a.c.status, a.c.evidence,
                                       a.c.evidence_lease_generation, a.c.lease_generation).where(
                a.c.run_id.in_(list(self.runs)), a.c.status.in_(("claimed", "starting", "running")))
                .order_by(a.c.id)).all()

    def _rescue(self, rescued: set[str]) -> None:
        launches = self.recorder.launches()
        for row in self._unfinished():
            if row.id in rescued or row.evidence != "launch_unknown" or launches[row.id]:
                continue
            done = ConfirmStopped(self.admin.store).confirm_stopped(row.run_id, "simnet")
            if done.result is Result.APPLIED:
                rescued.add(row.id)
                self.asked.append(Asked("confirm-stopped", row.run_id, self.now()))
            self.note(f"operator: confirm-stopped {row.run_id} (launch unknown, never spawned): "
                      f"{done.result.value} {done.detail or ''}")

    # -- the end ----------------------------------------------------------------------------------

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            self.hooks.remove()
            # A killed runtime's sockets are closed by its end, as the OS closes a dead process's:
            # its released threads close theirs, and its context's term (started at the kill)
            # returns once every socket is closed; waited for here, so no socket is left to the
            # collector of whichever test runs next (a ResourceWarning there fails that test).
            import gc
            import warnings

            contexts = [*self.killed_contexts, *(t.runtime.ctx.zmq for t in self.threads)]
            deadline = time.monotonic() + 15
            while any(not z.closed for z in contexts) and time.monotonic() < deadline:
                time.sleep(0.05)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ResourceWarning)
                gc.collect()

    def facts(self) -> Facts:
        f = super().facts()
        f.stops = [CheckedStop(s.attempt_id, s.reason, s.at_s, s.alive) for s in self.hooks.stops]
        f.asked = list(self.asked)
        return f
