"""Log shipping, the worker's half: exact chunks from an offset, and the bounded window."""

from __future__ import annotations

import hashlib
import os

import pytest

from qlactors.process.logs import UnsafeLogPath
from qlactors.executor.log_shipping import (
    MAX_CHUNK_BYTES,
    LogShipper,
    chunks_to_send,
    next_chunk,
    reread,
)


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "a.log"
    data = os.urandom(3 * MAX_CHUNK_BYTES + 17) + b"\x00\xff\r\n"
    path.write_bytes(data)
    return path, data


def test_next_chunk_reads_exact_bytes_from_the_offset_with_their_sha256(log):
    path, data = log
    chunk, digest = next_chunk(path, 5)
    assert chunk == data[5:5 + MAX_CHUNK_BYTES]
    assert digest == hashlib.sha256(chunk).hexdigest()
    tail, _ = next_chunk(path, len(data) - 3, 100)
    assert tail == data[-3:]
    assert next_chunk(path, len(data)) == (b"", hashlib.sha256(b"").hexdigest())
    with pytest.raises(ValueError):
        next_chunk(path, 0, MAX_CHUNK_BYTES + 1)


def test_next_chunk_never_follows_a_symlink(log, tmp_path):
    path, _ = log
    link = tmp_path / "link.log"
    link.symlink_to(path)
    with pytest.raises(UnsafeLogPath):
        next_chunk(link, 0)


def test_window_is_bounded_and_acks_are_cumulative():
    shipper = LogShipper(acked_offset=10, window=2)
    assert shipper.sent_offset == 10 and shipper.has_room()
    with pytest.raises(ValueError, match="starts at 10"):
        shipper.sent(11, 5, "x")
    first = shipper.sent(10, 5, "a")
    second = shipper.sent(15, 7, "b")
    assert (first.end, second.end, shipper.sent_offset) == (15, 22, 22)
    assert not shipper.has_room()
    with pytest.raises(ValueError, match="full"):
        shipper.sent(22, 1, "c")
    with pytest.raises(ValueError, match="not the end of a chunk"):
        shipper.acked(17)
    with pytest.raises(ValueError, match="past the sent offset"):
        shipper.acked(23)
    assert shipper.acked(22) is True  # acknowledges both
    assert (shipper.acked_offset, shipper.in_flight, shipper.has_room()) == (22, [], True)
    assert shipper.acked(15) is False  # a late repeat
    assert shipper.acked_offset == 22


def test_ack_of_the_first_chunk_keeps_the_rest_in_flight_and_resend_lists_them_in_order():
    shipper = LogShipper(window=3)
    for offset, length in ((0, 4), (4, 4), (8, 4)):
        shipper.sent(offset, length, str(offset))
    assert shipper.acked(4)
    assert [c.offset for c in shipper.to_resend()] == [4, 8]
    shipper.rewind()
    assert (shipper.sent_offset, shipper.to_resend()) == (4, [])


def test_done_only_at_the_final_offset():
    shipper = LogShipper(window=1)
    assert shipper.done(0) and not shipper.done(None)
    shipper.sent(0, 3, "x")
    assert not shipper.done(3)
    shipper.acked(3)
    assert shipper.done(3) and not shipper.done(4)


def test_bad_settings_and_chunks_are_refused():
    with pytest.raises(ValueError):
        LogShipper(window=0)
    with pytest.raises(ValueError):
        LogShipper(acked_offset=-1)
    with pytest.raises(ValueError):
        LogShipper().sent(0, 0, "empty")
    with pytest.raises(ValueError):
        LogShipper().sent(0, MAX_CHUNK_BYTES + 1, "too big")


def test_chunks_to_send_fill_the_window_then_follow_the_acks_to_the_end(log):
    path, data = log
    shipper = LogShipper(window=2)
    shipped = b""
    sent = chunks_to_send(shipper, path)
    assert [c.offset for c, _ in sent] == [0, MAX_CHUNK_BYTES]
    assert chunks_to_send(shipper, path) == []  # the window is full
    while sent:
        for chunk, chunk_data in sent:
            assert chunk.length == len(chunk_data) and reread(chunk, path) == chunk_data
            shipped += chunk_data
            shipper.acked(chunk.end)
        sent = chunks_to_send(shipper, path)
    assert shipped == data and shipper.done(len(data))


def test_reread_refuses_bytes_that_changed(tmp_path):
    path = tmp_path / "a.log"
    path.write_bytes(b"hello world")
    shipper = LogShipper()
    [(chunk, _)] = chunks_to_send(shipper, path)
    path.write_bytes(b"HELLO world")
    with pytest.raises(ValueError, match="append-only"):
        reread(chunk, path)


def test_chunks_to_send_stop_at_the_final_offset(tmp_path):
    """Bytes an escaped writer adds after the job's end are past the final offset: never sent
    (the control side refuses a chunk that passes it)."""
    path = tmp_path / "a.log"
    path.write_bytes(b"the job's log\n" + b"written after its end")
    shipper = LogShipper(window=4)
    sent = chunks_to_send(shipper, path, max_bytes=8, end=14)
    assert [(c.offset, d) for c, d in sent] == [(0, b"the job'"), (8, b"s log\n")]
    assert chunks_to_send(shipper, path, end=14) == []
    assert shipper.sent_offset == 14
