"""A real qlactors cluster on 127.0.0.1 for the cluster benchmarks, and what they read about it.

A fresh PostgreSQL database per cluster (dropped at the end), CURVE keys from `qlactors keys
new`, the allow-list through `qlactors worker allow`, replicas as `qlactors control --config` and
workers as `qlactors worker --config` processes, each stopped by its own pid. Each replica's
connections carry `application_name=qlbench-<replica>`, so its PostgreSQL backends are found
in `pg_stat_activity`; the CLI and the benchmark itself connect under other names.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import _common as c

PG_URL = os.environ.get("QLBENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def libpq(url: str) -> str:
    """A SQLAlchemy psycopg URL as a libpq conninfo URL."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def with_app_name(url: str, name: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}application_name={name}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- fresh databases --------------------------------------------------------------------------

_DATABASES: list[str] = []


def create_database(prefix: str, template: str | None = None) -> str:
    """A fresh database on the benchmark's PostgreSQL server; its SQLAlchemy URL. Dropped at exit.

    `template`: the URL of a database to copy (nothing may be connected to it meanwhile)."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    copy = "" if template is None else f' TEMPLATE "{template.rsplit("/", 1)[1].split("?", 1)[0]}"'
    with psycopg.connect(libpq(PG_URL), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"{copy}')
    _DATABASES.append(name)
    return f"{PG_URL.rsplit('/', 1)[0]}/{name}"


def drop_databases() -> None:
    import psycopg

    while _DATABASES:
        name = _DATABASES.pop()
        try:
            with psycopg.connect(libpq(PG_URL), autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except Exception as err:  # reported, never fatal: the figures are already printed
            print(f"warning: could not drop database {name}: {err}")


# -- PostgreSQL backends' CPU -----------------------------------------------------------------

class Backends:
    """CPU of the PostgreSQL backends serving `application_name`s, from /proc/<pid>/stat.

    `sample()` reads `pg_stat_activity` and each backend's utime+stime, and keeps the latest
    figure per pid, so a backend that ends between samples keeps what it had used when last
    seen (its CPU after that sample is missed). `delta()` is the CPU used since `start()`.
    """

    def __init__(self, database_url: str, app_names: list[str]) -> None:
        self.conninfo = libpq(with_app_name(database_url.rsplit("/", 1)[0] + "/postgres", "qlbench-probe"))
        self.app_names = app_names
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.names: dict[int, str] = {}

    def pids(self) -> dict[int, str]:
        import psycopg

        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            rows = conn.execute("SELECT pid, application_name FROM pg_stat_activity "
                                "WHERE application_name = ANY(%s)", (self.app_names,)).fetchall()
        return dict(rows)

    def sample(self) -> None:
        for pid, name in self.pids().items():
            try:
                cpu = c.cpu_seconds(pid)
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
            self.names[pid] = name
            self.last[pid] = cpu

    def start(self) -> None:
        self.last.clear()
        self.sample()
        self.first = dict(self.last)

    def delta(self, app_name: str | None = None) -> float:
        """CPU seconds since start(); a backend first seen later began during the run: all of it."""
        return sum(self.last[pid] - self.first.get(pid, 0.0) for pid in self.last
                   if app_name is None or self.names[pid] == app_name)

    def count(self, app_name: str | None = None) -> int:
        return sum(1 for pid in self.last if app_name is None or self.names[pid] == app_name)


class Sampler:
    """Calls `fn` every `every_s` on a thread while the `with` block runs (errors are counted)."""

    def __init__(self, fn, every_s: float = 0.5) -> None:
        self.fn, self.every_s = fn, every_s
        self.stopped = threading.Event()
        self.errors = 0
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stopped.wait(self.every_s):
            try:
                self.fn()
            except Exception:
                self.errors += 1

    def __enter__(self) -> "Sampler":
        self.thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.stopped.set()
        self.thread.join(10)


def create_scratch(prefix: str, keep: bool = False) -> Path:
    """A fresh directory under $TMPDIR, removed at exit (with the other temporary homes) unless kept."""
    root = Path(tempfile.mkdtemp(prefix=f"qlbench-{prefix}-"))
    if not keep:
        c._TEMP_DIRS.append(root)
    return root


def xact_commits(database_url: str) -> int:
    """`pg_stat_database.xact_commit` of the database (the server flushes it within ~1 s)."""
    import psycopg

    name = database_url.rsplit("/", 1)[1].split("?", 1)[0]
    with psycopg.connect(libpq(with_app_name(PG_URL, "qlbench-probe")), autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return int(conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s",
                                (name,)).fetchone()[0])


# -- the cluster ------------------------------------------------------------------------------

@dataclass
class Node:
    name: str
    proc: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Cluster:
    root: Path
    database_url: str
    heartbeat_ms: int = 1_000
    cadence_tick_ms: int = 1_000
    control_extra: dict[str, int] = field(default_factory=dict)
    """More `[control]` knobs (session_lease_ms, run_lease_ms, recovery_grace_ms, ...)."""
    ports: list[int] = field(default_factory=list)
    replicas: list[Node] = field(default_factory=list)
    workers: list[Node] = field(default_factory=list)

    @property
    def keys(self) -> Path:
        return self.root / "keys"

    def replica_name(self, i: int) -> str:
        return f"qlbench-r{i}"

    def _control_config(self, name: str, port: int, url: str) -> Path:
        path = self.root / f"{name}.toml"
        db_ms = self.heartbeat_ms * 4 // 5
        path.write_text(
            f'profile = "control"\n[database]\nurl = "{url}"\npool_size = 8\n'
            # below the heartbeat, as a replica requires (SEMANTICS.md §9 Transport)
            f"lock_timeout_ms = {db_ms}\nstatement_timeout_ms = {db_ms}\n"
            f"idle_in_transaction_session_timeout_ms = {db_ms}\n"
            "[control]\n"
            f'bind = "tcp://127.0.0.1:{port}"\nkey = "keys/control.key_secret"\n'
            f"heartbeat_ms = {self.heartbeat_ms}\ncadence_tick_ms = {self.cadence_tick_ms}\n"
            "retention_max_runs = 1000000\n"
            + "".join(f"{key} = {value}\n" for key, value in self.control_extra.items()))
        return path

    @property
    def cli_config(self) -> Path:
        return self.root / "cli.toml"

    def setup(self, replicas: int) -> None:
        self.keys.mkdir(parents=True)
        self.new_key("control")
        self.ports = [free_port() for _ in range(replicas)]
        self._control_config("cli", self.ports[0], with_app_name(self.database_url, "qlbench-cli"))
        for i, port in enumerate(self.ports):
            self._control_config(self.replica_name(i), port, with_app_name(self.database_url, self.replica_name(i)))

    def cli(self, *args: str, timeout: float = 60) -> str:
        done = subprocess.run([*c.qlactors_argv(), "--config", str(self.cli_config), *args], cwd=self.root,
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"qlactors {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def new_key(self, name: str) -> None:
        done = subprocess.run([*c.qlactors_argv(), "keys", "new", name, "--dir", str(self.keys)],
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"qlactors keys new {name} exited {done.returncode}: {done.stderr.strip()[-300:]}")

    def allow(self, name: str) -> None:
        self.cli("worker", "allow", name, str(self.keys / f"{name}.key"))

    def _spawn(self, name: str, argv: list[str], env: dict | None = None) -> Node:
        log_path = self.root / f"{name}.log"
        with open(log_path, "ab") as out:
            proc = subprocess.Popen([*c.qlactors_argv(), *argv], cwd=self.root, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        c.track(proc)
        return Node(name, proc, log_path)

    def start_replica(self, i: int, *, count_sql: Path | None = None, timeout: float = 60) -> Node:
        env = dict(os.environ)
        if count_sql is not None:
            env["QLACTORS_COUNT_SQL"] = str(count_sql)
        name = self.replica_name(i)
        node = self._spawn(name, ["control", "--config", str(self.root / f"{name}.toml")], env)
        self.replicas.append(node)
        c.wait_until(lambda: "event=control_started" in node.log() or not node.alive(), timeout,
                     poll=0.1, what=f"replica {name} to start")
        if not node.alive():
            raise RuntimeError(f"replica {name} exited:\n{node.log()[-3000:]}")
        return node

    def start_worker(self, name: str, *, slots: int, timeout: float = 60) -> Node:
        state = self.root / f"state-{name}"
        state.mkdir()
        endpoints = ", ".join(f'"tcp://127.0.0.1:{p}"' for p in self.ports)
        config = self.root / f"{name}.toml"
        config.write_text(
            f'profile = "worker"\n[worker]\ncontrol = [{endpoints}]\nserver_key = "keys/control.key"\n'
            f'key = "keys/{name}.key_secret"\nslots = {slots}\nstate_dir = "state-{name}"\n')
        self.new_key(name)
        self.allow(name)
        node = self._spawn(f"worker-{name}", ["worker", "--config", str(config)])
        self.workers.append(node)
        c.wait_until(lambda: self.online(name) or not node.alive(), timeout, poll=0.2,
                     what=f"worker {name} online")
        if not node.alive():
            raise RuntimeError(f"worker {name} exited:\n{node.log()[-3000:]}")
        return node

    def online(self, name: str) -> bool:
        try:
            workers = json.loads(self.cli("workers", "--json"))
        except (RuntimeError, ValueError):
            return False
        return any(w.get("worker_id") == name and w.get("status") == "online" for w in workers)

    def stop(self, node: Node, timeout: float = 20) -> int | None:
        """SIGTERM by pid, then SIGKILL by pid."""
        if node.alive():
            node.proc.send_signal(signal.SIGTERM)
            try:
                node.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait(10)
        c.untrack(node.proc)
        return node.proc.returncode

    def kill_host(self, node: Node, worker_id: str) -> int:
        """The host dies: SIGKILL every process group of the worker's `starting|running` attempts
        (`run_attempts.pgid`), then the worker, by pid. Returns how many groups were killed."""
        import psycopg

        with psycopg.connect(libpq(with_app_name(self.database_url, "qlbench-probe")), autocommit=True) as conn:
            pgids = [row[0] for row in conn.execute(
                "SELECT pgid FROM run_attempts WHERE worker_id = %s AND status IN ('starting', 'running') "
                "AND pgid IS NOT NULL", (worker_id,)).fetchall()]
        killed = 0
        for pgid in pgids:
            try:
                os.killpg(pgid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        node.proc.kill()
        node.proc.wait(10)
        c.untrack(node.proc)
        return killed

    def kill_jobs_left(self, worker_ids: list[str]) -> None:
        """Jobs run in their own sessions and outlive their worker by design: SIGKILL, by process
        group, those of these (real) workers the database still shows `starting|running`."""
        import psycopg

        try:
            with psycopg.connect(libpq(with_app_name(self.database_url, "qlbench-probe")),
                                 autocommit=True) as conn:
                pgids = [row[0] for row in conn.execute(
                    "SELECT DISTINCT pgid FROM run_attempts WHERE status IN ('starting', 'running') "
                    "AND pgid IS NOT NULL AND worker_id = ANY(%s)", (worker_ids,)).fetchall()]
        except Exception:
            return
        for pgid in pgids:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def close(self) -> None:
        for node in [*self.workers, *self.replicas]:
            self.stop(node)

    def logs_tail(self, chars: int = 2000) -> str:
        return "\n".join(f"--- {n.name}\n{n.log()[-chars:]}" for n in [*self.replicas, *self.workers])


def run_counts(database_url: str) -> dict[str, int]:
    """Runs per status in the cluster database (one short read, as the benchmark's own client)."""
    import psycopg

    with psycopg.connect(libpq(with_app_name(database_url, "qlbench-probe")), autocommit=True) as conn:
        return dict(conn.execute("SELECT status, COUNT(*) FROM runs GROUP BY status").fetchall())


def request_runs(database_url: str, task: str, count: int) -> float:
    """`count` runs of `task`, each as `qlactors run` requests it (Repository.runs.request);
    returns the seconds it took. Runs in this process under application_name qlbench-client."""
    from qlactors.store.repository import Repository

    repo = Repository.open(with_app_name(database_url, "qlbench-client"))
    try:
        start = time.perf_counter()
        for _ in range(count):
            repo.runs.request(task)
        return time.perf_counter() - start
    finally:
        repo.close()


def cpu_or_zero(pid: int) -> float:
    try:
        return c.cpu_seconds(pid)
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
