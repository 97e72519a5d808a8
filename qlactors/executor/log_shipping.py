"""Executor side: the worker's half of log shipping (SEMANTICS.md §13): chunks read from the shipped
offset and a bounded window of chunks sent but not yet acknowledged.

The local log is append-only, so the bytes at an offset never change: a chunk is not kept in
memory for a resend, it is read again at its offset and must match the checksum it was sent
with. `LogShipper` is pure bookkeeping (offsets in, offsets out); `next_chunk` and
`chunks_to_send` are the reads. Recording an acknowledged offset in the journal
(`Journal.shipped`) is the caller's, after `acked`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import PeerFault
from ..process import logs

MAX_CHUNK_BYTES = 128 * 1024
DEFAULT_WINDOW = 4


def checksum(data: bytes) -> str:
    """A chunk's checksum as the wire carries it: SHA-256, lowercase hex."""
    return hashlib.sha256(data).hexdigest()


def next_chunk(path: Path | str, offset: int, max_bytes: int = MAX_CHUNK_BYTES) -> tuple[bytes, str]:
    """Up to `max_bytes` of the local log from `offset`, exactly as written, and their checksum.

    Never through a symlink, never anything but a regular file (logs.UnsafeLogPath); b'' at the
    end of what was written so far.
    """
    if not 1 <= max_bytes <= MAX_CHUNK_BYTES:
        raise ValueError(f"a chunk holds 1 to {MAX_CHUNK_BYTES} bytes")
    data = logs.read(path, offset, max_bytes)
    return data, checksum(data)


@dataclass(frozen=True, slots=True)
class Chunk:
    """A chunk sent and not yet acknowledged: where it starts, how long it is, its checksum."""

    offset: int
    length: int
    checksum: str

    @property
    def end(self) -> int:
        return self.offset + self.length


class LogShipper:
    """One attempt's shipping window: `acked_offset` <= each in-flight chunk < `sent_offset`."""

    def __init__(self, acked_offset: int = 0, window: int = DEFAULT_WINDOW) -> None:
        if type(acked_offset) is not int or acked_offset < 0:
            raise ValueError("acked_offset must be a non-negative integer")
        if type(window) is not int or window < 1:
            raise ValueError("the window holds at least one chunk")
        self.window = window
        self.acked_offset = acked_offset
        self.in_flight: list[Chunk] = []

    @property
    def sent_offset(self) -> int:
        """Where the next new chunk starts."""
        return self.in_flight[-1].end if self.in_flight else self.acked_offset

    def has_room(self) -> bool:
        return len(self.in_flight) < self.window

    def sent(self, offset: int, length: int, checksum: str) -> Chunk:
        """Record a new chunk as sent; it must start where the last one ended, within the window."""
        if not self.has_room():
            raise ValueError(f"the window of {self.window} unacknowledged chunks is full")
        if offset != self.sent_offset:
            raise ValueError(f"a new chunk starts at {self.sent_offset}, not {offset}")
        if not 1 <= length <= MAX_CHUNK_BYTES:
            raise ValueError(f"a chunk holds 1 to {MAX_CHUNK_BYTES} bytes")
        chunk = Chunk(offset, length, checksum)
        self.in_flight.append(chunk)
        return chunk

    def acked(self, offset: int) -> bool:
        """The control side holds the log up to `offset` (the end of a chunk it appended, or of
        one it already had); True when that moved the acknowledged offset forward.

        An offset behind the acknowledged one is a late repeat (no change); one past what was
        sent, or inside a chunk, is the control side's error (PeerFault).
        """
        if offset <= self.acked_offset:
            return False
        if offset > self.sent_offset:
            raise PeerFault(f"acknowledged offset {offset} is past the sent offset {self.sent_offset}")
        ends = [c.end for c in self.in_flight]
        if offset not in ends:
            raise PeerFault(f"acknowledged offset {offset} is not the end of a chunk in flight")
        self.in_flight = self.in_flight[ends.index(offset) + 1:]
        self.acked_offset = offset
        return True

    def to_resend(self) -> list[Chunk]:
        """The chunks to send again, in order, after an answer did not come (another replica)."""
        return list(self.in_flight)

    def rewind(self) -> None:
        """Forget what is in flight (a chunk was refused, e.g. a gap after a failover): the next
        chunk starts at the acknowledged offset again."""
        self.in_flight = []

    def done(self, final_offset: int | None) -> bool:
        """Whether the log is acknowledged to its final offset (None: the attempt still runs)."""
        return final_offset is not None and self.acked_offset >= final_offset


def chunks_to_send(shipper: LogShipper, path: Path | str, max_bytes: int = MAX_CHUNK_BYTES,
                   end: int | None = None) -> list[tuple[Chunk, bytes]]:
    """Read and record new chunks while the window has room and the log has new bytes, none
    past `end` (the final offset, once known: what an escaped writer adds after the job's end is
    not the job's, and the control side refuses it)."""
    out: list[tuple[Chunk, bytes]] = []
    while shipper.has_room():
        room = max_bytes if end is None else min(max_bytes, end - shipper.sent_offset)
        if room <= 0:
            break
        data, digest = next_chunk(path, shipper.sent_offset, room)
        if not data:
            break
        out.append((shipper.sent(shipper.sent_offset, len(data), digest), data))
    return out


def reread(chunk: Chunk, path: Path | str) -> bytes:
    """A chunk's bytes for a resend, checked against the checksum it was first sent with."""
    data, digest = next_chunk(path, chunk.offset, chunk.length)
    if len(data) != chunk.length or digest != chunk.checksum:
        raise ValueError(f"log {path} changed under chunk at offset {chunk.offset}: it is append-only")
    return data
