"""The home directory as users meet it (issue 9, §5): private modes, a missing database, a read-only home.

Real `qlactors` commands and a real `qlactors edge` on real files; a read-only home is a real
read-only bind mount in a user and mount namespace of its own (`unshare -Urm`), since root
ignores permission bits.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from edge_harness import Home
from test_cli import ok, ql


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
