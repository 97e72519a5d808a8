"""The one grammar for an instant a user types (qlactors/domain/times.py; `runs --since/--until`):
an ISO 8601 date-time (UTC unless it names an offset) or whole epoch milliseconds."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from qlactors.domain.times import MAX_INSTANT_MS, WHEN_HINT, parse_when_ms
from qlactors.errors import BadInput


def utc_ms(*parts: int) -> int:
    return int(datetime(*parts, tzinfo=timezone.utc).timestamp()) * 1000


@pytest.mark.parametrize("text, ms", [
    ("2026-12-06T05:00:00Z", utc_ms(2026, 12, 6, 5)),
    ("2026-12-06t05:00:00z", utc_ms(2026, 12, 6, 5)),
    ("2026-12-06 05:00:00Z", utc_ms(2026, 12, 6, 5)),
    ("2026-12-06T05:00:00", utc_ms(2026, 12, 6, 5)),  # naive: UTC, never the host's zone
    ("2026-12-06T05:00", utc_ms(2026, 12, 6, 5)),
    ("2026-12-06", utc_ms(2026, 12, 6)),  # a date alone: its midnight UTC
    ("2026-12-06T07:00:00+02:00", utc_ms(2026, 12, 6, 5)),
    ("2026-12-06T00:30:00-04:30", utc_ms(2026, 12, 6, 5)),
    ("2026-12-06T05:00:00.250Z", utc_ms(2026, 12, 6, 5) + 250),
    ("2026-12-06T05:00:00.2509Z", utc_ms(2026, 12, 6, 5) + 250),  # below a millisecond: dropped
    ("1970-01-01T00:00:00Z", 0),
    ("0", 0),
    ("1796533200000", 1_796_533_200_000),
    (str(MAX_INSTANT_MS), MAX_INSTANT_MS),
])
def test_a_date_time_or_epoch_milliseconds_is_its_instant(text, ms):
    assert parse_when_ms("--since", text) == ms


@pytest.mark.parametrize("text", [
    "", " 2026-12-06", "2026-12-06T05:00:00Z ", "yesterday", "2026-12-6", "26-12-06", "2026/12/06",
    "2026-W49-7", "2026-340", "20261206T050000Z", "2026-12-06T05", "2026-12-06T05:00:00,5Z",
    "2026-12-06T05:00:00.1234567Z", "2026-12-06+02:00", "2026-12-06T05:00:00+0200", "+1796533200000",
    "1_796_533_200_000", "1.5", "1e12", "２０２６-12-06", "2026-12-06T05:00:00Z\n",
])
def test_anything_else_is_refused_naming_the_option_and_the_grammar(text):
    with pytest.raises(BadInput) as err:
        parse_when_ms("--until", text)
    assert str(err.value) == f"--until: {text!r} is not a time: {WHEN_HINT}"


@pytest.mark.parametrize("text", ["2026-02-30", "2026-13-01", "2026-12-06T24:00", "2026-12-06T05:60",
                                  "2026-12-06T05:00:60Z", "2026-12-06T05:00+24:00"])
def test_a_date_time_that_names_no_real_instant_is_refused(text):
    with pytest.raises(BadInput, match=r"^--since: .* names no real date-time"):
        parse_when_ms("--since", text)


@pytest.mark.parametrize("text", ["-1", str(MAX_INSTANT_MS + 1), "1969-12-31T23:59:59Z",
                                  "1970-01-01T00:30:00+01:00"])
def test_an_instant_before_the_epoch_or_past_year_9999_is_refused(text):
    with pytest.raises(BadInput, match=r"^--since: .*out of range"):
        parse_when_ms("--since", text)


@pytest.mark.parametrize("value", [None, 5, b"0", "9" * 41])
def test_an_instant_must_be_short_text(value):
    with pytest.raises(BadInput, match=r"is not a time"):
        parse_when_ms("--since", value)
