"""The home directory as users meet it (issue 9, §5): private modes, a missing database, a read-only home.

Real `qlactors` commands and a real `qlactors edge` on real files; a read-only home is a real
read-only bind mount in a user and mount namespace of its own (`unshare -Urm`), since root
ignores permission bits.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

from edge_harness import Home
from requires import unavailable
from qlactors.domain.receipt import receipt_shard
from cli_harness import QLACTORS, assert_refused, clean_env, in_parallel, ok, ok_json, ql


def _modes(root: Path) -> dict[str, str]:
    """Every entry under `root` (itself included) -> its type and permission bits."""
    found = {".": f"d{stat.S_IMODE(root.stat().st_mode):o}"}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            kind = "d" if stat.S_ISDIR(st.st_mode) else "f" if stat.S_ISREG(st.st_mode) else "?"
            found[str(path.relative_to(root))] = f"{kind}{stat.S_IMODE(st.st_mode):o}"
    return found


def _not_private(modes: dict[str, str]) -> dict[str, str]:
    return {path: mode for path, mode in modes.items() if mode not in ("d700", "f600")}


def test_every_file_in_the_home_is_0600_and_every_directory_0700_after_a_run(tmp_path):
    home = Home(tmp_path)
    try:
        home.main("task", "add", "t", "--", "echo out; echo err >&2; exit 3")
        home.start_edge()
        result = home.ql("run", "t", "--wait")
        assert result.returncode == 3, (result, home.edge_logs())
        up = _modes(home.path)
        # While the runtime is up the WAL and its index exist (SQLite copies the database's mode).
        for name in ("qlactors.db", "qlactors.db-wal", "qlactors.db-shm", "runtime.lock",
                     "recovery-status.json"):
            assert name in up, sorted(up)
        assert any(p.startswith("logs/") and p.endswith(".log") for p in up), sorted(up)
        assert _not_private(up) == {}, up
        assert home.edges[0].terminate() == 0, home.edge_logs()
        assert _not_private(_modes(home.path)) == {}
    finally:
        home.close()


def test_a_database_left_0644_by_an_older_qlactors_is_made_0600_when_opened(tmp_path):
    home = tmp_path / "home"
    ok("task", "add", "t", "--", "true", home=home)
    db = home / "qlactors.db"
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    db.chmod(0o644)
    ok("task", "list", home=home)
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert _not_private(_modes(home)) == {}


def test_a_database_outside_the_home_named_by_the_config_is_created_0600(tmp_path):
    other = tmp_path / "elsewhere" / "other.db"
    other.parent.mkdir()
    config = tmp_path / "c.toml"
    config.write_text(f'[database]\nurl = "sqlite:///{other}"\n')
    ok("--config", config, "task", "add", "t", "--", "true", home=tmp_path / "home")
    assert stat.S_IMODE(other.stat().st_mode) == 0o600
    assert ql("--config", config, "task", "list", home=tmp_path / "home").returncode == 0


# --- a home whose database was deleted -------------------------------------------------------------


def _plant_old(path: Path, age_s: float = 3600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_text("{}")
    old = time.time() - age_s
    os.utime(path, (old, old))
    return path


def _deleted_database_home(tmp_path: Path) -> tuple[Path, Path, str]:
    """A home that ran jobs (a log, a receipt left) and whose database (with WAL) was deleted."""
    home = tmp_path / "home"
    ok("task", "add", "t", "--", "true", home=home)
    attempt_id = "01a22a70-6402-7001-a4c5-00000000beef"
    shard = receipt_shard(attempt_id)
    _plant_old(home / "logs" / "d8" / "01a22a70-6402-72c8-901a-f51ac2366c0c.log")
    receipt = _plant_old(home / "receipts" / shard / f"{attempt_id}.json")
    for name in ("qlactors.db", "qlactors.db-wal", "qlactors.db-shm"):
        (home / name).unlink(missing_ok=True)
    return home, receipt, shard


def test_a_home_whose_database_was_deleted_is_refused_instead_of_recreated_empty(tmp_path):
    home, receipt, _ = _deleted_database_home(tmp_path)
    edge = subprocess.run([*QLACTORS, "--home", str(home), "edge"], capture_output=True, text=True,
                          timeout=60, env=clean_env(), stdin=subprocess.DEVNULL)
    listed, added, ran = in_parallel([(("runs",), {"home": home}), (("task", "add", "u", "--", "true"), {"home": home}),
                                      (("run", "t"), {"home": home})])
    for result in (edge, listed, added, ran):
        assert_refused(result, f"no database at {home / 'qlactors.db'}")
        line = result.stderr.strip()
        assert "1 file under logs/ and 1 file under receipts/" in line, line
        assert "restore qlactors.db" in line and "move logs/ and receipts/ aside" in line, line
    assert not (home / "qlactors.db").exists()  # nothing was created
    assert receipt.exists() and not (home / "runtime.lock").exists()

    # Moving them aside, as the message says, starts afresh.
    (home / "logs").rename(tmp_path / "logs.old")
    (home / "receipts").rename(tmp_path / "receipts.old")
    assert ok_json("task", "list", home=home) == []


def test_audit_without_a_database_lists_the_orphans_and_creates_nothing(tmp_path):
    home, receipt, shard = _deleted_database_home(tmp_path)
    report = ql("audit", "receipts", "--shard", shard, "--shards", "1", "--json", home=home)
    assert report.returncode == 0, report
    assert "no database" in report.stderr and "Traceback" not in report.stderr, report.stderr
    data = json.loads(report.stdout)
    assert data["orphans"] == [f"{shard}/{receipt.name}"], data
    assert data["counts"]["orphan"] == 1
    moved = ql("audit", "receipts", "--shard", shard, "--shards", "1", "--quarantine", home=home)
    assert_refused(moved, "no database")
    assert receipt.exists() and not (home / "receipts" / ".orphan-quarantine").exists()
    assert not (home / "qlactors.db").exists()


# --- a read-only home --------------------------------------------------------------------------------


def _read_only(home: Path, *args: str | Path, config: Path | None = None) -> subprocess.CompletedProcess:
    """`qlactors --home HOME ARGS` with HOME bind-mounted read-only in a namespace of its own."""
    argv = [*QLACTORS, "--home", str(home), *(["--config", str(config)] if config else []), *map(str, args)]
    script = f'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    if shutil.which("unshare") is None:
        unavailable("unshare", "not on PATH, so no read-only bind mount can be made (apt-get install util-linux)")
    result = subprocess.run(["unshare", "-Urm", "sh", "-c", script, "sh", str(home), *argv],
                            capture_output=True, text=True, timeout=60, env=clean_env(),
                            stdin=subprocess.DEVNULL)
    if result.returncode != 0 and "Operation not permitted" in result.stderr and "qlactors" not in result.stderr:
        unavailable("a user and mount namespace (unshare -Urm; mount --bind)", result.stderr.strip())
    return result


def test_edge_and_writing_commands_on_a_read_only_home_say_it_is_not_writable(tmp_path):
    home = tmp_path / "home"
    ok("task", "add", "t", "--", "true", home=home)
    elsewhere = tmp_path / "db"
    elsewhere.mkdir()
    config = tmp_path / "c.toml"
    config.write_text(f'[database]\nurl = "sqlite:///{elsewhere / "x.db"}"\n')
    before = _modes(home)
    cases = [
        _read_only(home, "edge"),
        _read_only(home, "task", "add", "u", "--", "true"),
        _read_only(home, "run", "t"),
        _read_only(home, "runs"),
        # The database elsewhere is writable: the runtime's lock, logs and receipts still are not.
        _read_only(home, "edge", config=config),
    ]
    for result in cases:
        assert_refused(result, f"home {home} is not writable (it is on a read-only file system)")
        assert "pass --home" in result.stderr
    assert _modes(home) == before
    assert not (elsewhere / "x.db").exists()


def test_a_database_url_that_is_no_url_is_refused_with_one_line(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[database]\nurl = "nonsense"\n')
    assert_refused(ql("--config", config, "task", "list", home=tmp_path / "home"), "is not a database URL")


def test_a_file_system_refusal_nothing_foresaw_is_one_line_naming_the_path(tmp_path):
    home = tmp_path / "home"
    ok("task", "list", home=home)
    (home / "runtime.lock").mkdir()  # the runtime cannot open its lock file
    result = subprocess.run([*QLACTORS, "--home", str(home), "edge"], capture_output=True, text=True,
                            timeout=60, env=clean_env(), stdin=subprocess.DEVNULL)
    assert result.returncode == 1, result
    assert result.stderr.splitlines() == [f"qlactors: Is a directory ({home / 'runtime.lock'}); "
                                          "the command stopped there"], result.stderr
