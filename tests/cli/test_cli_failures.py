"""Expected failures end in one stderr line `qlactors: ...` and their documented exit status,
never a traceback: each failure docs/cli.md and docs/cluster.md name, run as a user would (a
real `qlactors` subprocess each)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qlactors.wire.curve_keys import new_key_pair

_EXE = Path(sys.executable).parent / "qlactors"
QLACTORS = [str(_EXE)] if _EXE.exists() else [sys.executable, "-m", "qlactors"]
# The `qlactors` command in an interpreter where `import psycopg` fails as if it were not installed.
WITHOUT_PSYCOPG = [sys.executable, "-c", "import sys; sys.modules['psycopg'] = None; "
                   "from qlactors.cli import entry; entry()"]
UNREACHABLE_PG = "postgresql+psycopg://qlactors@127.0.0.1:9/qlactors"  # port 9: nothing listens


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("QLACTORS_HOME", "XDG_DATA_HOME", "QLACTORS_DATABASE_URL")}
    return {**env, **extra}


def run(argv: list[str], *, cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          env=clean_env(QLACTORS_HOME=str(cwd / "home")) if env is None else env)


def assert_one_line(done: subprocess.CompletedProcess, status: int, words: str) -> None:
    """Exactly one stderr line, `qlactors: ...` with `words` in it, and exit `status`."""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("qlactors: "), done.stderr
    assert words in lines[0], lines[0]
    assert done.returncode == status, (done.returncode, done.stderr)


def control_toml(tmp_path: Path, url: str = UNREACHABLE_PG, bind: str = "tcp://127.0.0.1:5710") -> Path:
    new_key_pair(tmp_path / "keys", "control")
    path = tmp_path / "control.toml"
    path.write_text(f'profile = "control"\n[database]\nurl = "{url}"\n[control]\nbind = "{bind}"\n')
    return path


# -- the cluster profile without psycopg (issue 18 item 2) -----------------------------------

NEEDS_PSYCOPG = "the cluster profile needs psycopg: pip install 'qlactors[postgres]'"


@pytest.mark.parametrize("args", [
    ["control", "--config", "control.toml"],
    ["--config", "control.toml", "workers"],
    ["--config", "control.toml", "runs"],
], ids=["control", "workers", "runs"])
def test_without_psycopg_the_cluster_profile_says_what_to_install(tmp_path, args):
    control_toml(tmp_path)
    assert_one_line(run([*WITHOUT_PSYCOPG, *args], cwd=tmp_path), 2, NEEDS_PSYCOPG)
    assert not (tmp_path / "home").exists()


def test_without_psycopg_the_database_url_variable_says_what_to_install(tmp_path):
    env = clean_env(QLACTORS_HOME=str(tmp_path / "home"), QLACTORS_DATABASE_URL=UNREACHABLE_PG)
    assert_one_line(run([*WITHOUT_PSYCOPG, "workers"], cwd=tmp_path, env=env), 2, NEEDS_PSYCOPG)
    assert not (tmp_path / "home").exists()


# -- an unreachable database, and one that does not exist (issue 18 item 19) ------------------

@pytest.mark.parametrize("args", [["runs"], ["workers"], ["status"], ["show", "r1"]])
def test_a_read_only_command_on_an_unreachable_database_asks_whether_it_is_up(tmp_path, args):
    control_toml(tmp_path)
    done = run([*QLACTORS, "--config", "control.toml", *args], cwd=tmp_path)
    assert_one_line(done, 1, "is unavailable: connection failed")
    assert done.stderr.rstrip().endswith("is the database up? try again")
    assert "nothing was changed" not in done.stderr  # a read changes nothing whatever happens


@pytest.mark.postgres
@pytest.mark.parametrize("args", [["runs"], ["task", "add", "t", "--", "true"], ["control", "--config", "control.toml"]],
                         ids=["runs", "task-add", "control"])
def test_a_database_that_does_not_exist_is_named_with_how_to_create_it(tmp_path, args):
    from conftest import PG_URL, _require_postgres

    _require_postgres()
    missing = "qlt_never_created_" + tmp_path.name[-8:].replace("-", "_").lower()
    control_toml(tmp_path, url=PG_URL.split("?", 1)[0].rsplit("/", 1)[0] + "/" + missing)
    cli = args if args[0] == "control" else ["--config", "control.toml", *args]
    done = run([*QLACTORS, *cli], cwd=tmp_path)
    assert_one_line(done, 2, f"the database {missing} does not exist")
    assert f"create it (`createdb {missing}`" in done.stderr and "try again" not in done.stderr


# -- a worker without the replicas' public key (issue 18 item 15) -----------------------------

def test_a_missing_server_key_is_told_to_copy_the_replicas_key_not_to_make_a_pair(tmp_path):
    new_key_pair(tmp_path / "keys", "w1")
    (tmp_path / "w1.toml").write_text('profile = "worker"\n[worker]\nkey = "keys/w1.key_secret"\n')
    done = run([*QLACTORS, "worker", "--config", "w1.toml"], cwd=tmp_path)
    assert_one_line(done, 2, f"key file {tmp_path / 'keys' / 'control.key'} does not exist")
    assert "[worker] server_key is the control replicas' public key: copy their control.key" in done.stderr
    assert "make a pair" not in done.stderr
    assert not (tmp_path / "state").exists()


# -- cluster-only commands without a cluster database (issue 18 item 9) ------------------------

NO_CLUSTER = "no cluster database: pass --config control.toml or set QLACTORS_DATABASE_URL"


@pytest.mark.parametrize("args", [
    ["workers"], ["workers", "--json"], ["worker", "allow", "w1", "keys/w1.key"], ["worker", "revoke", "w1"],
    ["worker", "retire", "w1", "--confirm-stopped"], ["--config", "edge.toml", "workers"],
], ids=["workers", "workers-json", "allow", "revoke", "retire", "edge-config"])
def test_cluster_only_commands_without_a_cluster_database_are_refused_and_create_nothing(tmp_path, args):
    new_key_pair(tmp_path / "keys", "w1")
    (tmp_path / "edge.toml").write_text('profile = "edge"\n')
    assert_one_line(run([*QLACTORS, *args], cwd=tmp_path), 2, NO_CLUSTER)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edge.toml", "keys"]  # no home, no database


def test_edge_says_once_that_the_database_url_variable_is_ignored(home):
    edge = home.start_edge(env={"QLACTORS_DATABASE_URL": UNREACHABLE_PG})
    assert edge.terminate() == 0
    log = edge.log()
    warnings = [line for line in log.splitlines() if "QLACTORS_DATABASE_URL" in line]
    assert warnings == [f"qlactors: warning: $QLACTORS_DATABASE_URL is ignored: `qlactors edge` runs on the "
                        f"home {home.path} and its own database (a cluster's replicas run `qlactors control "
                        "--config control.toml`)"], log
    assert "event=edge_started" in log


# -- a replica whose bind address is in use (issue 18 item 8) ----------------------------------

def test_a_replica_whose_bind_is_in_use_says_so_in_one_line_before_it_opens_the_database(tmp_path):
    import socket

    with socket.socket() as listener:  # another replica, as far as the port goes
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        bind = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
        control_toml(tmp_path, bind=bind)  # its database is unreachable: it is never reached
        done = run([*QLACTORS, "control", "--config", "control.toml"], cwd=tmp_path)
    assert_one_line(done, 1, f"cannot bind {bind}: address already in use (another replica on this host?)")


# -- every failure docs/cli.md and docs/cluster.md document: one line, its exit status ---------
#
# Each case is refused before anything is written, so one world serves them all: an edge home
# with a task `t` and a queued run of it, key pairs, and configs. A case is (argv, exit status,
# words its one line holds); argv may name the world's paths as {home}, {keys}, {root}, {run}.

class World:
    def __init__(self, root: Path) -> None:
        self.root, self.home = root, root / "home"
        self.keys = root / "keys"
        new_key_pair(self.keys, "control")
        new_key_pair(self.keys, "w1")
        bad = new_key_pair(self.keys, "loose")[1]
        os.chmod(bad, 0o644)  # a secret key others may read
        (self.keys / "junk.key_secret").write_text("not a key\n")
        os.chmod(self.keys / "junk.key_secret", 0o600)
        self.write("control.toml", f'profile = "control"\n[database]\nurl = "{UNREACHABLE_PG}"\n'
                                   '[control]\nbind = "tcp://127.0.0.1:1"\nkey = "keys/control.key_secret"\n')
        self.write("worker.toml", 'profile = "worker"\n[worker]\ncontrol = ["tcp://127.0.0.1:9"]\n'
                                  'key = "keys/w1.key_secret"\nstate_dir = "state"\n')
        (root / "state").mkdir()
        self.run = self.ok("--home", self.home, "task", "add", "t", "--", "true") and \
            self.ok("--home", self.home, "run", "t").stdout.strip()
        self.retired = self._retired_run()
        self._unusable_homes()

    def _retired_run(self) -> str:
        """A finished run of `t` that retention has retired (its tombstone is left)."""
        import time

        from qlactors.executor.edge_files import EdgeFiles
        from qlactors.executor.journal.journal import Journal
        from qlactors.process.logs import LogStore
        from qlactors.process.receipts import ReceiptStore
        from qlactors.store.repository import Repository
        from qlactors.store.cadence.retention import Retention

        home = self.root / "h-retired"
        self.ok("--home", home, "task", "add", "t", "--", "true")
        run_id = self.ok("--home", home, "run", "t").stdout.strip()
        self.ok("--home", home, "cancel", run_id)
        repo = Repository.open(f"sqlite:///{home / 'qlactors.db'}")
        try:
            day = 86_400_000
            report = Retention(repo.store, EdgeFiles(Journal(repo.store), LogStore(home / "logs"), ReceiptStore(home / "receipts"))).retire_page(
                time.time_ns() // 1_000_000 + 8 * day, max_age_ms=7 * day, max_runs=100, page=16)
            assert report.retired == 1
        finally:
            repo.close()
        return run_id

    def _unusable_homes(self) -> None:
        """Homes whose database qlactors refuses: corrupt, foreign, newer, gone while logs remain."""
        import sqlite3

        for name in ("h-corrupt", "h-foreign", "h-newer", "h-gone"):
            (self.root / name).mkdir(mode=0o700)
        (self.root / "h-corrupt" / "qlactors.db").write_bytes(b"this is no database" * 100)
        with sqlite3.connect(self.root / "h-foreign" / "qlactors.db") as conn:
            conn.execute("CREATE TABLE someone_elses (x)")
        self.ok("--home", self.root / "h-newer", "task", "list")
        with sqlite3.connect(self.root / "h-newer" / "qlactors.db") as conn:
            conn.execute("UPDATE qlactors_schema SET version = 999")
        (self.root / "h-gone" / "logs").mkdir(mode=0o700)
        (self.root / "h-gone" / "logs" / "old.log").write_text("an earlier run's log\n")

    def write(self, name: str, text: str) -> Path:
        (self.root / name).write_text(text)
        return self.root / name

    def ok(self, *args) -> subprocess.CompletedProcess:
        done = run([*QLACTORS, *map(str, args)], cwd=self.root)
        assert done.returncode == 0, done.stderr
        return done

    def argv(self, words: list[str]) -> list[str]:
        names = {"home": self.home, "keys": self.keys, "root": self.root, "run": self.run,
                 "retired": self.retired}
        return [w.format(**names) for w in words]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return World(tmp_path_factory.mktemp("world"))


H = ["--home", "{home}"]
CONTROL = 'profile = "control"\n[database]\nurl = "postgresql://q@127.0.0.1:9/q"\n'
FAILURES = {
    # docs/cli.md "Exit status" 2: usage and bad input
    "unknown-command": (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
    "unknown-option": ([*H, "runs", "--frob"], 2, "unrecognized arguments: --frob"),
    "command-for-another-command": ([*H, "run", "t", "--", "true"], 2, "`-- COMMAND` belongs to"),
    "unknown-task": ([*H, "run", "nosuch"], 2, "nosuch"),
    "unknown-run": ([*H, "show", "nosuch"], 2, "no run with id"),
    "duplicate-task": ([*H, "task", "add", "t", "--", "true"], 2, "already exists"),
    "out-of-range": ([*H, "runs", "--limit", "501"], 2, "--limit"),
    "number-grammar": ([*H, "task", "add", "u", "--timeout", "1e3", "--", "true"], 2, "--timeout"),
    "env-twice": ([*H, "task", "add", "u", "--env", "A=1", "--env", "A=2", "--", "true"], 2, "A"),
    "cwd-no-directory": ([*H, "task", "add", "u", "--cwd", "/nonexistent/x", "--", "true"], 2, "/nonexistent/x"),
    "unsafe-retry": ([*H, "task", "add", "u", "--retry-on-lost", "--max-attempts", "3", "--", "true"], 2,
                     "--retry-on-lost"),
    "bad-cron": ([*H, "task", "add", "u", "--cron", "61 * * * *", "--", "true"], 2, "cron"),
    "bad-zone": ([*H, "task", "add", "u", "--cron", "@daily", "--tz", "Nowhere/X", "--", "true"], 2, "Nowhere/X"),
    "bad-misfire": ([*H, "task", "add", "u", "--cron", "@daily", "--misfire", "sometimes", "--", "true"], 2,
                    "misfire"),
    "bad-overlap": ([*H, "task", "add", "u", "--cron", "@daily", "--overlap", "stack", "--", "true"], 2,
                    "overlap"),
    "wait-timeout-without-wait": ([*H, "run", "t", "--wait-timeout", "5"], 2, "--wait-timeout needs --wait"),
    "rm-with-active-runs": ([*H, "task", "rm", "t"], 2, "active"),
    "retry-of-an-unfinished-run": ([*H, "retry", "{run}"], 2, "only a finished run can be retried"),
    "unknown-config-key": (["--home", "{home}", "--config", "{root}/edge-bad.toml", "runs"], 2, "frob"),
    "confirm-stopped-on-edge": ([*H, "confirm-stopped", "{run}"], 2, "`confirm-stopped` is for a cluster"),
    "audit-quarantine-without-database": (["--home", "{root}/no-db-home", "audit", "receipts", "--quarantine"], 2,
                                          "nothing was moved"),
    "corrupt-database": (["--home", "{root}/h-corrupt", "runs"], 2, "is not a readable qlactors database"),
    "foreign-database": (["--home", "{root}/h-foreign", "runs"], 2, "it is not a qlactors database"),
    "newer-database": (["--home", "{root}/h-newer", "runs"], 2, "newer than this qlactors knows"),
    "database-gone-while-logs-remain": (["--home", "{root}/h-gone", "runs"], 2, "nothing was created"),
    # exit 4: retired by retention
    "retired-run": (["--home", "{root}/h-retired", "show", "{retired}"], 4, "was retired on"),
    "retired-run-logs": (["--home", "{root}/h-retired", "logs", "{retired}"], 4, "its log was deleted"),
    # docs/cli.md "Cluster" and docs/cluster.md: configs and keys (exit 2)
    "control-without-config": (["control"], 2, "needs --config FILE"),
    "control-with-a-worker-config": (["control", "--config", "worker.toml"], 2, "is a worker config"),
    "control-config-out-of-range": (["control", "--config", "c-range.toml"], 2, "recovery_page = 65 is out of range"),
    "control-timeout-not-below-heartbeat": (["control", "--config", "c-timeout.toml"], 2,
                                            "lock_timeout_ms = 20000 must be below"),
    "control-url-not-postgresql": (["control", "--config", "c-sqlite.toml"], 2, "a control replica needs PostgreSQL"),
    "control-key-missing": (["control", "--config", "c-nokey.toml"], 2, "does not exist"),
    "control-key-malformed": (["control", "--config", "c-junk.toml"], 2, "is not a CurveZMQ key file"),
    "control-key-readable-by-others": (["control", "--config", "c-loose.toml"], 2,
                                       "is readable by others (mode 0644); run: chmod 600"),
    "worker-with-database": (["worker", "--config", "w-db.toml"], 2, "[database] has no place in a worker config"),
    "worker-own-key-missing": (["worker", "--config", "w-nokey.toml"], 2, "w9.key_secret does not exist"),
    "worker-server-key-missing": (["worker", "--config", "w-noserver.toml"], 2,
                                  "[worker] server_key is the control replicas' public key"),
    "keys-new-existing": (["keys", "new", "w1", "--dir", "{keys}"], 2, "already exists; nothing was written"),
    "commands-through-a-worker-config": (["--config", "worker.toml", "runs"], 2, "holds no database credentials"),
    "database-url-not-postgresql": (["runs"], 2, "the cluster database is PostgreSQL"),
    "no-cluster-database": ([*H, "workers"], 2, NO_CLUSTER),
    "missing-psycopg": (["--config", "control.toml", "workers"], 2, NEEDS_PSYCOPG),
    # exit 1: runtime failures
    "database-unreachable": (["--config", "control.toml", "runs"], 1, "is the database up? try again"),
    "replica-database-unreachable": (["control", "--config", "c-free.toml"], 1, "try again"),
    "bind-in-use": (["control", "--config", "c-taken.toml"], 1, "address already in use (another replica"),
}
CONFIGS = {
    "edge-bad.toml": "[runtime]\nfrob = 1\n",
    "c-range.toml": CONTROL + "[control]\nrecovery_page = 65\n",
    "c-timeout.toml": CONTROL + "lock_timeout_ms = 20000\n",
    "c-sqlite.toml": 'profile = "control"\n[database]\nurl = "sqlite:///x.db"\n',
    "c-nokey.toml": CONTROL + '[control]\nkey = "keys/none.key_secret"\n',
    "c-junk.toml": CONTROL + '[control]\nkey = "keys/junk.key_secret"\n',
    "c-loose.toml": CONTROL + '[control]\nkey = "keys/loose.key_secret"\n',
    "c-free.toml": CONTROL + '[control]\nbind = "tcp://127.0.0.1:{free}"\n',
    "c-taken.toml": CONTROL + '[control]\nbind = "tcp://127.0.0.1:{taken}"\n',
    "w-db.toml": 'profile = "worker"\n[database]\nurl = "postgresql://q@h/q"\n',
    "w-nokey.toml": 'profile = "worker"\n[worker]\nkey = "keys/w9.key_secret"\n',
    "w-noserver.toml": 'profile = "worker"\n[worker]\nserver_key = "keys/none.key"\nkey = "keys/w1.key_secret"\n',
}


@pytest.mark.parametrize("case", FAILURES)
def test_every_documented_failure_is_one_line_with_its_exit_status(world, case, tmp_path):
    import socket

    argv, status, words = FAILURES[case]
    env = clean_env(QLACTORS_HOME=str(world.home))
    if case == "database-url-not-postgresql":
        env["QLACTORS_DATABASE_URL"] = "sqlite:///x.db"
    with socket.socket() as taken, socket.socket() as free:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        free.bind(("127.0.0.1", 0))
        ports = {"taken": taken.getsockname()[1], "free": free.getsockname()[1]}
        free.close()  # a port no one listens on, for a replica that gets as far as its database
        for name, text in CONFIGS.items():
            world.write(name, text.replace("{taken}", str(ports["taken"])).replace("{free}", str(ports["free"])))
        command = WITHOUT_PSYCOPG if case == "missing-psycopg" else QLACTORS
        done = run([*command, *world.argv(argv)], cwd=world.root, env=env)
    assert_one_line(done, status, words)
    assert done.stdout == ""


def test_a_second_worker_on_the_same_state_dir_is_refused_in_one_line(world):
    """docs/cluster.md: `state directory ... is in use by another qlactors worker (pid N)`, exit 1."""
    from actor_harness import wait_until
    from qlactors.runtime.home import holder_pid

    first = subprocess.Popen([*QLACTORS, "worker", "--config", "worker.toml"], cwd=world.root,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=clean_env())
    try:
        wait_until(lambda: holder_pid(world.root / "state") == first.pid or first.poll() is not None, 60,
                   "the first worker to hold its state directory")
        assert first.poll() is None
        second = run([*QLACTORS, "worker", "--config", "worker.toml"], cwd=world.root)
    finally:
        first.terminate()
        first.wait(30)
    assert_one_line(second, 1, f"state directory {world.root / 'state'} is in use by another qlactors "
                               f"worker (pid {first.pid})")


# -- the same on a real cluster database --------------------------------------------------------

class ClusterWorld:
    """Three PostgreSQL schemas: a migrated one (worker w1 allowed), an empty one, one from a
    newer qlactors; a control.toml for each, and the world's keys."""

    def __init__(self, world: World) -> None:
        import uuid

        import psycopg
        from sqlalchemy import update

        from conftest import PG_URL, _pg_admin_conninfo, _require_postgres
        from qlactors.store.engine import Store
        from qlactors.store.migrations import migrate
        from qlactors.store.schema import schema_version
        from qlactors.store.admin.worker_keys import WorkerKeys
        from qlactors.wire.curve_keys import load_public_key

        _require_postgres()
        self.world, self.admin = world, _pg_admin_conninfo()
        self.schemas = {kind: f"qlt_{uuid.uuid4().hex[:16]}" for kind in ("migrated", "empty", "newer")}
        with psycopg.connect(self.admin, autocommit=True) as conn:
            for schema in self.schemas.values():
                conn.execute(f'CREATE SCHEMA "{schema}"')
        sep = "&" if "?" in PG_URL else "?"
        for kind, schema in self.schemas.items():
            url = f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
            world.write(f"pg-{kind}.toml", f'profile = "control"\n[database]\nurl = "{url}"\n'
                                           '[control]\nbind = "tcp://127.0.0.1:1"\n')
            if kind == "empty":
                continue
            store = Store(url)
            try:
                migrate(store)
                if kind == "migrated":
                    WorkerKeys(store).allow("w1", load_public_key(world.keys / "w1.key").decode())
                else:
                    with store.write() as conn:
                        conn.execute(update(schema_version).values(version=999))
            finally:
                store.close()

    def close(self) -> None:
        import psycopg

        with psycopg.connect(self.admin, autocommit=True) as conn:
            for schema in self.schemas.values():
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(scope="module")
def cluster_world(world):
    made = ClusterWorld(world)
    yield made
    made.close()


PG = ["--config", "pg-migrated.toml"]
CLUSTER_FAILURES = {
    "newer-schema": (["--config", "pg-newer.toml", "runs"], 2, "newer than this qlactors knows"),
    "replica-on-a-newer-schema": (["control", "--config", "pg-newer.toml"], 2, "newer than this qlactors knows"),
    "allow-a-key-bound-to-another-worker": ([*PG, "worker", "allow", "w2", "{keys}/w1.key"], 2, "w1"),
    "allow-a-file-that-is-no-key": ([*PG, "worker", "allow", "w2", "{keys}/junk.key_secret"], 2,
                                    "is not a CurveZMQ key file"),
    "retire-without-confirm-stopped": ([*PG, "worker", "retire", "w1"], 2, "add --confirm-stopped"),
    "retire-an-unknown-worker": ([*PG, "worker", "retire", "ghost", "--confirm-stopped"], 2, "no worker ghost"),
    "confirm-stopped-an-unknown-run": ([*PG, "confirm-stopped", "nosuch"], 2, "no run with id"),
    "run-an-unknown-task": ([*PG, "run", "nosuch"], 2, "nosuch"),
}


@pytest.mark.postgres
@pytest.mark.parametrize("case", CLUSTER_FAILURES)
def test_every_documented_cluster_failure_is_one_line_with_its_exit_status(cluster_world, case):
    argv, status, words = CLUSTER_FAILURES[case]
    world = cluster_world.world
    done = run([*QLACTORS, *world.argv(argv)], cwd=world.root, env=clean_env(QLACTORS_HOME=str(world.home)))
    assert_one_line(done, status, words)
    assert done.stdout == ""


@pytest.mark.postgres
def test_a_database_no_replica_ever_migrated_is_refused_after_the_wait_it_announced(cluster_world):
    """The one documented failure with two lines: the wait is said as it begins (docs/cli.md)."""
    world = cluster_world.world
    done = run([*QLACTORS, "--config", "pg-empty.toml", "runs"], cwd=world.root)
    lines = done.stderr.splitlines()
    assert len(lines) == 2 and all(line.startswith("qlactors: ") for line in lines), done.stderr
    # The migration lock is per database, and other tests migrate schemas of this one meanwhile.
    assert ("has no qlactors schema yet: waiting up to 10 s for a control replica to create it" in lines[0]
            or "is being migrated by a control replica: waiting up to 10 s" in lines[0]), lines
    assert "has no qlactors schema, this qlactors needs" in lines[1] and done.returncode == 2


def test_a_second_edge_runtime_on_a_home_is_refused_in_one_line(home):
    """docs/cli.md exit status 1: `edge` when another runtime holds the home."""
    first = home.start_edge()
    second = run([*QLACTORS, "--home", str(home.path), "edge"], cwd=home.tmp)
    assert first.terminate() == 0
    assert_one_line(second, 1, f"a qlactors runtime (pid {first.pid}) already runs on {home.path}")
