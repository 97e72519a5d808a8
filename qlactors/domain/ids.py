"""UUIDv7 identifiers built from a time and random bytes the caller supplies."""

from __future__ import annotations

import uuid


def uuid7(unix_ms: int, rand: bytes) -> str:
    """A UUIDv7 string: 48 bits of milliseconds, version and variant bits, 74 random bits.

    Ids sort roughly by creation, but ordering always uses explicit time and sequence.
    """
    if len(rand) < 10:
        raise ValueError("uuid7 needs 10 random bytes")
    value = (unix_ms & ((1 << 48) - 1)) << 80
    tail = int.from_bytes(rand[:10], "big")
    value |= (0x7 << 76) | (((tail >> 68) & 0xFFF) << 64)
    value |= (0b10 << 62) | (tail & ((1 << 62) - 1))
    return str(uuid.UUID(int=value))
