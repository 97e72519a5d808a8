"""`qlactors audit receipts` through the real command: read-only by default, --quarantine moves orphans only."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

_EXE = Path(sys.executable).parent / "qlactors"
QLACTORS = [str(_EXE)] if _EXE.exists() else [sys.executable, "-m", "qlactors"]


def ql(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("QLACTORS_HOME", "XDG_DATA_HOME")}
    return subprocess.run([*QLACTORS, "--home", str(home), *args], capture_output=True, text=True,
                          timeout=60, env=env)


def plant(home: Path, attempt_id: str, *, age_s: float) -> Path:
    shard = hashlib.sha256(attempt_id.encode()).hexdigest()[:2]
    directory = home / "receipts" / shard
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / f"{attempt_id}.json"
    path.write_text("{}")
    old = time.time() - age_s
    os.utime(path, (old, old))
    return path


def test_audit_is_read_only_by_default_and_quarantines_only_old_orphans(tmp_path):
    home = tmp_path / "home"
    assert ql(home, "task", "list").returncode == 0  # creates and migrates the home
    orphan = plant(home, "orphan-attempt-1", age_s=3600)
    shard = orphan.parent.name
    # A young file in the same shard, so one bounded read sees both.
    young_id = next(f"young-{i}" for i in range(10_000)
                    if hashlib.sha256(f"young-{i}".encode()).hexdigest()[:2] == shard)
    young = plant(home, young_id, age_s=1)

    result = ql(home, "audit", "receipts", "--shard", shard, "--shards", "1", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert any(name.endswith("orphan-attempt-1.json") for name in report["orphans"])
    assert report["counts"]["young"] >= 1
    assert orphan.exists() and young.exists()
    assert not (home / "receipts" / ".orphan-quarantine").exists()

    moved = ql(home, "audit", "receipts", "--shard", shard, "--shards", "1", "--quarantine")
    assert moved.returncode == 0, moved.stderr
    assert not orphan.exists() and young.exists()
    target = home / "receipts" / ".orphan-quarantine"
    assert (target.stat().st_mode & 0o777) == 0o700
    assert any(p.name.startswith("orphan-attempt-1") for p in target.rglob("*"))


def test_audit_refuses_limits_above_the_hard_maximum(tmp_path):
    home = tmp_path / "home"
    result = ql(home, "audit", "receipts", "--shards", "33")
    assert result.returncode == 2
    assert "audit receipts" in result.stderr
