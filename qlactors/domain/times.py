"""The one grammar for an instant a user types (`runs --since/--until`, the HTTP API's filters):
an ISO 8601 date-time, or whole milliseconds since the Unix epoch, as epoch milliseconds."""

from __future__ import annotations

import re
from datetime import datetime, timezone

from ..errors import BadInput
from .numbers import whole_or_none

# A date, optionally a time (minutes, seconds, up to microseconds), optionally `Z` or an offset
# (only after a time). Stricter than `datetime.fromisoformat`, which also takes week dates,
# ordinal dates and a comma for the fraction: a typo must not become an instant.
_ISO = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
                  r"(?:[Tt ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]{1,6})?)?(?:[Zz]|[+-][0-9]{2}:[0-9]{2})?)?",
                  re.ASCII)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
MAX_INSTANT_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the last instant a date-time can name

WHEN_HINT = ("give an ISO 8601 date-time such as 2026-12-06T05:00:00Z (Z or an offset such as +02:00; "
             "without one it is UTC; a date alone is its midnight UTC) or whole milliseconds since the epoch")


def utc_second(ms: int) -> str:
    """Epoch milliseconds as a UTC time to the second: `2026-12-06 05:00:00Z`."""
    return datetime.fromtimestamp(ms // 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def parse_when_ms(option: str, text: object, error: type[BadInput] = BadInput) -> int:
    """An instant as epoch milliseconds (sub-millisecond digits dropped), else `error` naming the option.

    `text` is whole milliseconds since 1970-01-01T00:00:00Z (digits only), or an ISO 8601
    date-time (`YYYY-MM-DD[Thh:mm[:ss[.ffffff]]][Z|±hh:mm]`) read as UTC when it names no offset.
    Instants before the epoch are refused: nothing the runtime stores is older.
    """
    if not isinstance(text, str) or len(text) > 40:
        raise error(f"{option}: {text!r} is not a time: {WHEN_HINT}")
    digits = whole_or_none(text)
    if digits is not None:
        if not 0 <= digits <= MAX_INSTANT_MS:
            raise error(f"{option}: {text} milliseconds is out of range: 0 (1970-01-01T00:00:00Z) to "
                        f"{MAX_INSTANT_MS} (9999-12-31T23:59:59.999Z)")
        return digits
    if _ISO.fullmatch(text) is None:
        raise error(f"{option}: {text!r} is not a time: {WHEN_HINT}")
    try:
        at = datetime.fromisoformat(text.upper().replace("Z", "+00:00"))
    except ValueError:  # no such day or hour (2026-02-30, 25:00, an offset of 24 hours)
        raise error(f"{option}: {text!r} names no real date-time: {WHEN_HINT}") from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=timezone.utc)
    delta = at - _EPOCH
    ms = (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
    if not 0 <= ms <= MAX_INSTANT_MS:
        raise error(f"{option}: {text!r} is out of range: from 1970-01-01T00:00:00Z to 9999-12-31T23:59:59.999Z")
    return ms
