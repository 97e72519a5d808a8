"""The command line against a migrated cluster database (real PostgreSQL): the `cluster` fixture and its
commands; shared by the cluster CLI tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import update

from qlactors.store.dispatch.dispatch import Dispatch
from qlactors.store.engine import Store
from qlactors.store.migrations import migrate
from qlactors.store.repository import Repository
from qlactors.store.schema import worker_sessions


_EXE = Path(sys.executable).parent / "qlactors"


QLACTORS = [str(_EXE)] if _EXE.exists() else [sys.executable, "-m", "qlactors"]


class Cluster:
    """A migrated cluster database, a control.toml naming it, and a way to run commands."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url, self.tmp = url, tmp
        self.repo = Repository(Store(url))
        migrate(self.repo.store)
        self.config = tmp / "control.toml"
        self.config.write_text(f'profile = "control"\n[database]\nurl = "{url}"\n')
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("QLACTORS_HOME", "XDG_DATA_HOME", "QLACTORS_DATABASE_URL")}
        self.env["QLACTORS_HOME"] = str(tmp / "edge-home")  # must stay untouched

    def ql(self, *args, env_url: bool = False, timeout: float = 60) -> subprocess.CompletedProcess:
        env = dict(self.env)
        argv = [*QLACTORS]
        if env_url:
            env["QLACTORS_DATABASE_URL"] = self.url
        else:
            argv += ["--config", str(self.config)]
        return subprocess.run([*argv, *map(str, args)], capture_output=True, text=True, env=env,
                              timeout=timeout)

    def ok(self, *args, **kw) -> subprocess.CompletedProcess:
        done = self.ql(*args, **kw)
        assert done.returncode == 0, (args, done.returncode, done.stdout, done.stderr)
        return done

    def session(self, worker_id: str, *, labels=(), capacity: int = 4, skew_ms: int | None = None):
        """An online session with a live lease, as a replica's Register and Heartbeat leave it."""
        session = Dispatch.open(self.repo.store).sessions.register(worker_id, capacity)
        with self.repo.store.write() as conn:
            now = self.repo.store.now_ms(conn)
            conn.execute(update(worker_sessions).where(worker_sessions.c.session_id == session.session_id)
                         .values(labels_json=json.dumps(list(labels)), lease_expires_at_ms=now + 45_000,
                                 clock_skew_ms=skew_ms))
        return session

    def close(self) -> None:
        self.repo.close()


@pytest.fixture
def cluster(pg_schema_url, tmp_path):
    c = Cluster(pg_schema_url, tmp_path)
    yield c
    c.close()
