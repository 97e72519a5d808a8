"""A private PostgreSQL server for tests that restart, kill or freeze the database (never the
machine's shared one): `initdb` into a fresh directory owned by the `postgres` OS user, a
postmaster run as that user on a free 127.0.0.1 port, its unix socket inside that directory,
trust auth, fsync off. Every process is signalled by its PID (the postmaster's, or its own
process group, which `start_new_session` makes the postmaster's PID: the backends are separate
processes in that group)."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

BIN = Path("/usr/lib/postgresql/15/bin")
OS_USER = "postgres"


def available() -> str | None:
    """None when a private server can be made here, otherwise why not."""
    if os.geteuid() != 0:
        return "a private PostgreSQL needs root (to run initdb and postgres as the postgres user)"
    if not (BIN / "initdb").exists():
        return f"no PostgreSQL 15 binaries under {BIN}"
    try:
        pwd.getpwnam(OS_USER)
    except KeyError:
        return f"no {OS_USER!r} OS user"
    return None


def _free_port() -> int:
    from wire_harness import free_port

    return free_port()


class PrivatePostgres:
    """One server: `start()` after construction, `close()` at the end (stops it, removes it)."""

    def __init__(self) -> None:
        # Not pytest's tmp_path: /tmp/pytest-of-root is 0700 root, the postgres user can't enter it.
        self.dir = Path(tempfile.mkdtemp(prefix="qlt-pg-", dir="/tmp"))
        user = pwd.getpwnam(OS_USER)
        os.chown(self.dir, user.pw_uid, user.pw_gid)
        self.data = self.dir / "data"
        self.log_path = self.dir / "postgres.log"
        self.port = _free_port()
        self.popen: subprocess.Popen | None = None
        self.frozen = False
        subprocess.run([str(BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                        "-E", "UTF8", "--no-sync", "--no-instructions"],
                       user=OS_USER, cwd=self.dir, check=True, capture_output=True, timeout=120)

    # -- addresses ----------------------------------------------------------------------------

    def conninfo(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def url(self, dbname: str = "postgres") -> str:
        """The SQLAlchemy URL qlactors' configs take."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.conninfo(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    # -- the postmaster -----------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None and self.popen.poll() is None else None

    def start(self, timeout: float = 60) -> None:
        """Start it on its port (the same one on a restart) and wait until it takes connections."""
        assert self.pid is None, "already running"
        log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(
            [str(BIN / "postgres"), "-D", str(self.data), "-p", str(self.port), "-k", str(self.dir),
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
             "-c", "full_page_writes=off", "-c", "max_connections=200"],
            user=OS_USER, cwd=self.dir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.popen.poll() is not None:
                raise RuntimeError(f"postgres exited {self.popen.returncode}:\n{self.log()[-3000:]}")
            try:
                psycopg.connect(self.conninfo(), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"postgres not accepting connections after {timeout:g} s:\n"
                                       f"{self.log()[-3000:]}")
                time.sleep(0.1)

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30) -> None:
        """A shutdown by the postmaster's PID (SIGINT: fast, SIGTERM: smart), waited for; one that
        does not end in time is killed. Backends end with it."""
        if self.popen is None:
            return
        if self.frozen:
            self.thaw()
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill9()
        self._wait_group_gone()

    def kill9(self) -> None:
        """SIGKILL the postmaster and every backend (its process group, whose id is its PID): a
        postmaster killed alone leaves backends that hold the shared memory and block a restart."""
        if self.popen is None:
            return
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(30)
        self.frozen = False
        self._wait_group_gone()

    def restart(self, sig: int = signal.SIGINT) -> None:
        self.stop(sig)
        self.start()

    def freeze(self) -> None:
        """SIGSTOP the postmaster and its backends (each backend is its own process: stopping only
        the postmaster would leave open connections answering)."""
        assert self.pid is not None, "not running"
        os.killpg(self.popen.pid, signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        if self.popen is not None:
            try:
                os.killpg(self.popen.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.frozen = False

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _wait_group_gone(self, timeout: float = 30) -> None:
        """Until no process of the server's group is left (backends exit after the postmaster)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.killpg(self.popen.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
        os.killpg(self.popen.pid, signal.SIGKILL)
