"""Durable process identity from /proc: stat and marker parsing, and liveness of real processes."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import select
import subprocess
import sys

import pytest

from qlactors.process.identity import (
    Liveness,
    ProcessIdentity,
    parse_job_marker,
    parse_marker,
    parse_stat,
    probe,
    read_boot_id,
    read_identity,
    read_marker,
)

BOOT = "726d4321-d7d4-45bc-828a-5b733998c5cf"


def stat_line(comm: str, state: str = "S", pgrp: int = 4242, start: int = 987654) -> str:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
    # stime cutime cstime priority nice threads itreal starttime vsize ...
    after = [state, "1", str(pgrp), "4242", "0", "-1", "4194560", "100", "0", "0", "0", "1", "2",
             "0", "0", "20", "0", "1", "0", str(start), "2412544", "200"]
    return f"4243 ({comm}) " + " ".join(after) + "\n"


# --- parse_stat -------------------------------------------------------------------------------

def test_parse_stat_counts_fields_after_the_last_paren():
    assert parse_stat(stat_line("a) (b c) R 9 9")) == ("S", 4242, 987654)
    assert parse_stat(stat_line("plain", state="Z", pgrp=7, start=1)) == ("Z", 7, 1)


@pytest.mark.parametrize("text", [
    "",
    "garbage",
    "4243 (sh) S 1 2 3",  # too few fields
    "4243 sh S " + " ".join(["1"] * 30),  # no (comm)
    stat_line("sh").replace(" 987654 ", " 98x654 "),  # starttime not a number
    stat_line("sh").replace(" 987654 ", " +987654 "),  # Python's int() would take this
    stat_line("sh").replace(" 4242 4242 ", " -1 4242 "),  # negative pgrp
    stat_line("sh", state="SS"),
])
def test_parse_stat_refuses_garbage(text):
    with pytest.raises(ValueError):
        parse_stat(text)


# --- reading /proc ----------------------------------------------------------------------------

def test_read_identity_of_this_process_matches_proc():
    ident = read_identity(os.getpid())
    assert ident.pid == os.getpid()
    assert ident.pgid == os.getpgid(0)
    assert ident.boot_id == read_boot_id()
    assert ident.start_ticks > 0
    assert read_identity(os.getpid(), boot_id="x").boot_id == "x"


def test_read_identity_of_a_vanished_pid_raises(tmp_path):
    (tmp_path / "sys" / "kernel" / "random").mkdir(parents=True)
    (tmp_path / "sys" / "kernel" / "random" / "boot_id").write_text(BOOT + "\n")
    with pytest.raises(FileNotFoundError):
        read_identity(12345, proc=str(tmp_path))


def _child(code: str = "import sys; sys.stdin.read()") -> subprocess.Popen:
    """A child that lives until its stdin is closed."""
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)


def _wait_exited_unreaped(proc: subprocess.Popen) -> None:
    fd = os.pidfd_open(proc.pid)
    try:
        assert select.select([fd], [], [], 10)[0], "child did not exit"
    finally:
        os.close(fd)


def _end(proc: subprocess.Popen) -> None:
    if proc.returncode is None:
        proc.stdin.close()
        proc.kill()
        proc.wait(timeout=10)
    else:
        proc.stdin.close()


# --- probe ------------------------------------------------------------------------------------

def test_probe_live_child_is_running():
    proc = _child()
    try:
        ident = read_identity(proc.pid)
        assert probe(ident, current_boot_id=read_boot_id()) is Liveness.RUNNING
    finally:
        _end(proc)


def test_probe_zombie_is_not_running():
    proc = _child()
    try:
        ident = read_identity(proc.pid)
        proc.stdin.close()
        _wait_exited_unreaped(proc)  # a zombie now: exited, not reaped
        assert parse_stat(pathlib.Path(f"/proc/{proc.pid}/stat").read_text())[0] == "Z"
        assert read_identity(proc.pid) == ident  # still readable, same identity
        assert probe(ident, current_boot_id=read_boot_id()) is Liveness.NOT_RUNNING
    finally:
        _end(proc)


def test_probe_reaped_child_is_not_running():
    proc = _child()
    try:
        ident = read_identity(proc.pid)
        proc.stdin.close()
        proc.wait(timeout=10)
        assert probe(ident, current_boot_id=read_boot_id()) is Liveness.NOT_RUNNING
    finally:
        _end(proc)


def test_probe_recycled_pid_or_other_group_is_not_running():
    proc = _child()
    try:
        ident = read_identity(proc.pid)
        boot = read_boot_id()
        recycled = dataclasses.replace(ident, start_ticks=ident.start_ticks + 1)
        assert probe(recycled, current_boot_id=boot) is Liveness.NOT_RUNNING
        other_group = dataclasses.replace(ident, pgid=ident.pgid + 1)
        assert probe(other_group, current_boot_id=boot) is Liveness.NOT_RUNNING
    finally:
        _end(proc)


def test_probe_other_boot_is_not_running():
    ident = read_identity(os.getpid())
    assert probe(ident, current_boot_id="00000000-0000-0000-0000-000000000000") is Liveness.NOT_RUNNING


def test_probe_unreadable_or_garbled_stat_is_unknown(tmp_path):
    ident = ProcessIdentity(boot_id=BOOT, pid=77, pgid=77, start_ticks=5)
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "stat").write_text("this is not a stat line")
    assert probe(ident, current_boot_id=BOOT, proc=str(tmp_path)) is Liveness.UNKNOWN
    (tmp_path / "77" / "stat").unlink()
    (tmp_path / "77" / "stat").mkdir()  # IsADirectoryError: an OSError other than "gone"
    assert probe(ident, current_boot_id=BOOT, proc=str(tmp_path)) is Liveness.UNKNOWN


def test_probe_matching_fake_proc_entry_is_running_and_its_zombie_is_not(tmp_path):
    ident = ProcessIdentity(boot_id=BOOT, pid=77, pgid=4242, start_ticks=987654)
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "stat").write_text(stat_line("x) (y"))
    assert probe(ident, current_boot_id=BOOT, proc=str(tmp_path)) is Liveness.RUNNING
    (tmp_path / "77" / "stat").write_text(stat_line("x", state="Z"))
    assert probe(ident, current_boot_id=BOOT, proc=str(tmp_path)) is Liveness.NOT_RUNNING


# --- start marker -----------------------------------------------------------------------------

def test_parse_marker_reads_the_launcher_line():
    ident = parse_marker(f"pid=4243 pgid=4243 start_ticks=987654 boot_id={BOOT}\n")
    assert ident == ProcessIdentity(boot_id=BOOT, pid=4243, pgid=4243, start_ticks=987654)
    assert parse_marker(f"pid=1 pgid=1 start_ticks=0 boot_id={BOOT}") == ProcessIdentity(BOOT, 1, 1, 0)


@pytest.mark.parametrize("text", [
    "",
    "\n",
    f"pid=1 pgid=1 boot_id={BOOT}\n",  # missing key
    f"pid=1 pgid=1 start_ticks=5 boot_id={BOOT} extra=1\n",  # unknown key
    f"pid=1 pid=1 pgid=1 start_ticks=5 boot_id={BOOT}\n",  # duplicate key
    f"pid=x pgid=1 start_ticks=5 boot_id={BOOT}\n",
    f"pid=-1 pgid=1 start_ticks=5 boot_id={BOOT}\n",
    f"pid=0 pgid=0 start_ticks=5 boot_id={BOOT}\n",
    f"pid=1 pgid=1 start_ticks=1_0 boot_id={BOOT}\n",
    f"pid=1 pgid=1 start_ticks= boot_id={BOOT}\n",
    f"pid=1  pgid=1 start_ticks=5 boot_id={BOOT}\n",  # double space
    f"pid=1 pgid=1 start_ticks=5 boot_id={BOOT}\r\n",
    f"pid=1 pgid=1 start_ticks=5 boot_id={BOOT}\n\n",
    "pid=1 pgid=1 start_ticks=5 boot_id=not-a-uuid\n",
    f"pid=1 pgid=1 start_ticks=5 boot_id={BOOT[:-4]}\n",  # torn write
])
def test_parse_marker_is_strict(text):
    with pytest.raises(ValueError):
        parse_marker(text)


def test_a_marker_may_name_the_jobs_own_group_too():
    text = f"pid=4243 pgid=4243 start_ticks=987654 boot_id={BOOT} job_pid=4250 job_start_ticks=987660\n"
    assert parse_marker(text) == ProcessIdentity(BOOT, 4243, 4243, 987654)
    assert parse_job_marker(text) == ProcessIdentity(BOOT, 4250, 4250, 987660)  # its pid is its group
    assert parse_job_marker(f"pid=4243 pgid=4243 start_ticks=987654 boot_id={BOOT}\n") is None


@pytest.mark.parametrize("text", [
    f"pid=1 pgid=1 start_ticks=5 boot_id={BOOT} job_pid=7\n",  # one of the pair
    f"pid=1 pgid=1 start_ticks=5 boot_id={BOOT} job_start_ticks=7\n",
    f"pid=1 pgid=1 start_ticks=5 boot_id={BOOT} job_pid=0 job_start_ticks=7\n",
    f"pid=1 pgid=1 start_ticks=5 boot_id={BOOT} job_pid=x job_start_ticks=7\n",
    f"pid=1 pgid=1 start_ticks=5 boot_id={BOOT} job_pid=7 job_pid=7 job_start_ticks=7\n",
])
def test_a_bad_job_part_of_a_marker_is_refused(text):
    with pytest.raises(ValueError):
        parse_job_marker(text)


def test_read_marker_missing_is_none_and_bad_raises(tmp_path):
    assert read_marker(tmp_path / "absent") is None
    path = tmp_path / "marker"
    path.write_text(f"pid=9 pgid=9 start_ticks=3 boot_id={BOOT}\n")
    assert read_marker(path) == ProcessIdentity(BOOT, 9, 9, 3)
    path.write_bytes(b"pid=9 pgid=9 start_ticks=3 boot_id=\xff\n")
    with pytest.raises(ValueError):
        read_marker(path)
    path.write_bytes(b"x" * 5000)
    with pytest.raises(ValueError):
        read_marker(path)


@pytest.mark.parametrize("data", [
    b"",
    b"pid=9 pgid=9",
    f"pid=9 pgid=9 start_ticks=3 boot_id={BOOT}".encode(),  # the whole line but its newline
])
def test_read_marker_caught_mid_write_is_not_published_yet(tmp_path, data):
    # The launcher writes the marker in place (no temp + rename): empty, or cut short before its
    # newline, it is still being written, not a bad marker.
    path = tmp_path / "marker"
    path.write_bytes(data)
    assert read_marker(path) is None


@pytest.mark.parametrize("data", [
    b"\n",
    b"pid=9 pgid=9\n",
    b"pid=9 pgid=9 start_ticks=3 boot_id=not-a-uuid\n",
    f"pid=9 pgid=9 start_ticks=3 boot_id={BOOT}\n\n".encode(),
])
def test_read_marker_complete_line_that_does_not_parse_raises(tmp_path, data):
    path = tmp_path / "marker"
    path.write_bytes(data)
    with pytest.raises(ValueError):
        read_marker(path)


def test_boot_id_source_reads_proc_unless_a_test_file_stands_in(tmp_path):
    from qlactors.process.identity import BOOT_ID_FILE_ENV, boot_id_source, read_boot_id

    assert boot_id_source({})() == read_boot_id()
    fake = tmp_path / "boot_id"
    fake.write_text("11111111-2222-3333-4444-555555555555\n")
    source = boot_id_source({BOOT_ID_FILE_ENV: str(fake)})
    assert source() == "11111111-2222-3333-4444-555555555555"
    fake.write_text("66666666-2222-3333-4444-555555555555\n")  # a "reboot"
    assert source() == "66666666-2222-3333-4444-555555555555"
