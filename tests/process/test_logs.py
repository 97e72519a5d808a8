"""Per-attempt log files: exclusive 0600 creation, no symlink following, byte-exact reads and follow."""

from __future__ import annotations

import io
import os
import stat
import threading

import pytest

from qlactors.process import logs
from qlactors.process.logs import LogStore, UnsafeLogPath

RUN = "run-0190a1b2"
ATTEMPT = "att-0190a1b2_c3d4"


@pytest.fixture
def store(tmp_path) -> LogStore:
    return LogStore(tmp_path / "logs")


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_path_is_deterministic_and_sharded_by_a_hash(store):
    artifact = store.artifact_id(RUN, ATTEMPT)
    shard, name = artifact.split("/")
    assert len(shard) == 2 and int(shard, 16) >= 0 and name == f"{ATTEMPT}.log"
    assert store.path_for(RUN, ATTEMPT) == store.root / artifact
    assert LogStore(store.root).artifact_id(RUN, ATTEMPT) == artifact
    shards = {store.artifact_id(RUN, f"att-{i}").split("/")[0] for i in range(64)}
    assert len(shards) > 16  # a hash, not a shared id prefix
    with pytest.raises(ValueError):
        store.artifact_id("run/..", ATTEMPT)


def test_create_gives_an_empty_file_with_private_modes(store):
    path = store.create(RUN, ATTEMPT)
    assert path == store.path_for(RUN, ATTEMPT)
    assert path.read_bytes() == b""
    assert mode(path) == 0o600
    assert mode(path.parent) == 0o700 and mode(store.root) == 0o700


def test_create_again_for_a_re_offered_attempt_empties_and_reuses_its_own_file(store):
    """An offer proves the attempt never activated: a file an earlier offer of it left is reused."""
    path = store.create(RUN, ATTEMPT)
    path.write_bytes(b"left by an earlier offer")
    path.chmod(0o644)
    assert store.create(RUN, ATTEMPT) == path
    assert path.read_bytes() == b""
    assert mode(path) == 0o600


def test_create_refuses_a_hard_link_or_a_fifo_at_the_log_path_and_leaves_it(store, tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"mine")
    path = store.path_for(RUN, ATTEMPT)
    path.parent.mkdir(parents=True)
    os.link(victim, path)
    with pytest.raises(UnsafeLogPath):
        store.create(RUN, ATTEMPT)
    assert victim.read_bytes() == b"mine"
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(UnsafeLogPath):  # at once: never waits for a reader
        store.create(RUN, ATTEMPT)


def test_create_under_a_restrictive_umask_still_gives_0600(store):
    old = os.umask(0o077)
    try:
        path = store.create(RUN, ATTEMPT)
    finally:
        os.umask(old)
    assert mode(path) == 0o600


def test_planted_symlink_makes_create_fail_without_following(store, tmp_path):
    victim = tmp_path / "victim"
    path = store.path_for(RUN, ATTEMPT)
    path.parent.mkdir(parents=True)
    path.symlink_to(victim)
    with pytest.raises(UnsafeLogPath):
        store.create(RUN, ATTEMPT)
    assert not victim.exists()
    victim.write_bytes(b"mine")
    with pytest.raises(UnsafeLogPath):
        store.create(RUN, ATTEMPT)
    assert victim.read_bytes() == b"mine"


def test_symlinked_shard_directory_is_refused(store, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shard = store.path_for(RUN, ATTEMPT).parent
    store.ensure()
    shard.symlink_to(elsewhere)
    with pytest.raises(UnsafeLogPath):
        store.create(RUN, ATTEMPT)
    assert list(elsewhere.iterdir()) == []


def test_read_returns_exact_bytes_from_an_offset(store):
    path = store.create(RUN, ATTEMPT)
    data = b"ok\n\x00\xff\xfe caf\xc3\xa9 \xc3(\x00\n" * 3
    path.write_bytes(data)
    assert store.read(path, 0) == data
    assert store.read(path, 5) == data[5:]
    assert logs.read(path, 5, max_bytes=7) == data[5:12]
    assert store.read(path, len(data)) == b""
    assert store.read(path, len(data) + 100) == b""
    with pytest.raises(ValueError):
        store.read(path, -1)


def test_read_refuses_a_symlink_and_a_fifo(store, tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"secret")
    link = tmp_path / "link.log"
    link.symlink_to(secret)
    with pytest.raises(UnsafeLogPath):
        store.read(link, 0)
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeLogPath):
        store.read(fifo, 0)


def test_read_is_bounded(store):
    path = store.create(RUN, ATTEMPT)
    path.write_bytes(b"a" * 300_000)
    assert len(store.read(path, 0)) == 256 * 1024


def test_follow_copies_appended_bytes_until_done(store):
    path = store.create(RUN, ATTEMPT)
    path.write_bytes(b"before\xff")
    chunks = [b"one\x00", b"\xc3(two", b"three" * 20_000]
    done = threading.Event()
    appended = threading.Event()

    class Out(io.BytesIO):
        def write(self, b):
            n = super().write(b)
            appended.set()
            return n

    def writer():
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            for chunk in chunks:
                appended.clear()
                os.write(fd, chunk)
                # wait until the follower has copied something new, so the test really
                # interleaves writes and reads instead of racing them
                appended.wait(5)
        finally:
            os.close(fd)
        done.set()

    out = Out()
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        end = store.follow(path, 6, done.is_set, poll_s=0.01, out=out)
    finally:
        thread.join(10)
    expected = b"\xff" + b"".join(chunks)
    assert out.getvalue() == expected
    assert end == 6 + len(expected)


def test_follow_of_a_finished_log_drains_and_returns(store):
    path = store.create(RUN, ATTEMPT)
    path.write_bytes(b"x" * 200_000)
    out = io.BytesIO()
    assert store.follow(path, 0, lambda: True, out=out, chunk_bytes=4096) == 200_000
    assert out.getvalue() == b"x" * 200_000


def test_free_bytes_is_a_plausible_number(store):
    path = store.create(RUN, ATTEMPT)
    st = os.statvfs(path)
    assert store.free_bytes(path) == st.f_bavail * st.f_frsize
    assert logs.free_bytes(path) >= 0
