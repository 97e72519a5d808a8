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
