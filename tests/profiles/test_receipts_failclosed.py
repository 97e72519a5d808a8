"""Bad completion receipts fail closed through the real recovery path (SEMANTICS.md §5, §6).

The issue: "Temp file, half-written, oversized, unknown key, duplicate key, boolean or float where
an integer belongs, wrong token, wrong sequence, wrong attempt id, symlink: each receipt fails
closed (quarantined when the attempt is known), the run is not completed from it, the quarantine
directory is 0700."

How (one home, one run per case, one restart, so the whole file stays well under a minute):

1. `qlactors edge` (a real subprocess) runs one `sleep 30` run per case until every run is
   `running` with its process identity committed.
2. The runtime is killed with SIGKILL, then every job's whole process group (launcher, job and
   log-cap reader) with SIGKILL, after re-checking its identity: no real receipt can be written.
3. While the runtime is down, the test plants each case's receipt at
   `<home>/receipts/<sha256(attempt id)[:2]>/<attempt id>.json`. The launcher's callback token
   never leaves the executor (only its SHA-256 is in `run_attempts.callback_token_hash`), so to
   forge an otherwise valid receipt the test REPLACES that hash (and the journal's copy) with the
   SHA-256 of a token it chose. Only the "wrong token" case keeps the launcher's real hash and
   signs with a random token instead.
4. `qlactors edge` starts again; its startup recovery must refuse each bad receipt (quarantine
   it), find the process gone, mark the attempt lost and let Retry end the run `failed`
   (RUN_LOST_RETRY_DISABLED) — never complete the run from the planted bytes. A positive control
   (a valid receipt with the right token, exit 5) proves that the same path does complete runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import sqlite3
import stat
import sys
import time
from pathlib import Path

import pytest

from qlactors.domain.receipt import Receipt, encode_receipt, token_hash
from edge_harness import FAULT_EXIT, TERMINAL, Home, kill_group, pid_alive, start_ticks, wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux /proc")

SETTLE_S = 10.0  # per phase: every run running, then every run resolved after the restart

# Every case plants something for one run. "control" is the positive control.
CASES = ("temp_only", "half_written", "oversized", "unknown_key", "duplicate_key", "bool_for_int",
         "float_for_int", "wrong_token", "wrong_sequence", "wrong_attempt_id", "symlink")
ALL = CASES + ("control",)

CONFIG = """\
[runtime]
slots = 16
recovery_page = 16
retry_page = 16
cadence_tick_ms = 200
"""


def shard_of(attempt_id: str) -> str:
    return hashlib.sha256(attempt_id.encode("ascii")).hexdigest()[:2]


def journal_state(home: Home, attempt_id: str) -> str | None:
    row = home.journal_row(attempt_id)
    return None if row is None else row["state"]


# --- the planted receipts ------------------------------------------------------------------------


def receipt_bytes(run_id: str, attempt_id: str, token: str, *, exit_code: int = 0,
                  sequence: int = 1, started_at_ms: int) -> bytes:
    now = time.time_ns() // 1_000_000
    return encode_receipt(Receipt(schema_version=1, run_id=run_id, attempt_id=attempt_id,
                                  callback_sequence=sequence, token=token,
                                  started_at_ms=started_at_ms, finished_at_ms=max(now, started_at_ms),
                                  exit_code=exit_code))


def plant(case: str, home: Path, run_id: str, attempt_id: str, started_at_ms: int) -> dict:
    """Write the case's file(s); returns what the assertions need. The runtime is down."""
    shard_dir = home / "receipts" / shard_of(attempt_id)
    final = shard_dir / f"{attempt_id}.json"
    assert not final.exists() and not final.is_symlink(), "a real receipt landed; the kill came too late"
    token = secrets.token_urlsafe(32)
    keep_real_token = case == "wrong_token"
    if not keep_real_token:
        # The test cannot know the launcher's token: make the database expect ours instead.
        with contextlib.closing(sqlite3.connect(home / "qlactors.db", timeout=10)) as conn:
            conn.execute("UPDATE run_attempts SET callback_token_hash = ? WHERE id = ?",
                         (token_hash(token), attempt_id))
            conn.execute("UPDATE executor_journal SET callback_token_hash = ? WHERE attempt_id = ?",
                         (token_hash(token), attempt_id))
            conn.commit()

    def valid(**kw) -> bytes:
        return receipt_bytes(run_id, attempt_id, token, started_at_ms=started_at_ms, **kw)

    info: dict = {"final": final, "planted": None, "symlink_target": None, "temp": None}
    if case == "temp_only":
        # A launcher that died between writing its temp file and link(): a perfectly valid,
        # correctly signed receipt, but never published, so it must not count.
        temp = shard_dir / f".{attempt_id}.123.tmp"
        temp.write_bytes(valid())
        os.chmod(temp, 0o600)
        info["temp"] = temp
        return info
    if case == "symlink":
        elsewhere = home / "elsewhere"
        elsewhere.mkdir(mode=0o700, exist_ok=True)
        target = elsewhere / f"{attempt_id}.json"
        target.write_bytes(valid())  # valid and correctly signed: only the symlink is wrong
        os.symlink(target, final)
        info["symlink_target"] = target
        info["target_bytes"] = target.read_bytes()
        return info
    good = valid()
    data = {
        "half_written": lambda: good[: len(good) // 2],
        "oversized": lambda: good + b" " * (5000 - len(good)),  # valid JSON, padded past 4 KiB
        "unknown_key": lambda: good[:-1] + b',"extra":1}',
        "duplicate_key": lambda: good[:-1] + b',"exitCode":0}',
        # true == 1 in Python: a lax reader would take it as callback sequence 1.
        "bool_for_int": lambda: good.replace(b'"callbackSequence":1', b'"callbackSequence":true'),
        "float_for_int": lambda: valid(exit_code=3).replace(b'"exitCode":3', b'"exitCode":3.0'),
        "wrong_token": lambda: receipt_bytes(run_id, attempt_id, secrets.token_urlsafe(32),
                                             started_at_ms=started_at_ms),
        "wrong_sequence": lambda: valid(sequence=2),
        "wrong_attempt_id": lambda: receipt_bytes(run_id, "0190aaaa-bbbb-7ccc-8ddd-eeeeeeeeeeee", token,
                                                  started_at_ms=started_at_ms),
        "control": lambda: valid(exit_code=5),
    }[case]()
    if case not in ("control", "oversized"):
        assert data != good and len(data) <= 4096
    if case == "oversized":
        assert len(data) > 4096 and json.loads(data)  # only the size is wrong
    tmp = shard_dir / f".plant.{attempt_id}"
    tmp.write_bytes(data)
    os.chmod(tmp, 0o600)
    os.link(tmp, final)
    os.unlink(tmp)
    info["planted"] = data
    return info


# --- the scenario --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recovered(tmp_path_factory):
    """Run the whole scenario once; each test then checks one case's outcome."""
    home = Home(tmp_path_factory.mktemp("failclosed"), config=CONFIG)
    try:
        home.add_tasks(("sleeper", "--max-concurrent", "16", "--", "sleep 30"))
        run_ids = {case: home.run("sleeper") for case in ALL}
        edge = home.start_edge()

        def all_running():
            rows = [home.attempt_row(rid) for rid in run_ids.values()]
            return rows if all(r is not None and r["status"] == "running" and r["pid"] is not None
                               for r in rows) else None

        rows = wait_until(all_running, SETTLE_S, lambda: f"every run running\n{home.edge_logs()}")
        identities = [(r["pid"], r["pgid"], r["start_ticks"]) for r in rows]

        # Down hard: the runtime first (so it cannot observe the exits), then each job's group.
        edge.kill9()
        for _, pgid, ticks in identities:
            kill_group(pgid, ticks)
        wait_until(lambda: not any(pid_alive(pid) for pid, _, _ in identities), SETTLE_S,
                   "every launcher gone")

        planted = {}
        for case, run_id in run_ids.items():
            row = home.attempt_row(run_id)
            planted[case] = plant(case, home.path, run_id, row["id"], row["started_at_ms"])
            planted[case]["attempt_id"] = row["id"]
            planted[case]["run_id"] = run_id

        home.start_edge()
        resolved = wait_until(
            lambda: all(home.attempt_row(rid)["run_status"] in TERMINAL for rid in run_ids.values()),
            SETTLE_S, lambda: f"every run resolved after the restart\n{home.edge_logs()}")
        assert resolved
        outcome = {case: dict(home.attempt_row(info["run_id"])) for case, info in planted.items()}
        journal = {case: journal_state(home, info["attempt_id"]) for case, info in planted.items()}
        yield {"home": home.path, "planted": planted, "outcome": outcome, "journal": journal,
               "edge_logs": home.edge_logs}
    finally:
        home.close()


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# --- the checks ----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_a_bad_receipt_fails_closed_is_quarantined_and_never_completes_the_run(recovered, case):
    home, info = recovered["home"], recovered["planted"][case]
    row = recovered["outcome"][case]
    attempt_id = info["attempt_id"]
    what = (case, row, recovered["edge_logs"]())

    # Not completed from the receipt: the attempt was lost (the process ended with no valid
    # receipt) and Retry ended the run failed without an exit code.
    assert row["exit_code"] is None, what
    assert row["callback_sequence"] == 0, what
    assert row["status"] == "lost", what
    assert row["error_code"] == "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT", what
    assert row["run_status"] in ("failed", "lost"), what
    if row["run_status"] == "failed":
        assert row["run_error_code"] == "RUN_LOST_RETRY_DISABLED", what

    # Nothing is left at the final name (and nothing there was consumed as a completion).
    final = info["final"]
    assert not final.exists() and not final.is_symlink(), what
    assert recovered["journal"][case] in (None, "quarantined"), what

    qroot = home / "receipts" / ".quarantine"
    qshard = qroot / shard_of(attempt_id)
    moved = sorted(qshard.glob(f"{attempt_id}.json*")) if qshard.is_dir() else []
    if case == "temp_only":
        # Nothing was published, so nothing to quarantine; the temp may stay or be cleaned up.
        assert moved == [], what
        temp = info["temp"]
        assert not temp.exists() or temp.read_bytes()  # untouched if kept
        return
    assert len(moved) == 1, (what, moved)
    assert _mode(qroot) == 0o700, oct(_mode(qroot))
    assert _mode(qshard) == 0o700, oct(_mode(qshard))
    if case == "symlink":
        # The symlink itself was moved, never followed; its target is untouched.
        assert moved[0].is_symlink(), what
        assert os.readlink(moved[0]) == str(info["symlink_target"])
        assert info["symlink_target"].read_bytes() == info["target_bytes"]
    else:
        assert not moved[0].is_symlink()
        assert moved[0].read_bytes() == info["planted"], what


def test_positive_control_a_valid_receipt_with_the_right_token_completes_the_run_and_is_deleted(recovered):
    info, row = recovered["planted"]["control"], recovered["outcome"]["control"]
    what = (row, recovered["edge_logs"]())
    assert row["run_status"] == "failed", what
    assert row["status"] == "failed", what
    assert row["exit_code"] == 5, what
    assert row["callback_sequence"] == 1, what
    assert row["run_error_code"] == "EXIT_NONZERO", what
    assert not info["final"].exists() and not info["final"].is_symlink()
    qshard = recovered["home"] / "receipts" / ".quarantine" / shard_of(info["attempt_id"])
    if qshard.is_dir():
        assert not list(qshard.glob(f"{info['attempt_id']}*"))
    assert recovered["journal"]["control"] is None  # cleared after the committed completion


# --- the other side of failing closed: a good receipt still lands after a restart -------------------
#
# SEMANTICS.md §5: a receipt "lands even after the executor that launched it was restarted or
# replaced, as long as the attempt is not terminal"; §6 step 3: a launcher still running at startup
# is kept, re-bound and re-adopted by the Executor, whose pidfd notices its end.


def _marker_identity(home: Path, attempt_id: str) -> tuple[int, int, int] | None:
    """(pid, pgid, start_ticks) from the launcher's start marker, if it published one."""
    marker = home / "receipts" / shard_of(attempt_id) / f"{attempt_id}.start"
    try:
        fields = dict(part.split("=", 1) for part in marker.read_text().split())
    except FileNotFoundError:
        return None
    return int(fields["pid"]), int(fields["pgid"]), int(fields["start_ticks"])


def _restart_scenario(tmp_path: Path, *, fault: str | None) -> tuple[dict, str, str]:
    """A job (`sleep 3; exit 4`) outlives its runtime; a new runtime must take its receipt.

    The completed attempt row (with `edge_alive`), the second runtime's log, and the run id."""
    home = Home(tmp_path, config=CONFIG)
    try:
        home.add_tasks(("survivor", "--", "sleep 3; exit 4"))
        run_id = home.run("survivor")
        if fault is None:
            first = home.start_edge()
            row = wait_until(lambda: (r := home.attempt_row(run_id)) is not None
                             and r["status"] == "running" and r, SETTLE_S, lambda: f"the run running\n{home.edge_logs()}")
            ident = (row["pid"], row["pgid"], row["start_ticks"])
            first.kill9()
        else:
            # QLACTORS_FAULT=after_spawn: the runtime dies right after the spawn, before the
            # identity is journalled or reported; only the launcher's start marker knows it.
            first = home.start_edge(fault=fault, wait_up=False)
            assert first.wait_exit(SETTLE_S) == FAULT_EXIT, first.describe()
            attempt_id = home.attempt_row(run_id)["id"]
            ident = wait_until(lambda: _marker_identity(home.path, attempt_id), SETTLE_S, "the start marker")
        assert start_ticks(ident[0]) == ident[2], "the job must still be running at the restart"
        second = home.start_edge()
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline and home.attempt_row(run_id)["run_status"] not in TERMINAL:
            time.sleep(0.05)
        row = dict(home.attempt_row(run_id))
        row["edge_alive"] = second.proc.poll() is None
    finally:
        home.close()
    return row, second.log(), run_id


def _assert_completed_from_receipt(home: Path, row: dict, edge_log: str) -> None:
    what = (row, edge_log)
    assert row["run_status"] == "failed", what
    assert row["status"] == "failed" and row["exit_code"] == 4, what
    assert row["run_error_code"] == "EXIT_NONZERO", what
    final = home / "receipts" / shard_of(row["id"]) / f"{row['id']}.json"
    assert not final.exists(), what  # consumed, then deleted
    assert row["edge_alive"], what
    assert "actor_failed" not in edge_log and "Traceback" not in edge_log, what


def test_a_receipt_of_a_job_that_outlived_its_runtime_completes_the_run_after_restart(tmp_path):
    row, edge_log, _ = _restart_scenario(tmp_path, fault=None)
    _assert_completed_from_receipt(tmp_path / "home", row, edge_log)


def test_a_receipt_lands_after_a_crash_between_spawn_and_started(tmp_path):
    row, edge_log, _ = _restart_scenario(tmp_path, fault="after_spawn")
    _assert_completed_from_receipt(tmp_path / "home", row, edge_log)
