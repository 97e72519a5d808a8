"""The versioned msgpack codec: a message is two frames, a header and a body checked field by field."""

from __future__ import annotations

import re
import types
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

import msgpack

from ..domain import posix
from ..errors import PeerFault, QlactorsError
from .messages import MAX_CHUNK_BYTES, MESSAGES, Matches, MaxLen, PosixBytes

PROTOCOL = b"QLACTORS"
# 2: batched offers, numbered heartbeats with renewals, resume, Decline, LogChunk, Attest quoting
# its lease (issue 10). 3: Leave, a worker's drain (issue 11). 4: the exchange (issue 17): a
# `request_id` on every request, `answer_to` on every answer, `register_id` on Register. Register
# names the range a worker speaks; Welcome the version agreed. A new kind is not understood by the older version, so each
# release speaks one version only.
VERSION = 4
PROTOCOL_MIN = PROTOCOL_MAX = VERSION
# The first frame of every message (Majordomo's `MDPW01` habit): a peer on another version is
# recognised before its body is read, and refused by name.
HEADER = PROTOCOL + b"/" + str(VERSION).encode("ascii")

MAX_FRAME_BYTES = 256 * 1024
MAX_STR_BYTES = 64 * 1024  # any one string or bin, in bytes (ids are shorter, see messages.Id)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# How much of a refused message DecodeError keeps for the log line.
KEPT_FRAMES = 4
KEPT_FRAME_BYTES = 1024
_KEPT_VERSION_CHARS = 32

__all__ = [
    "HEADER", "MAX_FRAME_BYTES", "MAX_STR_BYTES", "PROTOCOL", "VERSION",
    "DecodeError", "EncodeError", "VersionMismatch", "decode", "encode",
]


class DecodeError(PeerFault):
    """Frames the codec refuses: `reason` says why, `frames` keeps their first bytes for the log.

    `frames` holds at most KEPT_FRAMES frames of at most KEPT_FRAME_BYTES each (None for an
    item that was not bytes), and `frame_sizes` their full sizes. `str()` never shows frame
    bytes: a body may hold a lease token, a callback token or a job's environment.
    """

    def __init__(self, reason: str, frames: object) -> None:
        self.reason = reason
        self.frames, self.frame_sizes, self.frame_count = _keep(frames)
        super().__init__(reason)  # not the bytes: repr() of the error must not show them either

    def __str__(self) -> str:
        return f"{self.reason} ({self.frame_count} frames, sizes {list(self.frame_sizes)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason, list(self.frames)))


class VersionMismatch(DecodeError):
    """The peer speaks another version of the protocol; `theirs` and `ours` name both."""

    def __init__(self, theirs: str, frames: object) -> None:
        self.theirs = theirs
        self.ours = str(VERSION)
        super().__init__(
            f"peer speaks protocol {PROTOCOL.decode()}/{theirs}, this side speaks "
            f"{PROTOCOL.decode()}/{VERSION}: run the same qlactors version on both sides", frames)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.theirs, list(self.frames)))


class EncodeError(QlactorsError, ValueError):
    """A message this side must not send: the peer's decoder would refuse it."""


def encode(message: object) -> list[bytes]:
    """The two frames of a registered message: [HEADER, msgpack map of its kind and fields].

    The fields are checked by the same rules decode applies, so a bad value fails here, at
    its origin, and not as a refusal on the other side. Tuples go out as msgpack arrays.
    """
    cls = type(message)
    kind = getattr(cls, "KIND", None)
    schema = _SCHEMAS.get(kind) if type(kind) is str else None
    if schema is None or schema.cls is not cls:
        raise EncodeError(f"{cls.__name__} is not a registered wire message")
    body: dict[str, object] = {"kind": kind}
    for f in schema.fields:
        value = getattr(message, f.name)
        if type(value) is tuple:
            value = list(value)
        complaint = f.check(value)
        if complaint is not None:
            raise EncodeError(f"{kind}.{f.name} {complaint}")
        body[f.name] = value if f.to_wire is None else f.to_wire(value)
    try:
        packed = msgpack.packb(body, use_bin_type=True)
    except (ValueError, TypeError, OverflowError) as err:  # e.g. a lone surrogate in a str
        raise EncodeError(f"{kind} cannot be packed: {type(err).__name__}") from err
    if len(packed) > MAX_FRAME_BYTES:
        raise EncodeError(f"{kind} is {len(packed)} bytes packed, over the {MAX_FRAME_BYTES}-byte limit")
    return [HEADER, packed]


def decode(frames: list[bytes]) -> object:
    """The message two frames carry, or DecodeError: the only exception this function raises.

    The header is read first, so a peer on another version gets VersionMismatch naming both
    versions whatever its frames look like. The body must be one msgpack map holding a known
    kind and exactly that message's fields, each of exactly its annotated type.
    """
    if type(frames) not in (list, tuple):
        raise DecodeError(f"frames must be a list of bytes, got {_name(frames)}", frames)
    if not frames:
        raise DecodeError("no frames: expected 2 (header, body)", frames)
    header = _as_bytes(frames[0], "header", frames)
    if header != HEADER:
        prefix = PROTOCOL + b"/"
        if header.startswith(prefix) and len(header) > len(prefix):
            theirs = header[len(prefix):len(prefix) + _KEPT_VERSION_CHARS]
            raise VersionMismatch(theirs.decode("ascii", "backslashreplace"), frames)
        raise DecodeError(f"first frame is not the {HEADER.decode()} header", frames)
    if len(frames) != 2:
        raise DecodeError(f"expected 2 frames (header, body), got {len(frames)}", frames)
    body = _as_bytes(frames[1], "body", frames)
    # Size first: no unpacking work is spent on an oversized frame. unpackb itself then bounds
    # every string, array and map by len(body) (msgpack 1.x has no max_buffer_size there).
    if len(body) > MAX_FRAME_BYTES:
        raise DecodeError(f"body is {len(body)} bytes, over the {MAX_FRAME_BYTES}-byte limit", frames)
    try:
        obj = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True,
                              object_pairs_hook=_unique_map)
    except _Refused as err:
        raise DecodeError(f"body {err.args[0]}", frames) from None
    # Untrusted bytes may make the C unpacker raise ExtraData, FormatError, StackError,
    # ValueError (truncated input, bad UTF-8, non-str keys), TypeError or others besides:
    # the contract is DecodeError and nothing else.
    except Exception as err:
        raise DecodeError(f"body is not one msgpack value: {type(err).__name__}: {str(err)[:160]}",
                          frames) from err
    return _build(obj, frames)


# --- internals -----------------------------------------------------------------------------

# A check returns None for a good value, else a complaint that never echoes the value.
Check = Callable[[object], "str | None"]


# A field whose wire form differs from its Python value (PosixStr): `to_wire` runs after the
# check on encode; `from_wire` runs before it on decode and raises _Complaint for a wire value
# the type never produces. Both are None for every other field.
Convert = Callable[[object], object]


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    check: Check
    to_wire: Convert | None = None
    from_wire: Convert | None = None


@dataclass(frozen=True, slots=True)
class _Schema:
    cls: type
    names: frozenset[str]
    fields: tuple[_Field, ...]


class _Complaint(PeerFault):
    """A wire value a converter refuses; its text is the complaint (never the value)."""


class _Refused(PeerFault):
    """Raised from inside the unpacker's hook; decode turns it into a DecodeError."""


def _build(obj: object, frames: object) -> object:
    """Check an unpacked body against its kind's schema and construct the message."""
    if type(obj) is not dict:
        raise DecodeError(f"body must be a msgpack map, got {_name(obj)}", frames)
    if any(type(key) is not str for key in obj):
        raise DecodeError("body map keys must be strings", frames)
    kind = obj.pop("kind", None)
    if kind is None:
        raise DecodeError("body has no 'kind'", frames)
    if type(kind) is not str:
        raise DecodeError(f"body 'kind' must be a string, got {_name(kind)}", frames)
    schema = _SCHEMAS.get(kind)
    if schema is None:
        raise DecodeError(f"unknown kind {_short(kind)}", frames)
    unknown = set(obj) - schema.names
    if unknown:
        names = ", ".join(sorted(map(_short, unknown))[:8])
        raise DecodeError(f"{kind} has unknown fields [{names}]", frames)
    missing = [f.name for f in schema.fields if f.name not in obj]
    if missing:
        raise DecodeError(f"{kind} lacks fields {missing}", frames)
    for f in schema.fields:
        if f.from_wire is not None:
            try:
                obj[f.name] = f.from_wire(obj[f.name])
            except _Complaint as err:
                raise DecodeError(f"{kind}.{f.name} {err}", frames) from None
        complaint = f.check(obj[f.name])
        if complaint is not None:
            raise DecodeError(f"{kind}.{f.name} {complaint}", frames)
    return schema.cls(**obj)


def _unique_map(pairs: list[tuple[object, object]]) -> dict[object, object]:
    """Build a map, refusing duplicate keys (plain unpacking keeps the last one silently)."""
    result: dict[object, object] = {}
    for key, value in pairs:
        if key in result:
            raise _Refused(f"map has the key {_short(key)} more than once")
        result[key] = value
    return result


def _as_bytes(frame: object, which: str, frames: object) -> bytes:
    """A frame as bytes; bytes, bytearray, memoryview and zmq.Frame all pass."""
    if type(frame) is bytes:
        return frame
    try:
        return memoryview(frame).tobytes()  # type: ignore[arg-type]
    except TypeError:
        raise DecodeError(f"{which} frame must be bytes, got {_name(frame)}", frames) from None


def _keep(frames: object) -> tuple[tuple[bytes | None, ...], tuple[int, ...], int]:
    """(first bytes of the first frames, their full sizes, the frame count) for DecodeError."""
    if type(frames) not in (list, tuple):
        frames = [frames]
    kept: list[bytes | None] = []
    sizes: list[int] = []
    for frame in frames[:KEPT_FRAMES]:  # type: ignore[index]
        if isinstance(frame, (bytes, bytearray)):
            kept.append(bytes(frame[:KEPT_FRAME_BYTES]))
            sizes.append(len(frame))
            continue
        try:
            view = memoryview(frame)  # type: ignore[arg-type]
        except TypeError:
            kept.append(None)
            sizes.append(-1)
            continue
        sizes.append(view.nbytes)
        # Slice before copying: a refused frame may be large.
        kept.append(view.cast("B")[:KEPT_FRAME_BYTES].tobytes() if view.c_contiguous
                    else view.tobytes()[:KEPT_FRAME_BYTES])
    return tuple(kept), tuple(sizes), len(frames)  # type: ignore[arg-type]


_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
               bytes: "binary", type(None): "nil", list: "an array", dict: "a map"}


def _name(value: object) -> str:
    """A msgpack-ish name of a value's type, for complaints that must not echo the value."""
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _short(value: object) -> str:
    """A bounded repr, for names and kinds that may come from a hostile peer."""
    text = repr(value)
    return text if len(text) <= 64 else text[:61] + "..."


def _int_check(v: object) -> str | None:
    if type(v) is not int:  # bool is an int subclass; a flag is never a count
        return f"must be an integer, got {_name(v)}"
    if not INT64_MIN <= v <= INT64_MAX:
        return "is outside the signed 64-bit range"
    return None


def _bool_check(v: object) -> str | None:
    return None if type(v) is bool else f"must be a boolean, got {_name(v)}"


def _str_check(v: object) -> str | None:
    if type(v) is not str:
        return f"must be a string, got {_name(v)}"
    # A str of n characters has at most 4n UTF-8 bytes: encode only when that could matter.
    if len(v) * 4 > MAX_STR_BYTES and len(v.encode("utf-8", "surrogatepass")) > MAX_STR_BYTES:
        return f"is over the {MAX_STR_BYTES}-byte string limit"
    return None


def _list_of(item_check: Check, items: str = "strings") -> Check:
    """An array whose every item passes `item_check` (`items` names them in a complaint)."""
    def check(v: object) -> str | None:
        if type(v) is not list:
            return f"must be an array of {items}, got {_name(v)}"
        for i, item in enumerate(v):
            complaint = item_check(item)
            if complaint is not None:
                return f"item {i} {complaint}"
        return None
    return check


def _map_of(value_check: Check) -> Check:
    """A map of strings to values that pass `value_check`."""
    def check(v: object) -> str | None:
        if type(v) is not dict:
            return f"must be a map of strings to strings, got {_name(v)}"
        for key, value in v.items():
            complaint = _str_check(key)
            if complaint is not None:
                return f"key {complaint}"
            complaint = value_check(value)
            if complaint is not None:
                return f"value of key {_short(key)} {complaint}"
        return None
    return check


_str_list_check = _list_of(_str_check)
_str_map_check = _map_of(_str_check)


def _posix_check(v: object) -> str | None:
    """A PosixStr as Python holds it: a str standing for at most MAX_STR_BYTES bytes."""
    if type(v) is not str:
        return f"must be a string, got {_name(v)}"
    try:
        size = len(posix.posix_bytes(v))
    except posix.PosixTextError as err:
        return str(err)
    return f"is over the {MAX_STR_BYTES}-byte string limit" if size > MAX_STR_BYTES else None


def _posix_out(v: object) -> object:
    """A checked PosixStr on the wire: msgpack str for valid UTF-8, bin for any other bytes."""
    data = posix.utf8_or_none(v)  # type: ignore[arg-type]
    return posix.canonical(v) if data is None else data  # type: ignore[arg-type]


def _posix_in(v: object) -> object:
    """A PosixStr off the wire: a bin back to its str; a bin holding valid UTF-8 is not canonical."""
    if type(v) is not bytes:
        return v  # the check names what is wrong with it
    if len(v) > MAX_STR_BYTES:
        raise _Complaint(f"is over the {MAX_STR_BYTES}-byte string limit")
    try:
        v.decode("utf-8")
    except UnicodeDecodeError:
        return posix.posix_text(v)
    raise _Complaint("is binary that is valid UTF-8: such a value travels as a string")


def _posix_in_at(where: str, v: object) -> object:
    try:
        return _posix_in(v)
    except _Complaint as err:
        raise _Complaint(f"{where} {err}") from None


def _posix_converters(tp: object) -> tuple[Convert, Convert] | None:
    """(to_wire, from_wire) for a field holding PosixStr values, or None for any other field."""
    if _is_posix(tp):
        return _posix_out, _posix_in
    origin, args = get_origin(tp), get_args(tp)
    if origin is list and len(args) == 1 and _is_posix(args[0]):
        return (lambda v: [_posix_out(x) for x in v],  # type: ignore[attr-defined]
                lambda v: [_posix_in_at(f"item {i}", x) for i, x in enumerate(v)] if type(v) is list else v)
    if origin is dict and len(args) == 2 and args[0] is str and _is_posix(args[1]):
        return (lambda v: {k: _posix_out(x) for k, x in v.items()},  # type: ignore[attr-defined]
                lambda v: ({k: _posix_in_at(f"value of key {_short(k)}", x) for k, x in v.items()}
                           if type(v) is dict else v))
    if origin in (Union, types.UnionType) and len(args) == 2 and type(None) in args:
        inner = _posix_converters(next(a for a in args if a is not type(None)))
        if inner is not None:
            out, into = inner
            return (lambda v: None if v is None else out(v), lambda v: None if v is None else into(v))
    return None


def _is_posix(tp: object) -> bool:
    return get_origin(tp) is Annotated and get_args(tp)[0] is str and any(
        isinstance(marker, PosixBytes) for marker in get_args(tp)[1:])


def _bytes_check(v: object) -> str | None:
    if type(v) is not bytes:
        return f"must be binary, got {_name(v)}"
    return f"is over the {MAX_CHUNK_BYTES}-byte limit" if len(v) > MAX_CHUNK_BYTES else None


_PLAIN: dict[object, Check] = {int: _int_check, bool: _bool_check, str: _str_check, bytes: _bytes_check}


def _is_record(tp: object) -> bool:
    """A nested record: a dataclass that is not a message (no KIND)."""
    return isinstance(tp, type) and is_dataclass(tp) and not hasattr(tp, "KIND")


def _record_plan(cls: type) -> tuple[Check, Convert, Convert]:
    """(check, to_wire, from_wire) of a record: a map of exactly its fields, each by its own rules.

    Decoding checks every field while it builds the record, and the message's field check then
    checks the built record once more: the same check encode applies, so one rule serves both.
    """
    schema = _schema(cls)
    name = cls.__name__

    def check(v: object) -> str | None:
        if type(v) is not cls:
            return f"must be a {name} map, got {_name(v)}"
        for f in schema.fields:
            value = getattr(v, f.name)
            complaint = f.check(list(value) if type(value) is tuple else value)
            if complaint is not None:
                return f"field {f.name} {complaint}"
        return None

    def to_wire(v: object) -> object:
        out = {}
        for f in schema.fields:
            value = getattr(v, f.name)
            if type(value) is tuple:
                value = list(value)
            out[f.name] = value if f.to_wire is None else f.to_wire(value)
        return out

    def from_wire(v: object) -> object:
        if type(v) is not dict:
            return v  # the check names what is wrong with it
        unknown = set(v) - schema.names
        if unknown:
            raise _Complaint(f"has unknown fields [{', '.join(sorted(map(_short, unknown))[:8])}]")
        missing = [f.name for f in schema.fields if f.name not in v]
        if missing:
            raise _Complaint(f"lacks fields {missing}")
        values = {}
        for f in schema.fields:
            value = v[f.name]
            if f.from_wire is not None:
                try:
                    value = f.from_wire(value)
                except _Complaint as err:
                    raise _Complaint(f"field {f.name} {err}") from None
            complaint = f.check(value)
            if complaint is not None:
                raise _Complaint(f"field {f.name} {complaint}")
            values[f.name] = value
        return cls(**values)

    return check, to_wire, from_wire




def _field_plan(tp: object) -> tuple[Check, Convert | None, Convert | None]:
    """(check, to_wire, from_wire) for one field annotation; TypeError for one the wire cannot carry."""
    origin, args = get_origin(tp), get_args(tp)
    if _is_record(tp):
        return _record_plan(tp)  # type: ignore[arg-type]
    if origin is list and len(args) == 1 and _is_record(args[0]):
        item_check, item_out, item_in = _record_plan(args[0])
        list_check = _list_of(item_check, f"{args[0].__name__} maps")

        def list_in(v: object) -> object:
            if type(v) is not list:
                return v
            out = []
            for i, item in enumerate(v):
                try:
                    out.append(item_in(item))
                except _Complaint as err:
                    raise _Complaint(f"item {i} {err}") from None
            return out
        return list_check, (lambda v: [item_out(x) for x in v]), list_in  # type: ignore[attr-defined]
    if origin in (Union, types.UnionType) and len(args) == 2 and type(None) in args:
        inner_tp = next(a for a in args if a is not type(None))
        if _is_record(inner_tp):
            check, out, into = _record_plan(inner_tp)
            return ((lambda v: None if v is None else check(v)),
                    (lambda v: None if v is None else out(v)),
                    (lambda v: None if v is None else into(v)))
    return (_compile(tp), *(_posix_converters(tp) or (None, None)))


def _compile(tp: object) -> Check:
    """The check for one field annotation; TypeError for an annotation the wire cannot carry."""
    if tp in _PLAIN:
        return _PLAIN[tp]  # type: ignore[index]
    origin, args = get_origin(tp), get_args(tp)
    if origin is list and args == (str,):
        return _str_list_check
    if origin is dict and args == (str, str):
        return _str_map_check
    if _is_posix(tp):
        if len(get_args(tp)) != 2:
            raise TypeError("PosixStr takes no other wire constraint")
        return _posix_check
    if origin is list and len(args) == 1 and _is_posix(args[0]):
        return _list_of(_posix_check)
    if origin is dict and len(args) == 2 and args[0] is str and _is_posix(args[1]):
        return _map_of(_posix_check)
    if origin in (Union, types.UnionType) and len(args) == 2 and type(None) in args:
        inner = _compile(next(a for a in args if a is not type(None)))
        return lambda v: None if v is None else inner(v)
    if origin is Literal and args and all(type(a) is str for a in args):
        allowed = frozenset(args)
        choices = " | ".join(args)

        def literal_check(v: object) -> str | None:
            if type(v) is not str:
                return f"must be a string, got {_name(v)}"
            return None if v in allowed else f"must be one of {choices}"
        return literal_check
    if origin is Annotated and args[0] is str:
        return _constrained_str(args[1:])
    raise TypeError(f"the wire cannot carry a field of type {tp!r}")


def _constrained_str(markers: tuple[object, ...]) -> Check:
    """A string check narrowed by MaxLen / Matches markers."""
    max_chars: int | None = None
    patterns: list[re.Pattern[str]] = []
    for marker in markers:
        if isinstance(marker, MaxLen):
            max_chars = marker.chars
        elif isinstance(marker, Matches):
            patterns.append(re.compile(marker.pattern))
        else:
            raise TypeError(f"unknown wire constraint {marker!r}")

    def check(v: object) -> str | None:
        complaint = _str_check(v)
        if complaint is not None:
            return complaint
        if max_chars is not None and len(v) > max_chars:  # type: ignore[arg-type]
            return f"is longer than {max_chars} characters"
        for pattern in patterns:
            if pattern.fullmatch(v) is None:  # type: ignore[arg-type]
                return f"must match {pattern.pattern}"
        return None
    return check


def _schema(cls: type) -> _Schema:
    """A message class's checks, from its annotations (read once, at import)."""
    hints = get_type_hints(cls, include_extras=True)
    names = [f.name for f in fields(cls)]
    if "kind" in names:
        raise TypeError(f"{cls.__name__} may not have a field named 'kind': the body's tag uses it")
    return _Schema(cls, frozenset(names), tuple(_Field(name, *_field_plan(hints[name])) for name in names))


# Built at import, so a message with a field the codec cannot check fails `import`, not traffic.
_SCHEMAS: dict[str, _Schema] = {kind: _schema(cls) for kind, cls in MESSAGES.items()}
