"""Domain: UUIDv7 identifiers built from a time and random bytes the caller supplies."""

from __future__ import annotations

import uuid

_COUNTER_BITS = 74  # rand_a (12 bits) and rand_b (62 bits), RFC 9562 §5.7
_MS_MASK = (1 << 48) - 1


def uuid7(unix_ms: int, rand: bytes) -> str:
    """A UUIDv7 string: 48 bits of milliseconds, version and variant bits, 74 random bits.

    Ids sort roughly by creation, but ordering always uses explicit time and sequence.
    """
    if len(rand) < 10:
        raise ValueError("uuid7 needs 10 random bytes")
    tail = int.from_bytes(rand[:10], "big")
    return _compose(unix_ms, (((tail >> 68) & 0xFFF) << 62) | (tail & ((1 << 62) - 1)))


def uuid7_after(previous: str | None, unix_ms: int, rand: bytes) -> str:
    """A UUIDv7 greater than `previous` (None: any): `uuid7(unix_ms, rand)` when that is greater,
    else `previous` with its 74 random bits plus one (RFC 9562 §6.2, method 2), so ids made one
    after another sort in the order they were made, even within one millisecond or when the clock
    steps back; past the last counter value, the next millisecond."""
    fresh = uuid7(unix_ms, rand)
    if previous is None or fresh > previous:  # canonical lowercase hex: text order is numeric order
        return fresh
    value = uuid.UUID(previous).int
    ms, counter = value >> 80, (((value >> 64) & 0xFFF) << 62) | (value & ((1 << 62) - 1))
    if counter + 1 < 1 << _COUNTER_BITS:
        return _compose(ms, counter + 1)
    return _compose(ms + 1, 0)


def _compose(unix_ms: int, counter: int) -> str:
    value = (unix_ms & _MS_MASK) << 80
    value |= (0x7 << 76) | ((counter >> 62) << 64)
    value |= (0b10 << 62) | (counter & ((1 << 62) - 1))
    return str(uuid.UUID(int=value))
