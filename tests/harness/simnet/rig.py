"""One seed: two control replicas (ControlRuntime, each its own bridge, Gateway and cadence) on one
real database, one worker (WorkerRuntime: Executor, ReceiptConsumer, LogSender, a real journal
file, the real launcher) whose links reach each replica through a FaultyLink, in one process.

A seed's schedule: the runs are admitted, the worker starts, the links fault and the Gateways are
restarted now and then for `fault_s`; then the links calm and the rig waits (at most `settle_s`)
for every run to be terminal and the journal to hold nothing in flight; then everything stops
(by its own stop, every leftover launcher by its pid) and the facts are read for the checker.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from qlactors.executor import launching as launching_module
from qlactors.control.gateway import Gateway
from qlactors.config import ControlConfig, DatabaseSettings, WorkerConfig
from qlactors.domain.model import Command, TaskSpec
from qlactors.domain.retry import RetryPolicy
from qlactors.domain.states import RetrySafety
from qlactors.profiles.control import ControlRuntime
from qlactors.profiles.worker import WorkerRuntime
from qlactors.store.repository import Repository
from qlactors.store.admin.worker_keys import WorkerKeys
from qlactors.wire.curve_keys import load_key_pair, new_key_pair
from qlactors.executor.journal.file import JOURNAL_FILE

from .checker import Attempt, Facts, Run
from .facts import JOB, SpawnRecorder, read_ledger
from .net import FaultPlan, FaultyLink

WORKER = "w1"


@dataclass(frozen=True)
class Timing:
    """A fast cluster: one seed's faults and settling take seconds, not minutes."""

    heartbeat_ms: int = 200
    session_lease_ms: int = 1_500
    run_lease_ms: int = 1_500
    recovery_grace_ms: int = 3_000
    cadence_tick_ms: int = 100
    request_timeout_ms: int = 200
    fault_s: float = 2.0
    settle_s: float = 10.0
    gateway_restarts: float = 1.5  # the mean number of Gateway restarts within the fault window


@dataclass(frozen=True)
class Job:
    safety: str  # "unknown" or "idempotent"
    sleep_s: float
    exit_code: int


def jobs_of(rng: random.Random, n: int = 6) -> list[Job]:
    """The seed's jobs: most of unknown safety, some exiting non-zero, a few idempotent that retry
    when lost; each sleeps long enough to outlive the faults of its part of the window."""
    return [Job(safety="idempotent" if rng.random() < 0.25 else "unknown",
                sleep_s=round(rng.uniform(0.4, 1.6), 2),
                exit_code=3 if rng.random() < 0.25 else 0) for _ in range(n)]


class _Sqlite(DatabaseSettings):
    """A replica's database settings on SQLite, which takes no pool size or PostgreSQL timeouts."""

    def store_options(self, *, pool: bool = True) -> dict[str, int]:
        return {} if self.url.startswith("sqlite") else DatabaseSettings.store_options(self, pool=pool)


@dataclass
class SeedResult:
    seed: int
    facts: Facts
    settled_s: float | None  # how long after the faults stopped it converged; None: it did not
    counts: dict = field(default_factory=dict)
    log: list[str] = field(default_factory=list)  # what the process schedule did, in order


def _free_tcp() -> str:
    from wire_harness import free_port

    return f"tcp://127.0.0.1:{free_port()}"


class _Thread:
    """A runtime's `run()` in a thread, stopped by its own `stop()`."""

    def __init__(self, runtime) -> None:
        self.runtime = runtime
        self.status: list[int] = []
        self.thread = threading.Thread(target=lambda: self.status.append(runtime.run()), daemon=True)
        self.thread.start()
        if not runtime.started.wait(30):
            self.stop()
            raise RuntimeError(f"{runtime.name} did not start")

    def stop(self) -> None:
        self.runtime.stop()
        self.thread.join(30)


def restart_gateway(ctx) -> None:
    """Stop the Gateway with its mailbox dropped (frames meanwhile reach no one), start a new one."""
    ref = ctx.directory.get("gateway")
    ctx.directory.set("gateway", None)
    if ref is not None:
        inbox = getattr(ref, "actor_inbox", None)
        while inbox is not None and not inbox.empty():
            try:
                inbox.get_nowait()
            except Exception:
                break
        try:
            ref.stop(timeout=5)
        except Exception:
            pass
    ctx.directory.set("gateway", Gateway.start(ctx))


def run_seed(seed: int, root: Path, *, database_url: str | None = None, timing: Timing = Timing(),
             plan: FaultPlan = FaultPlan(), slots: int = 2, process: bool = False,
             ptiming: "ProcessTiming | None" = None) -> SeedResult:
    """Run one seed in `root` (keys, database file, ledger, the worker's state) and read its facts.
    `process`: the seed also faults processes (issue 26, simnet/schedule.py): two workers, each
    killed and restarted at journal writes and answers, drained, revoked, retired; a replica
    killed between a commit and its answer; operator commands; a worker's clock stepped."""
    url = database_url or f"sqlite:///{root / 'simnet.sqlite'}"
    admin = Repository.open(url)
    try:
        if process:
            from .schedule import ProcessSeed, ProcessTiming

            seed_run = ProcessSeed(seed, root, url, admin, timing, plan, slots, ptiming or ProcessTiming())
        else:
            seed_run = _Seed(seed, root, url, admin, timing, plan, slots)
        try:
            seed_run.start()
            seed_run.fault_and_settle()
        finally:
            seed_run.stop()
        return SeedResult(seed, seed_run.facts(), seed_run.settled_s, seed_run.counts(),
                          getattr(seed_run, "log", []))
    finally:
        admin.close()


@dataclass
class WorkerSlot:
    """One worker of the rig: its id, key, state directory, links, and its runtime's thread."""

    name: str
    state: Path
    public: str = ""
    links: list[FaultyLink] = field(default_factory=list)
    thread: "_Thread | None" = None


class _Seed:
    workers_n = 1

    def __init__(self, seed: int, root: Path, url: str, admin: Repository, timing: Timing,
                 plan: FaultPlan, slots: int) -> None:
        self.seed, self.root, self.url, self.admin = seed, root, url, admin
        self.timing, self.plan, self.slots = timing, plan, slots
        self.rng = random.Random(f"simnet:{seed}")
        self.keys = root / "keys"
        self.ledger = root / "ledger.txt"
        self.runs: dict[str, Job] = {}
        self.threads: list[_Thread] = []  # the replicas'
        self.workers: list[WorkerSlot] = self._worker_slots()
        self.recorder = SpawnRecorder(launching_module.spawn)
        self.settled_s: float | None = None

    def _worker_slots(self) -> list[WorkerSlot]:
        # One worker, as issue 17 made it: links r0 and r1, its state in `state`.
        return [WorkerSlot(WORKER, self.root / "state")]

    def _link_name(self, worker: WorkerSlot, i: int) -> str:
        return f"r{i}"

    @property
    def links(self) -> list[FaultyLink]:
        return [link for w in self.workers for link in w.links]

    def start(self) -> None:
        new_key_pair(self.keys, "control")
        server_public, server_secret = load_key_pair(self.keys / "control.key_secret")
        for w in self.workers:
            new_key_pair(self.keys, w.name)
            public, _secret = load_key_pair(self.keys / f"{w.name}.key_secret")
            w.public = public.decode("ascii")
            WorkerKeys(self.admin.store).allow(w.name, w.public)
        binds = [_free_tcp(), _free_tcp()]
        for i, bind in enumerate(binds):
            self.threads.append(_Thread(ControlRuntime(self._control_config(i, bind))))
        for w in self.workers:
            worker_public, worker_secret = load_key_pair(self.keys / f"{w.name}.key_secret")
            for i, bind in enumerate(binds):
                link = FaultyLink(seed=self.seed, name=self._link_name(w, i), front=_free_tcp(), replica=bind,
                                  server_public=server_public, server_secret=server_secret,
                                  worker_public=worker_public, worker_secret=worker_secret, plan=self.plan,
                                  worker_id=w.name)
                w.links.append(link)
                link.start()
                link.wait_ready()
        self._admit()
        for w in self.workers:
            w.state.mkdir()
        launching_module.spawn = self.recorder
        for w in self.workers:
            self.start_worker(w)

    def start_worker(self, w: WorkerSlot) -> None:
        w.thread = _Thread(WorkerRuntime(self._worker_config(w)))

    def _control_config(self, i: int, bind: str) -> ControlConfig:
        t = self.timing
        return ControlConfig(path=self.root / f"control-{i}.toml", database=_Sqlite(url=self.url), bind=bind,
                             key=self.keys / "control.key_secret", heartbeat_ms=t.heartbeat_ms,
                             session_lease_ms=t.session_lease_ms, run_lease_ms=t.run_lease_ms,
                             recovery_grace_ms=t.recovery_grace_ms, drain_grace_ms=0,
                             cadence_tick_ms=t.cadence_tick_ms, shutdown_drain_ms=2_000)

    def _worker_config(self, w: WorkerSlot) -> WorkerConfig:
        return WorkerConfig(path=self.root / f"{w.name}.toml", control=tuple(link.front for link in w.links),
                            server_key=self.keys / "control.key", key=self.keys / f"{w.name}.key_secret",
                            slots=self.slots, state_dir=w.state,
                            request_timeout_ms=self.timing.request_timeout_ms, shutdown_drain_ms=1_000,
                            stop_grace_ms=200, kill_grace_ms=200, output_drain_ms=100, disk_reserve_bytes=0)

    def _admit(self) -> None:
        self._admit_jobs(jobs_of(self.rng))

    def _admit_jobs(self, jobs: list[Job]) -> list[str]:
        """A task per job (its ledger line, sleep and exit code) and one run of each: their ids."""
        run_ids = []
        for n, job in enumerate(jobs):
            retry = RetryPolicy() if job.safety == "unknown" else RetryPolicy(
                max_attempts=3, retry_on_lost=True, safety=RetrySafety.IDEMPOTENT, backoff_base_ms=50,
                backoff_max_ms=200)
            name = f"sim-{n}"
            self.admin.tasks.add(TaskSpec(name=name, command=Command(shell=JOB.format(
                ledger=self.ledger, sleep=job.sleep_s, code=job.exit_code)), retry=retry, stop_grace_ms=200),
                actor_name="tester")
            run_id = self.admin.runs.request(name).run.id
            self.runs[run_id] = job
            run_ids.append(run_id)
        return run_ids

    def journals(self) -> list[Path]:
        return [w.state / JOURNAL_FILE for w in self.workers]

    def fault_and_settle(self) -> None:
        _faults(self.rng, [t.runtime for t in self.threads[:2]], self.timing)
        for link in self.links:
            link.calm()
        self.settle(self.timing.settle_s)

    def settle(self, settle_s: float) -> None:
        calm_at = time.monotonic()
        while time.monotonic() - calm_at < settle_s:
            if _settled(self.admin, list(self.runs), self.journals()):
                self.settled_s = time.monotonic() - calm_at
                return
            time.sleep(0.05)

    def stop(self) -> None:
        """Every runtime by its own stop (the workers first), the links, then any launcher left."""
        try:
            for w in self.workers:
                if w.thread is not None:
                    w.thread.stop()
            for t in reversed(self.threads):
                t.stop()
        finally:
            launching_module.spawn = self.recorder.real
            for link in self.links:
                link.close()
            self.recorder.kill_leftovers()

    def counts(self) -> dict:
        return {k: sum(link.counts[k] for link in self.links) for k in ("frames", "dropped", "duplicated")}

    def facts(self) -> Facts:
        return _facts(self.admin, self.runs, self.root, self.recorder, self.slots, self.journals())


def _faults(rng: random.Random, replicas: list[ControlRuntime], timing: Timing) -> None:
    """The fault window: the links fault on their own; now and then a replica's Gateway restarts."""
    end = time.monotonic() + timing.fault_s
    while True:
        gap = rng.expovariate(timing.gateway_restarts / timing.fault_s)
        target = rng.randrange(len(replicas))
        if time.monotonic() + gap >= end:
            break
        time.sleep(gap)
        restart_gateway(replicas[target].ctx)
    time.sleep(max(0.0, end - time.monotonic()))


def _journal_in_flight(path: Path) -> list[str]:
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        return [r[0] for r in conn.execute(
            "SELECT attempt_id FROM executor_journal WHERE state IN ('accepted', 'launching', 'started')")]
    finally:
        conn.close()


def _rows(admin: Repository, run_ids: list[str]):
    from sqlalchemy import select

    from qlactors.store.schema import run_attempts, runs

    with admin.store.read() as conn:
        r = conn.execute(select(runs.c.id, runs.c.status).where(runs.c.id.in_(run_ids))).all()
        a = conn.execute(select(run_attempts.c.id, run_attempts.c.run_id, run_attempts.c.status,
                                run_attempts.c.exit_code, run_attempts.c.error_code, run_attempts.c.worker_id)
                         .where(run_attempts.c.run_id.in_(run_ids))).all()
    return r, a


def _settled(admin: Repository, run_ids: list[str], journals: list[Path]) -> bool:
    r, a = _rows(admin, run_ids)
    return (all(s in ("succeeded", "failed", "cancelled", "timed_out") for _i, s in r)
            and not any(_journal_in_flight(j) for j in journals))


def _facts(admin: Repository, runs: dict[str, Job], root: Path, recorder: SpawnRecorder, slots: int,
           journals: list[Path]) -> Facts:
    r, a = _rows(admin, list(runs))
    starts, ends = read_ledger(root / "ledger.txt")
    return Facts(
        runs=[Run(i, s, runs[i].safety, runs[i].exit_code) for i, s in r],
        attempts=[Attempt(*row) for row in a], slots=slots, launches=recorder.launches(),
        starts=starts, ends=ends, most_alive=recorder.most_alive,
        journal_in_flight=[x for j in journals for x in _journal_in_flight(j)])
