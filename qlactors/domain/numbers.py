"""The one grammar for numbers a user types (docs/cli.md, "Numbers"): plain decimal digits only.

Python's `int()` and `float()` accept far more than a user means: `1_000`, ` 5 `, `+5`, `1e3`,
`nan`, `inf`, `٣` (non-ASCII digits). A typo must not become a value, so options take only
`[-]DIGITS` (whole numbers) or `[-]DIGITS[.DIGITS]` (decimals), ASCII, no exponent, no sign but
a leading `-` (kept so that a negative value is refused by its range with a clear message).
"""

from __future__ import annotations

import re
from decimal import Decimal

from ..errors import BadInput

_WHOLE = re.compile(r"-?[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"-?[0-9]+(?:\.[0-9]+)?", re.ASCII)
_MAX_DIGITS = 40  # far beyond every bound; keeps a pasted megabyte of digits cheap to refuse


WHOLE_HINT = "is not a whole number (digits only, e.g. 5)"


def whole_or_none(text: object) -> int | None:
    """`[-]DIGITS` as an int, None for anything else."""
    if not isinstance(text, str) or len(text) > _MAX_DIGITS or _WHOLE.fullmatch(text) is None:
        return None
    return int(text, 10)


def parse_whole(option: str, text: object, error: type[BadInput] = BadInput) -> int:
    """`[-]DIGITS` as an int, else `error` (a BadInput) naming the option."""
    value = whole_or_none(text)
    if value is None:
        raise error(f"{option}: {text!r} {WHOLE_HINT}")
    return value


def parse_decimal(option: str, text: object, unit: str, error: type[BadInput] = BadInput) -> Decimal:
    """`[-]DIGITS[.DIGITS]` as an exact Decimal, else `error` naming the option and the unit."""
    if not isinstance(text, str) or len(text) > _MAX_DIGITS or _DECIMAL.fullmatch(text) is None:
        raise error(f"{option}: {text!r} is not a number of {unit} (digits with an optional "
                       "fraction, e.g. 2.5; no exponent, '_' or spaces)")
    return Decimal(text)
