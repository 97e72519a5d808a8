"""A real cluster on 127.0.0.1 for tests: a fresh PostgreSQL database, real CURVE keys, control
replicas and workers as real `qlactors control` / `qlactors worker` processes on ports they pick,
each stopped by its PID; the CLI is driven as a user would (`--config control.toml`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from actor_harness import wait_until
from wire_harness import free_port
from conftest import PG_URL, _pg_admin_conninfo, _require_postgres

QLACTORS = [sys.executable, "-m", "qlactors"]
TERMINAL = {"succeeded", "failed", "cancelled", "timed_out"}


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass
class Cluster:
    root: Path
    database_url: str
    admin_db: str
    timings: dict = field(default_factory=dict)
    admin_conninfo: str = field(default_factory=_pg_admin_conninfo)  # the server's, to drop the database
    replicas: list[Proc] = field(default_factory=list)
    workers: dict[str, Proc] = field(default_factory=dict)
    ports: list[int] = field(default_factory=list)
    # worker name -> the ports it reaches the replicas by, in the replicas' order (e.g. the
    # ports of a TcpProxy each, tests/harness/tcp_proxy.py); a worker not named reaches them directly.
    worker_ports: dict[str, list[int]] = field(default_factory=dict)
    proxies: list = field(default_factory=list)  # TcpProxy objects `close` closes

    # -- configuration ------------------------------------------------------------------------

    @property
    def keys(self) -> Path:
        return self.root / "keys"

    def control_config(self, port: int) -> Path:
        path = self.root / f"control-{port}.toml"
        t = self.timings
        path.write_text(
            'profile = "control"\n[database]\n'
            f'url = "{self.database_url}"\n'
            f"lock_timeout_ms = {t['db_timeout_ms']}\nstatement_timeout_ms = {t['db_timeout_ms']}\n"
            f"idle_in_transaction_session_timeout_ms = {t['db_timeout_ms']}\n"
            "[control]\n"
            f'bind = "tcp://127.0.0.1:{port}"\nkey = "keys/control.key_secret"\n'
            f"heartbeat_ms = {t['heartbeat_ms']}\nsession_lease_ms = {t['session_lease_ms']}\n"
            f"run_lease_ms = {t['run_lease_ms']}\nrecovery_grace_ms = {t['recovery_grace_ms']}\n"
            f"cadence_tick_ms = {t['cadence_tick_ms']}\n")
        return path

    @property
    def cli_config(self) -> Path:
        """The config the CLI is given (any replica's: they share the database)."""
        return self.root / f"control-{self.ports[0]}.toml"

    def worker_config(self, name: str, *, slots: int, labels: tuple[str, ...], extra: str = "") -> Path:
        path = self.root / f"{name}.toml"
        ports = self.worker_ports.get(name, self.ports)
        endpoints = ", ".join(f'"tcp://127.0.0.1:{p}"' for p in ports)
        (self.root / f"state-{name}").mkdir(exist_ok=True)
        path.write_text(
            'profile = "worker"\n[worker]\n'
            f"control = [{endpoints}]\nserver_key = \"keys/control.key\"\nkey = \"keys/{name}.key_secret\"\n"
            f"slots = {slots}\nlabels = {json.dumps(list(labels))}\nstate_dir = \"state-{name}\"\n"
            f"request_timeout_ms = {self.timings['request_timeout_ms']}\n{extra}")
        return path

    # -- commands -----------------------------------------------------------------------------

    def cli(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        done = subprocess.run([*QLACTORS, "--config", str(self.cli_config), *args], cwd=self.root,
                              capture_output=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"qlactors {' '.join(args)} exited {done.returncode}: "
                                 f"{done.stderr.decode(errors='replace')}")
        return done

    def cli_json(self, *args: str) -> object:
        return json.loads(self.cli(*args, "--json").stdout)

    def new_key(self, name: str) -> None:
        subprocess.run([*QLACTORS, "keys", "new", name, "--dir", str(self.keys)], check=True,
                       capture_output=True, timeout=30)

    def allow(self, name: str) -> None:
        self.cli("worker", "allow", name, str(self.keys / f"{name}.key"))

    # -- processes ----------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str]) -> Proc:
        log_path = self.root / f"{name}.log"
        out = open(log_path, "ab")
        popen = subprocess.Popen([*QLACTORS, *args], cwd=self.root, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        out.close()
        return Proc(name, popen, log_path)

    def start_replica(self, port: int) -> Proc:
        proc = self._spawn(f"control-{port}", ["control", "--config", str(self.root / f"control-{port}.toml")])
        self.replicas.append(proc)
        wait_until(lambda: "event=control_started" in proc.log() or not proc.alive(), 60,
                 f"replica on {port} to start")
        assert proc.alive(), proc.log()
        return proc

    def start_worker(self, name: str, *, slots: int = 4, labels: tuple[str, ...] = (), extra: str = "") -> Proc:
        config = self.worker_config(name, slots=slots, labels=labels, extra=extra)
        proc = self._spawn(f"worker-{name}", ["worker", "--config", str(config)])
        self.workers[name] = proc
        wait_until(lambda: "event=session_open" in "".join(r.log() for r in self.replicas) and
                 _online(self, name) or not proc.alive(), 60, f"worker {name} to register")
        assert proc.alive(), proc.log()
        return proc

    def route_through_proxies(self, name: str) -> list:
        """Worker `name` reaches each replica through a TcpProxy of its own (one per replica, in
        the replicas' order), so a test can hold one direction of one path back; call it before
        `start_worker`. The proxies, which `close` closes."""
        from tcp_proxy import TcpProxy

        proxies = [TcpProxy(port) for port in self.ports]
        self.proxies.extend(proxies)
        self.worker_ports[name] = [p.port for p in proxies]
        return proxies

    def stop(self, proc: Proc, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        if proc.alive():
            proc.popen.send_signal(sig)
            try:
                return proc.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
        return proc.popen.wait(10)

    def close(self) -> None:
        """Stop every process this cluster started, by its PID, whatever fails on the way; then
        the jobs the workers left, then the database."""
        try:
            for proc in [*self.workers.values(), *self.replicas]:
                try:
                    self.stop(proc)
                except BaseException:
                    proc.popen.kill()
                    proc.popen.wait(10)
            self._kill_leftover_jobs()
        finally:
            for proxy in self.proxies:
                proxy.close()
            with psycopg.connect(self.admin_conninfo, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.admin_db}" WITH (FORCE)')

    def _kill_leftover_jobs(self) -> None:
        """Jobs run in their own sessions (they outlive a worker by design): stop any left, by
        their process group, only while its leader is still the journal's process (same pid and
        start ticks): a journal keeps the ids of jobs long ended, and the machine reuses them (a
        stale id once SIGKILLed the soak's PostgreSQL WAL writer)."""
        import sqlite3

        for name in self.workers:
            journal = self.root / f"state-{name}" / "journal.sqlite"
            if not journal.exists():
                continue
            try:
                conn = sqlite3.connect(journal)
                try:
                    rows = conn.execute("SELECT pid, pgid, start_ticks FROM executor_journal "
                                        "WHERE pgid IS NOT NULL").fetchall()
                finally:
                    conn.close()
            except sqlite3.Error:
                continue
            for pid, pgid, start_ticks in rows:
                if pid != pgid or start_ticks is None or _start_ticks(pgid) != start_ticks:
                    continue  # not the journal's process (ended, its id reused), or not known to be
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    # -- observing ----------------------------------------------------------------------------

    def show(self, run_id: str) -> dict:
        return self.cli_json("show", run_id)

    def sql(self, query: str, *args) -> list[tuple]:
        """Read the cluster database directly (a test's view; the CLI is what users run)."""
        with psycopg.connect(self.database_url.replace("+psycopg", "")) as conn:
            return conn.execute(query, args).fetchall()

    def wait_terminal(self, run_ids: list[str], timeout: float) -> dict[str, dict]:
        """Every run's final state, polled from the database."""
        deadline = time.monotonic() + timeout
        pending = set(run_ids)
        states: dict[str, dict] = {}
        while pending and time.monotonic() < deadline:
            for run_id, status in self.sql("SELECT id, status FROM runs WHERE id = ANY(%s)", list(pending)):
                if status in TERMINAL:
                    states[run_id] = {"id": run_id, "state": status}
                    pending.discard(run_id)
            if pending:
                time.sleep(0.3)
        if pending:
            logs = "\n".join(f"--- {p.name}\n{p.log()[-3000:]}" for p in [*self.replicas, *self.workers.values()])
            raise AssertionError(f"{len(pending)} runs not terminal after {timeout:g} s\n{logs}")
        return states


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": field 3 on
    return int(fields[19])


def _online(cluster: Cluster, name: str) -> bool:
    try:
        workers = cluster.cli_json("workers")
    except (AssertionError, ValueError):
        return False
    return any(w.get("worker_id") == name and w.get("status") == "online" for w in workers)


DEFAULT_TIMINGS = dict(heartbeat_ms=1_000, session_lease_ms=5_000, run_lease_ms=3_000,
                       recovery_grace_ms=40_000, cadence_tick_ms=200, db_timeout_ms=800,
                       request_timeout_ms=1_500)


def make_cluster(tmp_path: Path, *, replicas: int = 1, timings: dict | None = None,
                 admin_url: str | None = None) -> Cluster:
    """A fresh database and keys; `replicas` control replicas started (workers: `start_worker`).
    The database is made on the server of `admin_url` (a SQLAlchemy URL of its admin database,
    e.g. `private_pg.url()`), by default the shared one of `$QLACTORS_TEST_PG_URL`."""
    if admin_url is None:
        _require_postgres()
        admin_url = PG_URL
    admin_conninfo = admin_url.replace("postgresql+psycopg://", "postgresql://", 1)
    name = f"qlt_cluster_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = admin_url.split("?", 1)[0].rsplit("/", 1)[0]
    cluster = Cluster(root=tmp_path, database_url=f"{base}/{name}", admin_db=name,
                      timings={**DEFAULT_TIMINGS, **(timings or {})}, admin_conninfo=admin_conninfo)
    cluster.keys.mkdir()
    cluster.new_key("control")
    cluster.ports = [free_port() for _ in range(replicas)]
    for port in cluster.ports:
        cluster.control_config(port)
    try:
        for port in cluster.ports:
            cluster.start_replica(port)
    except BaseException:
        cluster.close()
        raise
    return cluster
