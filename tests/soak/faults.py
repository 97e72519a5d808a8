"""The soak's faults (issue 11), each applied to a running cluster and undone before it returns
(every process it stopped is started again, every one it froze thawed), so each is bounded. A
process is always signalled by its PID, or by its process group's id read from the worker's own
journal and checked to be one of this soak's jobs first; 127.0.0.1 only."""

from __future__ import annotations

import os
import re
import random
import signal
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from actor_harness import wait_until
from cluster_harness import Cluster, Proc
from pg_private import PrivatePostgres

KINDS = ("worker_kill", "host_death", "worker_freeze", "worker_freeze_past_lease",
         "replica_kill", "replica_freeze", "replica_delay", "postgres_restart",
         "worker_restart_after_partition", "confirm_stopped_thawed")
# `replica_freeze`: SIGSTOP for up to this long; `replica_delay`: the one-way delay's range, and
# how long it is held (issue 17: past the workers' 1.5 s request timeout, within their jobs).
FREEZE_MAX_S = 12
DELAY_S = (3, 12)
DELAY_HELD_S = (5, 15)
# Both replica faults begin the moment the replica's next Offers frame passes on a worker's path
# (the first frame at least this big, ~650 bytes and up; its Nudges and Acks are under 300), so
# the Activates that answer them meet the fault; at once if none passes within OFFERS_WAIT_S.
OFFERS_MIN_BYTES = 600
_ATTEMPT_IN_PATH = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}(?=\.fifo)")
OFFERS_WAIT_S = 5
# `worker_restart_after_partition`: the partition outlasts the session lease by this much; the
# worker is killed this long after its new session opened (the heal's Register), and the soak
# waits at most PARTITION_REOPEN_S for that session.
PARTITION_PAST_LEASE_S = (2, 8)
RESTART_PAUSE_S = (0, 2)
PARTITION_REOPEN_S = 60
# `confirm_stopped_thawed`: the operator's commands are started together once the frozen
# worker's first run lease has lapsed (database time), and the worker is thawed a seeded while
# after the first word of them was recorded (seen in the database): half the time within THAW_SOON_S, else
# up to THAW_AFTER_S. Recovery acts on a recorded word within a cadence tick or two (200 ms), so
# only a thaw that soon lets the worker's renewal race it (outcome `withdrawn`).
THAW_SOON_S = 0.2
THAW_AFTER_S = 2.0
# Both issue-26 faults first submit SURVIVORS runs of the task SURVIVOR (45 s, unknown safety,
# soak.py) and wait up to SURVIVOR_WAIT_S for one to run on their worker, so it holds a job that
# outlives the fault (the other tasks' jobs mostly end within it).
SURVIVOR = "survivor"
SURVIVORS = 3
SURVIVOR_WAIT_S = 20
CONFIRM_WAIT_S = 8  # past the run lease, how long the frozen worker's leases are waited for
_ATTEMPT_NAMED = re.compile(r"attempt (\d+) \(([0-9a-f-]{36})\)")
_GENERATION = re.compile(r"lease generation (\d+)")


def confirm_answer(returncode: int, stdout: str, stderr: str) -> dict:
    """What one `qlactors confirm-stopped RUN` said (pure): `result` is `applied` (recorded now),
    `already` (a trusted fact about the lease was there: nothing written) or `refused` (exit 2,
    nothing written; `detail` its line), with the attempt and lease generation it named."""
    text = stdout.strip() or stderr.strip()
    named, generation = _ATTEMPT_NAMED.search(text), _GENERATION.search(text)
    result = ("refused" if returncode != 0 else "already" if "already recorded" in text else "applied")
    return dict(result=result, attempt_id=named.group(2) if named else None,
                lease_generation=int(generation.group(1)) if generation else None, detail=text[:300])


@dataclass
class Applied:
    kind: str
    target: str
    at_s: float  # seconds since the soak began
    detail: str = ""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _wait(condition, timeout: float, step: float = 0.2) -> bool:
    """Whether `condition()` came true within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return bool(condition())


@dataclass
class Faults:
    cluster: Cluster
    pg: PrivatePostgres
    rng: random.Random
    tag: str  # SOAK_TAG=<tag> is in every job's environment
    session_lease_s: float
    run_lease_s: float = 10.0
    began: float = field(default_factory=time.monotonic)
    applied: list[Applied] = field(default_factory=list)
    killed_at_ms: dict[str, int] = field(default_factory=dict)  # attempt id -> its group killed
    slots: int = 4
    # worker name -> its TcpProxy to each replica, in the replicas' order (tests/harness/tcp_proxy.py)
    proxies: dict[str, list] = field(default_factory=dict)
    # every operator `confirm-stopped` the soak ran (`confirm_stopped_thawed`), one dict each
    confirmations: list[dict] = field(default_factory=list)

    def apply(self, kind: str) -> Applied:
        at = time.monotonic() - self.began
        target, detail = getattr(self, kind)()
        done = Applied(kind, target, round(at, 1), detail)
        self.applied.append(done)
        return done

    # -- workers ------------------------------------------------------------------------------

    def _worker(self) -> str:
        return self.rng.choice(sorted(self.cluster.workers))

    def worker_kill(self) -> tuple[str, str]:
        name = self._worker()
        self.cluster.stop(self.cluster.workers[name], signal.SIGKILL)
        down = self.rng.uniform(1, 4)
        time.sleep(down)
        self.restart_worker(name)
        return name, f"down {down:.1f} s"

    def host_death(self) -> tuple[str, str]:
        """The worker and its jobs' process groups SIGKILLed (frozen first, so it launches
        nothing between the read of its journal and the kill); started again a while later.

        The launchers die before their jobs: a job runs in a session of its own, so a host's
        death is two kills here, and a launcher that outlived its job by a moment would publish
        the receipt of a job killed by this fault (exit 137, recorded as the job's own failure:
        the 20-minute soak of 2026-12-07, seed 26120702, found one such run). No real host
        death leaves a launcher that time."""
        name = self._worker()
        proc = self.cluster.workers[name]
        proc.popen.send_signal(signal.SIGSTOP)
        groups = self._job_groups(name)
        launchers = self._launchers(name)
        self.cluster.stop(proc, signal.SIGKILL)
        at = now_ms()
        for attempt_id, pid in launchers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.killed_at_ms[attempt_id] = at
        for attempt_id, pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.killed_at_ms.setdefault(attempt_id, at)
        down = self.rng.uniform(5, 20)
        time.sleep(down)
        self.restart_worker(name)
        return name, f"{len(groups)} job groups killed, down {down:.1f} s"

    def _launchers(self, name: str) -> list[tuple[str, int]]:
        """(attempt id, launcher pid) of the worker's journal rows whose launcher is this soak's."""
        return self._tagged(self._journalled(name, "pid"))

    def _journalled(self, name: str, column: str) -> list[tuple[str, int]]:
        """(attempt id, `column`) of the worker's journal rows that hold one (pid or pgid)."""
        journal = self.cluster.root / f"state-{name}" / "journal.sqlite"
        conn = sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=10)
        try:
            return conn.execute(f"SELECT attempt_id, {column} FROM executor_journal "
                                f"WHERE {column} IS NOT NULL").fetchall()
        finally:
            conn.close()

    def _tagged(self, rows: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """The rows whose process (pid or group leader) is one of this soak's: its environment
        carries the tag, never another process that got the same id."""
        mark = f"SOAK_TAG={self.tag}".encode()
        found = []
        for attempt_id, pid in rows:
            try:
                if mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    found.append((attempt_id, pid))
            except OSError:
                continue
        return found

    def _job_groups(self, name: str) -> list[tuple[str, int]]:
        """(attempt id, process group) of the worker's jobs: its journal rows whose group leader is
        one of this soak's jobs, and those spawned too recently for the journal to hold them."""
        ours = self._tagged(self._journalled(name, "pgid"))
        mark = f"SOAK_TAG={self.tag}".encode()
        # A job spawned just before the freeze whose identity the journal does not hold yet dies
        # with its host too (a real host death spares none): found by its tag and its output,
        # which goes to a file in that worker's state directory.
        known = {pgid for _a, pgid in ours}
        state = f"/state-{name}/"
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if mark not in (entry / "environ").read_bytes().split(b"\0"):
                    continue
                output = os.readlink(entry / "fd" / "1")
                if state not in output:
                    continue
                pgid = os.getpgid(int(entry.name))
            except OSError:
                continue
            if pgid not in known:
                known.add(pgid)
                named = _ATTEMPT_IN_PATH.search(output)  # the log-cap FIFO is named by its attempt
                ours.append((named.group(0) if named else f"unjournalled:{pgid}", pgid))
        return ours

    def worker_freeze(self) -> tuple[str, str]:
        # within the run lease (so within the session lease, which is longer)
        return self._freeze_worker(self.rng.uniform(2, min(self.run_lease_s, self.session_lease_s) * 0.6))

    def worker_freeze_past_lease(self) -> tuple[str, str]:
        return self._freeze_worker(self.rng.uniform(self.session_lease_s + 2, self.session_lease_s + 10))

    def worker_restart_after_partition(self) -> tuple[str, str]:
        """Both directions of both of a worker's paths (its proxies to every replica) blackholed
        past its session lease, then healed; once the worker has registered its new session (and
        re-attests its survivors `running`: re-binds), a seeded 0-2 s later it is SIGKILLed and
        started again on its state directory, its jobs still running (as `worker_kill`)."""
        from tcp_proxy import DOWN, UP

        name = self._worker()
        held = self.session_lease_s + self.rng.uniform(*PARTITION_PAST_LEASE_S)
        pause = self.rng.uniform(*RESTART_PAUSE_S)
        survivors = self._survivors(name)
        paths = self.proxies[name]
        before = self._sessions_opened(name)
        rebound = self._worker_log_count(name, "event=rebound")
        for proxy in paths:
            proxy.blackhole(UP)
            proxy.blackhole(DOWN)
        try:
            time.sleep(held)
        finally:
            for proxy in paths:
                proxy.blackhole(UP, False)
                proxy.blackhole(DOWN, False)
                proxy.reset()  # the holed streams end at once (the peers connect again)
        healed = time.monotonic()
        reopened = _wait(lambda: self._sessions_opened(name) > before, PARTITION_REOPEN_S)
        reopen_s = f"{time.monotonic() - healed:.1f} s after the heal" if reopened else \
            f"none within {PARTITION_REOPEN_S} s of the heal"
        time.sleep(pause)
        rebinds = self._worker_log_count(name, "event=rebound") - rebound
        self.cluster.stop(self.cluster.workers[name], signal.SIGKILL)
        self.restart_worker(name)
        return name, (f"{survivors}; partitioned {held:.1f} s; new session {reopen_s}; {rebinds} re-binds logged; "
                      f"killed {pause:.1f} s after it and restarted")

    def _survivors(self, name: str) -> str:
        """Submit SURVIVORS runs of SURVIVOR and wait (SURVIVOR_WAIT_S at most) until one runs on
        worker `name`; says how many do."""
        ids = []
        for _ in range(SURVIVORS):
            try:
                ids.append(self.cluster.cli("run", SURVIVOR).stdout.decode().strip().split()[-1])
            except (AssertionError, IndexError, subprocess.SubprocessError):
                continue  # the database restarting: fewer survivors

        def on_it() -> int:
            try:
                return self.cluster.sql("SELECT count(*) FROM run_attempts WHERE run_id = ANY(%s) AND "
                                        "worker_id = %s AND status = 'running'", ids, name)[0][0]
            except Exception:
                return 0

        _wait(lambda: on_it() > 0, SURVIVOR_WAIT_S, 0.5)
        return f"{on_it()} of {len(ids)} survivors running on it"

    def _worker_log_count(self, name: str, needle: str) -> int:
        path = self.cluster.root / f"worker-{name}.log"
        return path.read_text(errors="replace").count(needle) if path.exists() else 0

    def confirm_stopped_thawed(self) -> tuple[str, str]:
        """A worker frozen (SIGSTOP) past its run lease; for each of its runs whose lease has
        lapsed (database time), the operator's `qlactors confirm-stopped RUN --by soak-fault-K`
        (the CLI with the cluster's config): a first wave for the leases lapsed once the first
        one has, a second for the rest (later activations: the survivor's) once they have too;
        the worker thawed a seeded 0-2 s after the first word of the last wave was recorded
        (seen in the database; THAW_SOON_S).
        The worker's renewal (or its re-bind, when its session lapsed too) may land before
        recovery acts on a word (the word is withdrawn or void, the job runs on) or after it (the
        attempt ends `lost`, RECOVERY_CONFIRMED_STOPPED, and the worker stops the job); each
        command, with what it answered, is kept in `confirmations` for the checker."""
        name = self._worker()
        soon = self.rng.random() < 0.5
        thaw = self.rng.uniform(0, THAW_SOON_S) if soon else self.rng.uniform(THAW_SOON_S, THAW_AFTER_S)
        by = f"soak-fault-{len(self.applied) + 1}"
        survivors = self._survivors(name)
        proc = self.cluster.workers[name]
        proc.popen.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        commands: list[tuple] = []
        returned: dict[str, float] = {}
        waves = []
        try:
            lapsed, waiting = self._lapsed_leases(name, self.run_lease_s + CONFIRM_WAIT_S)
            waves.append(len(lapsed))
            first = self._confirm_wave(lapsed, by, commands, returned, frozen)
            if waiting:
                lapsed, waiting = self._lapsed_leases(name, CONFIRM_WAIT_S, every=True,
                                                      skip={c[0] for c in commands})
                waves.append(len(lapsed))
                first = self._confirm_wave(lapsed, by, commands, returned, frozen) or first
            while first is not None and time.monotonic() < first + thaw:
                time.sleep(0.01)
        finally:
            proc.popen.send_signal(signal.SIGCONT)
        thawed = time.monotonic() - frozen
        answers = Counter()
        for run_id, attempt_id, generation, popen, at in commands:
            try:
                out, err = popen.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                popen.kill()
                out, err = popen.communicate()
            returned.setdefault(run_id, time.monotonic() - frozen)
            answer = confirm_answer(popen.returncode, out, err)
            answers[answer["result"]] += 1
            self.confirmations.append(dict(
                answer, run_id=run_id, attempt_id=answer["attempt_id"] or attempt_id,
                lease_generation=answer["lease_generation"] or generation, seen_generation=generation,
                by=by, worker=name, started_at_ms=at, returned_after_s=round(returned[run_id], 2),
                thawed_after_s=round(thawed, 2)))
        said = ", ".join(f"{k} {v}" for k, v in sorted(answers.items())) or "none"
        return name, (f"{survivors}; stopped {thawed:.1f} s; {len(commands)} lapsed leases confirmed by {by} in "
                      f"waves of {'+'.join(map(str, waves))} ({said}; {waiting} never lapsed); answered "
                      f"{min(returned.values(), default=0):.1f}-{max(returned.values(), default=0):.1f} s into the "
                      f"freeze; thawed {thaw:.2f} s after the last wave's first word was recorded")

    def _confirm_wave(self, lapsed: list[tuple[str, str, int]], by: str, commands: list, returned: dict,
                      frozen: float) -> float | None:
        """Start `confirm-stopped` for each lapsed lease together; when the first word of them
        was recorded (monotonic time: seen in the database, polled every 10 ms, or a command's
        answer, whichever came first), None when there were none. Each answer's time since
        `frozen` goes into `returned`."""
        import psycopg
        from cluster_harness import QLACTORS

        wave = []
        for run_id, attempt_id, generation in lapsed:
            popen = subprocess.Popen([*QLACTORS, "--config", str(self.cluster.cli_config), "confirm-stopped",
                                      run_id, "--by", by], cwd=self.cluster.root, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
            wave.append((run_id, attempt_id, generation, popen, now_ms()))
        commands.extend(wave)
        if not wave:
            return None
        ids = [w[1] for w in wave]
        query = ("SELECT count(*) FROM run_attempts WHERE id = ANY(%s) AND evidence = 'confirmed_stopped' "
                 "AND evidence_by = %s")
        conn = None
        try:
            conn = psycopg.connect(self.cluster.database_url.replace("+psycopg", ""), autocommit=True,
                                   connect_timeout=5)
        except psycopg.Error:
            pass  # the database restarting: the commands' answers tell
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                for run_id, _a, _g, popen, _at in wave:
                    if popen.poll() is not None:
                        returned[run_id] = time.monotonic() - frozen
                        return time.monotonic()
                try:
                    if conn is not None and conn.execute(query, (ids, by)).fetchone()[0]:
                        return time.monotonic()
                except psycopg.Error:
                    conn = None
                time.sleep(0.01)
            return None
        finally:
            if conn is not None:
                conn.close()

    def _lapsed_leases(self, name: str, within_s: float, *, every: bool = False,
                       skip: set[str] = frozenset()) -> tuple[list[tuple[str, str, int]], int]:
        """Once the first (`every`: the last) of the worker's live run leases, those of the runs
        in `skip` left out, has lapsed (database time; at most `within_s`), the (run, attempt,
        lease generation) of those lapsed, and how many not yet."""
        query = ("SELECT a.run_id, a.id, l.lease_generation, l.expires_at_ms <= "
                 "(extract(epoch from clock_timestamp()) * 1000)::bigint FROM run_dispatch_leases l "
                 "JOIN run_attempts a ON a.id = l.attempt_id AND a.lease_generation = l.lease_generation "
                 "JOIN runs r ON r.id = a.run_id WHERE l.worker_id = %s AND l.status = 'leased' "
                 "AND a.status IN ('starting', 'running') AND r.status IN ('dispatching', 'running') "
                 "ORDER BY a.run_id")
        deadline = time.monotonic() + within_s
        rows: list = []
        while time.monotonic() < deadline:
            try:
                rows = self.cluster.sql(query, name)
            except Exception:  # the database restarting: look again
                rows = []
            rows = [r for r in rows if r[0] not in skip]
            if all(r[3] for r in rows) if every else any(r[3] for r in rows):
                break
            time.sleep(0.2)
        lapsed = [(r[0], r[1], r[2]) for r in rows if r[3]]
        return lapsed, len(rows) - len(lapsed)

    def _freeze_worker(self, seconds: float) -> tuple[str, str]:
        name = self._worker()
        self._freeze(self.cluster.workers[name], seconds)
        return name, f"stopped {seconds:.1f} s"

    def restart_worker(self, name: str) -> Proc:
        before = self._sessions_opened(name)
        proc = self.cluster.start_worker(name, slots=self.slots)
        wait_until(lambda: self._sessions_opened(name) > before or not proc.alive(), 90,
                   f"worker {name} to open a session again")
        assert proc.alive(), proc.log()[-3000:]
        return proc

    def _sessions_opened(self, name: str) -> int:
        needle = f"event=session_open worker={name} "
        return sum(p.read_text(errors="replace").count(needle) for p in self.cluster.root.glob("control-*.log"))

    # -- replicas -----------------------------------------------------------------------------

    def _replica(self) -> Proc:
        return self.rng.choice(self.cluster.replicas)

    def replica_kill(self) -> tuple[str, str]:
        proc = self._replica()
        self.cluster.stop(proc, signal.SIGKILL)
        down = self.rng.uniform(1, 5)
        time.sleep(down)
        self.restart_replica(proc)
        return proc.name, f"down {down:.1f} s"

    def replica_freeze(self) -> tuple[str, str]:
        proc = self._replica()
        seconds = self.rng.uniform(2, FREEZE_MAX_S)
        index = self.cluster.ports.index(int(proc.name.split("-", 1)[1]))  # the proxies' order
        how = self._at_next_offers(index, [lambda: proc.popen.send_signal(signal.SIGSTOP)])
        try:
            time.sleep(seconds)
        finally:
            proc.popen.send_signal(signal.SIGCONT)
        return proc.name, f"stopped {seconds:.1f} s ({how})"

    def replica_delay(self) -> tuple[str, str]:
        """Every worker's traffic to one replica (worker -> replica only) held back 3-12 s
        by its proxy for 5-15 s, then let through again; returns once what was held is out."""
        from tcp_proxy import UP

        index = self.rng.randrange(len(self.cluster.ports))
        delay, held = self.rng.uniform(*DELAY_S), self.rng.uniform(*DELAY_HELD_S)
        paths = [p[index] for p in self.proxies.values()]
        how = self._at_next_offers(index, [lambda p=p: p.set_delay(UP, delay) for p in paths])
        try:
            time.sleep(held)
        finally:
            for proxy in paths:
                proxy.set_delay(UP, 0)
        wait_until(lambda: all(p.held(UP) == 0 for p in paths), delay + 30, "the delayed bytes through")
        return (f"control-{self.cluster.ports[index]}",
                f"worker->replica delayed {delay:.1f} s for {held:.1f} s ({how})")

    def _at_next_offers(self, index: int, actions: list) -> str:
        """Run every action once, together, when replica `index`'s next Offers frame passes on
        any worker's path to it (in that proxy's thread, before the worker has it), or after
        OFFERS_WAIT_S; which of the two it was."""
        from tcp_proxy import DOWN

        fired = threading.Event()
        lock = threading.Lock()

        def fire() -> None:
            with lock:
                if not fired.is_set():
                    fired.set()
                    for action in actions:
                        action()

        for paths in self.proxies.values():
            paths[index].when(DOWN, OFFERS_MIN_BYTES, fire)  # a trigger left armed fires nothing
        if fired.wait(OFFERS_WAIT_S):
            return "from an Offers"
        fire()
        return "none offered"

    def restart_replica(self, old: Proc) -> Proc:
        """Start the replica on its own port again (its log is appended to: only what it writes
        from now on tells it started)."""
        port = int(old.name.split("-", 1)[1])
        self.cluster.replicas.remove(old)
        offset = old.log_path.stat().st_size if old.log_path.exists() else 0
        proc = self.cluster._spawn(old.name, ["control", "--config", str(self.cluster.root / f"control-{port}.toml")])
        self.cluster.replicas.append(proc)
        wait_until(lambda: "event=control_started" in proc.log()[offset:] or not proc.alive(), 90,
                   f"replica {port} to start again")
        assert proc.alive(), proc.log()[-3000:]
        return proc

    # -- the database -------------------------------------------------------------------------

    def postgres_restart(self) -> tuple[str, str]:
        self.pg.stop()
        down = self.rng.uniform(1, 4)
        time.sleep(down)
        self.pg.start()
        return f"postgres:{self.pg.port}", f"down {down:.1f} s"

    # -- helpers ------------------------------------------------------------------------------

    @staticmethod
    def _freeze(proc: Proc, seconds: float) -> None:
        proc.popen.send_signal(signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            proc.popen.send_signal(signal.SIGCONT)

    def ensure_all_up(self) -> list[str]:
        """Anything found dead (it should not be: each fault undoes itself) is started again;
        returns what was."""
        restarted = []
        for proc in list(self.cluster.replicas):
            if not proc.alive():
                restarted.append(proc.name)
                self.restart_replica(proc)
        for name, proc in list(self.cluster.workers.items()):
            if not proc.alive():
                restarted.append(proc.name)
                self.restart_worker(name)
        return restarted
