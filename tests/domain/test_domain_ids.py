"""UUIDv7 ids (qlactors/domain/ids.py, qlactors/ids.py): the layout, and ids made one after another
sort in the order they were made, within one millisecond and when the clock steps back."""

from __future__ import annotations

import os
import uuid

import pytest

from qlactors import ids
from qlactors.domain.ids import uuid7, uuid7_after

MS = 1_700_000_000_123
LAST_COUNTER = b"\xff" * 10  # every random bit set: the counter's last value


def test_a_uuid7_carries_its_millisecond_version_and_variant():
    value = uuid.UUID(uuid7(MS, os.urandom(10)))
    assert (value.int >> 80, value.version, value.variant) == (MS, 7, uuid.RFC_4122)


def test_uuid7_needs_ten_random_bytes():
    with pytest.raises(ValueError):
        uuid7(MS, b"\x00" * 9)


def test_a_later_millisecond_gives_a_fresh_id():
    first = uuid7(MS, LAST_COUNTER)
    assert uuid7_after(first, MS + 1, b"\x00" * 10) == uuid7(MS + 1, b"\x00" * 10)
    assert uuid7_after(None, MS, b"\x01" * 10) == uuid7(MS, b"\x01" * 10)


@pytest.mark.parametrize("clock_ms", [MS, MS - 5_000])  # the same millisecond; a clock stepped back
def test_an_id_made_in_the_same_or_an_earlier_millisecond_is_the_previous_plus_one(clock_ms):
    first = uuid7(MS, b"\x80" + b"\x00" * 9)
    after = uuid7_after(first, clock_ms, b"\x00" * 10)  # random bytes that alone would sort lower
    assert after > first and uuid.UUID(after).int == uuid.UUID(first).int + 1
    assert (uuid.UUID(after).int >> 80, uuid.UUID(after).version, uuid.UUID(after).variant) == (MS, 7, uuid.RFC_4122)


def test_the_counter_carries_across_the_variant_bits_and_past_its_end_into_the_next_millisecond():
    low_full = uuid7(MS, b"\x00\x0f" + b"\xff" * 8)  # rand_b (62 bits) all ones: the carry goes to rand_a
    carried = uuid.UUID(uuid7_after(low_full, MS, b"\x00" * 10))
    assert carried.variant == uuid.RFC_4122 and carried.int >> 80 == MS and str(carried) > low_full
    last = uuid7(MS, LAST_COUNTER)
    nxt = uuid.UUID(uuid7_after(last, MS, b"\x00" * 10))
    assert (nxt.int >> 80, nxt.version, nxt.variant) == (MS + 1, 7, uuid.RFC_4122) and str(nxt) > last


def test_new_ids_sort_in_the_order_they_were_made():
    made = [ids.new_id() for _ in range(5_000)]  # many share a millisecond
    assert made == sorted(made) and len(set(made)) == len(made)
    assert sum(a[:13] == b[:13] for a, b in zip(made, made[1:])) > 0  # the same-millisecond case was met
