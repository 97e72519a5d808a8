"""A worker's state directory: layout and modes, and one process at a time (real processes)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap

import pytest

from qlactors.executor.journal.journal import Journal
from qlactors.executor.state_dir import StateDir, StateDirInUse, UnsafeStateDir

HOLD = textwrap.dedent("""
    import sys
    from qlactors.executor.state_dir import StateDir, StateDirInUse
    try:
        state = StateDir(sys.argv[1])
    except StateDirInUse as err:
        print(err, file=sys.stderr)
        sys.exit(3)
    print("locked", flush=True)
    sys.stdin.read()  # hold the lock until the test closes our stdin
    state.close()
""")


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def _start(path):
    return subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_layout_is_private_and_the_journal_opens(tmp_path):
    old = os.umask(0o022)
    try:
        with StateDir(tmp_path / "state") as state:
            assert {_mode(p) for p in (state.path, state.logs, state.receipts)} == {0o700}
            assert _mode(state.journal_path) == 0o600
            assert Journal(state.journal).saved_session() is None
            assert (state.path / "runtime.lock").read_text() == f"{os.getpid()}\n"
    finally:
        os.umask(old)


def test_a_second_process_on_the_same_directory_refuses_at_once(tmp_path):
    path = tmp_path / "state"
    first = _start(path)
    try:
        assert first.stdout.readline() == "locked\n"
        second = _start(path)
        out, err = second.communicate(timeout=60)
        assert second.returncode == 3, err
        assert out == ""
        assert str(path) in err and f"pid {first.pid}" in err
    finally:
        first.communicate(input="", timeout=60)
    assert first.returncode == 0
    third = _start(path)  # the lock went with the first process
    try:
        assert third.stdout.readline() == "locked\n"
    finally:
        third.communicate(input="", timeout=60)


def test_the_same_process_cannot_open_it_twice_and_can_after_close(tmp_path):
    state = StateDir(tmp_path / "state")
    with pytest.raises(StateDirInUse, match="in use by another qlactors worker"):
        StateDir(tmp_path / "state")
    state.close()
    StateDir(tmp_path / "state").close()


def test_a_file_where_the_directory_should_be_is_refused(tmp_path):
    (tmp_path / "state").write_text("not a directory")
    with pytest.raises(UnsafeStateDir, match="not a directory"):
        StateDir(tmp_path / "state")
    with pytest.raises(UnsafeStateDir, match="does not exist"):
        StateDir(tmp_path / "missing" / "state")
