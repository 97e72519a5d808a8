"""The home's small status files: what Recovery and the disk reserve publish for `status`."""

from __future__ import annotations

import os

import pytest

from qlactors.runtime.home import (DISK_HOLD_FILE, RECOVERY_STATUS_FILE, clear_disk_hold, read_disk_hold,
                           read_recovery_status, write_disk_hold, write_recovery_status)


def test_recovery_status_round_trips_sorted_by_attempt(tmp_path):
    write_recovery_status(tmp_path, {"b-2": "marker unreadable", "a-1": "identity missing"})
    assert read_recovery_status(tmp_path) == [{"attempt_id": "a-1", "why": "identity missing"},
                                              {"attempt_id": "b-2", "why": "marker unreadable"}]
    write_recovery_status(tmp_path, {})  # replaced, not appended
    assert read_recovery_status(tmp_path) == []
    assert sorted(os.listdir(tmp_path)) == [RECOVERY_STATUS_FILE]  # no temp file left behind


def test_disk_hold_is_published_read_and_cleared(tmp_path):
    assert read_disk_hold(tmp_path) is None
    write_disk_hold(tmp_path, free_bytes=10, reserve_bytes=20, path="/logs", since_ms=5)
    assert read_disk_hold(tmp_path) == {"free_bytes": 10, "reserve_bytes": 20, "path": "/logs", "since_ms": 5}
    assert sorted(os.listdir(tmp_path)) == [DISK_HOLD_FILE]
    clear_disk_hold(tmp_path)
    clear_disk_hold(tmp_path)  # clearing twice is fine
    assert read_disk_hold(tmp_path) is None


@pytest.mark.parametrize("text", ["", "{not json", "[1, 2]", '"a string"'])
def test_an_unreadable_status_file_reads_as_nothing(tmp_path, text):
    (tmp_path / RECOVERY_STATUS_FILE).write_text(text)
    (tmp_path / DISK_HOLD_FILE).write_text(text)
    assert read_recovery_status(tmp_path) == []
    assert read_disk_hold(tmp_path) is None


def test_status_files_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        write_recovery_status(tmp_path, {"a-1": "identity missing"})
        write_disk_hold(tmp_path, free_bytes=1, reserve_bytes=2, path="/logs", since_ms=3)
    finally:
        os.umask(old)
    for name in (RECOVERY_STATUS_FILE, DISK_HOLD_FILE):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o600, name
