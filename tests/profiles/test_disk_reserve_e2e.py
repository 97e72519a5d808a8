"""The disk reserve end to end: a real `qlactors edge` whose logs' file system is "full", then is not.

The free space comes from `QLACTORS_TEST_FREE_BYTES_FILE` (qlactors/process/diskspace.py), which
the test rewrites atomically to fill and free the "disk".
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from edge_harness import QLACTORS
from qlactors.process.diskspace import FREE_BYTES_FILE_ENV, free_bytes, free_space_source

EDGE_RESERVE = 32 * 1024 * 1024


def set_free(path: Path, n: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(n))
    os.replace(tmp, path)  # never a half-written number: the edge would read the real disk then


def test_free_space_comes_from_statvfs_unless_the_test_file_is_set(tmp_path):
    assert free_space_source(tmp_path, {})() > 0 and free_bytes(tmp_path) > 0
    fake = tmp_path / "free"
    read = free_space_source(tmp_path, {FREE_BYTES_FILE_ENV: str(fake)})
    set_free(fake, 123)
    assert read() == 123
    fake.write_text("not a number")
    assert read() != 123  # unreadable: the real file system answers


def test_below_the_reserve_a_run_waits_status_says_why_and_it_starts_when_space_returns(home, tmp_path):
    free = tmp_path / "free-bytes"
    set_free(free, 1024)  # 1 KiB free, far below the edge reserve
    home.path.mkdir(mode=0o700)
    # A short tick: many cycles (each one nudging the executor to pull again) while the run waits.
    (home.path / "qlactors.toml").write_text("[runtime]\ncadence_tick_ms = 200\n")
    home.add_tasks(("hello", "--", "echo hello"))
    edge = home.start_edge(command=["env", f"{FREE_BYTES_FILE_ENV}={free}", *QLACTORS])

    run_id = home.run("hello")
    edge.wait_log("event=disk_reserve_hold free=1024 reserve=33554432")
    status = json.loads(home.ok("status", "--json").stdout)
    text = home.ok("status").stdout
    assert status["disk_reserve_hold"]["free_bytes"] == 1024
    assert status["disk_reserve_hold"]["reserve_bytes"] == EDGE_RESERVE
    assert status["disk_reserve_hold"]["path"] == str(home.path / "logs")
    assert "disk reserve: holding new attempts" in text and "below the reserve of 32.0 MiB" in text
    # Two status processes later (several cycles of 200 ms, each a pull), still waiting, logged once.
    assert home.state(run_id) == "queued"
    assert home.attempt_row(run_id)["status"] == "claimed"
    assert edge.log().count("event=disk_reserve_hold") == 1

    set_free(free, EDGE_RESERVE)  # exactly the reserve is enough
    assert home.wait_terminal(run_id) == "succeeded"
    assert home.logs(run_id) == b"hello\n"
    edge.wait_log("event=disk_reserve_released")
    assert json.loads(home.ok("status", "--json").stdout)["disk_reserve_hold"] is None
