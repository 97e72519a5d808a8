"""POSIX bytes held in a `str`: the one representation of command words, env values and cwd.

A job's argv items, environment values and working directory are bytes to the kernel. qlactors
holds each as a `str` decoded from those bytes by UTF-8 with `surrogateescape` (the rule
`os.fsdecode` applies on Linux): valid UTF-8 reads as itself, every other byte becomes one lone
surrogate U+DC80..U+DCFF, so encoding gives back exactly the original bytes. Where such a value
leaves the process it takes one form everywhere: msgpack `str` or `bin` on the wire
(qlactors.wire.codec), and in JSON (both databases, `--json` output) either a JSON string or,
for bytes that are not valid UTF-8, `{"base64": "..."}`.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from ..errors import PeerFault

ENCODING = "utf-8"
ERRORS = "surrogateescape"

# A text column (the revision's cwd, always absolute) carries bytes that are not UTF-8 under this
# prefix: a stored absolute path starts with "/", so the two forms can never be confused.
COLUMN_BASE64_PREFIX = "base64:"


class PosixTextError(PeerFault):
    """A value that is not POSIX bytes in the agreed representation (what it is, never the value).

    Its callers say where it came from (a TaskSpecError for a user's value, a refused frame); one
    that reaches a command unconverted came from a row qlactors did not write: no exit status.
    """

    exit_status = None


def posix_bytes(text: str) -> bytes:
    """The bytes `text` stands for; PosixTextError when it holds a character no byte decodes to.

    Only lone surrogates outside U+DC80..U+DCFF can fail: they never come from decoding bytes.
    """
    if type(text) is not str:
        raise PosixTextError(f"expected a string, got {type(text).__name__}")
    try:
        return text.encode(ENCODING, ERRORS)
    except UnicodeEncodeError:
        raise PosixTextError("holds a lone surrogate that stands for no byte") from None


def posix_text(data: bytes) -> str:
    """The `str` form of POSIX bytes (the inverse of posix_bytes)."""
    return bytes(data).decode(ENCODING, ERRORS)


def utf8_or_none(text: str) -> bytes | None:
    """None when `text` is valid UTF-8 text (no escaped byte), else the bytes it stands for."""
    data = posix_bytes(text)
    try:
        data.decode(ENCODING)
    except UnicodeDecodeError:
        return data
    return None


def canonical(text: str) -> str:
    """The same bytes in the one `str` spelling decoding gives (escaped bytes that form UTF-8 read as text)."""
    return posix_text(posix_bytes(text))


def display(text: str) -> str:
    """A printable rendering for humans: bytes that are not UTF-8 shown as `\\xNN`; never raises."""
    try:
        return posix_bytes(text).decode(ENCODING, "backslashreplace")
    except PosixTextError:
        return text.encode(ENCODING, "backslashreplace").decode(ENCODING)


def to_json(text: str) -> str | dict[str, str]:
    """The JSON value for `text`: itself when it is valid UTF-8, else `{"base64": ...}` of its bytes."""
    data = utf8_or_none(text)
    if data is None:
        return canonical(text)
    return {"base64": base64.b64encode(data).decode("ascii")}


def from_json(value: Any) -> str:
    """The `str` a JSON value written by `to_json` stands for; PosixTextError for anything else.

    A plain JSON string is read as itself (rows written before this representation hold lone
    surrogates as `\\udcXX` escapes, which read back as the same bytes).
    """
    if type(value) is str:
        posix_bytes(value)
        return value
    if type(value) is dict and set(value) == {"base64"} and type(value["base64"]) is str:
        try:
            return posix_text(base64.b64decode(value["base64"], validate=True))
        except binascii.Error:
            raise PosixTextError("has a base64 value that is not valid base64") from None
    raise PosixTextError('expected a string or {"base64": "..."}')


def to_column(text: str) -> str:
    """A text-column value for an absolute path: itself when valid UTF-8, else `base64:` + its bytes."""
    data = utf8_or_none(text)
    if data is None:
        return canonical(text)
    return COLUMN_BASE64_PREFIX + base64.b64encode(data).decode("ascii")


def from_column(value: str) -> str:
    """The path a `to_column` value stands for; PosixTextError for a value it cannot have written."""
    if type(value) is str and value.startswith(COLUMN_BASE64_PREFIX):
        return from_json({"base64": value[len(COLUMN_BASE64_PREFIX):]})
    if type(value) is str and value.startswith("/"):
        return value
    raise PosixTextError(f'expected an absolute path or "{COLUMN_BASE64_PREFIX}..."')
