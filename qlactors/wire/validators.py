"""Wire: the annotation-to-validator compiler. Each message class's field annotations
(wire/messages.py) become, once at import, a check per field (and, for PosixStr, its wire
conversions): what the codec applies to every frame it encodes or decodes. A check returns None
for a good value, else a complaint that never echoes the value.
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from typing import Annotated, Literal, Union, get_args, get_origin, get_type_hints

from ..domain import posix
from ..errors import PeerFault
from .messages import MAX_CHUNK_BYTES, MESSAGES, SINCE, Matches, MaxLen, PosixBytes

MAX_STR_BYTES = 64 * 1024  # any one string or bin, in bytes (ids are shorter, see messages.Id)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


# A check returns None for a good value, else a complaint that never echoes the value.
Check = Callable[[object], "str | None"]


# A field whose wire form differs from its Python value (PosixStr): `to_wire` runs after the
# check on encode; `from_wire` runs before it on decode and raises Complaint for a wire value
# the type never produces. Both are None for every other field.
Convert = Callable[[object], object]


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    check: Check
    to_wire: Convert | None = None
    from_wire: Convert | None = None
    since: int = 0  # the protocol version that added it (messages.SINCE); 0: every version


@dataclass(frozen=True, slots=True)
class Schema:
    cls: type
    names: frozenset[str]
    fields: tuple[Field, ...]


class Complaint(PeerFault):
    """A wire value a converter refuses; its text is the complaint (never the value)."""


_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
               bytes: "binary", type(None): "nil", list: "an array", dict: "a map"}


def type_name(value: object) -> str:
    """A msgpack-ish name of a value's type, for complaints that must not echo the value."""
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def short(value: object) -> str:
    """A bounded repr, for names and kinds that may come from a hostile peer."""
    text = repr(value)
    return text if len(text) <= 64 else text[:61] + "..."


def _int_check(v: object) -> str | None:
    if type(v) is not int:  # bool is an int subclass; a flag is never a count
        return f"must be an integer, got {type_name(v)}"
    if not INT64_MIN <= v <= INT64_MAX:
        return "is outside the signed 64-bit range"
    return None


def _bool_check(v: object) -> str | None:
    return None if type(v) is bool else f"must be a boolean, got {type_name(v)}"


def _str_check(v: object) -> str | None:
    if type(v) is not str:
        return f"must be a string, got {type_name(v)}"
    # A str of n characters has at most 4n UTF-8 bytes: encode only when that could matter.
    if len(v) * 4 > MAX_STR_BYTES and len(v.encode("utf-8", "surrogatepass")) > MAX_STR_BYTES:
        return f"is over the {MAX_STR_BYTES}-byte string limit"
    return None


def _list_of(item_check: Check, items: str = "strings") -> Check:
    """An array whose every item passes `item_check` (`items` names them in a complaint)."""
    def check(v: object) -> str | None:
        if type(v) is not list:
            return f"must be an array of {items}, got {type_name(v)}"
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
            return f"must be a map of strings to strings, got {type_name(v)}"
        for key, value in v.items():
            complaint = _str_check(key)
            if complaint is not None:
                return f"key {complaint}"
            complaint = value_check(value)
            if complaint is not None:
                return f"value of key {short(key)} {complaint}"
        return None
    return check


_str_list_check = _list_of(_str_check)
_str_map_check = _map_of(_str_check)


def _posix_check(v: object) -> str | None:
    """A PosixStr as Python holds it: a str standing for at most MAX_STR_BYTES bytes."""
    if type(v) is not str:
        return f"must be a string, got {type_name(v)}"
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
        raise Complaint(f"is over the {MAX_STR_BYTES}-byte string limit")
    try:
        v.decode("utf-8")
    except UnicodeDecodeError:
        return posix.posix_text(v)
    raise Complaint("is binary that is valid UTF-8: such a value travels as a string")


def _posix_in_at(where: str, v: object) -> object:
    try:
        return _posix_in(v)
    except Complaint as err:
        raise Complaint(f"{where} {err}") from None


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
                lambda v: ({k: _posix_in_at(f"value of key {short(k)}", x) for k, x in v.items()}
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
        return f"must be binary, got {type_name(v)}"
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
    schema = schema_of(cls)
    name = cls.__name__

    def check(v: object) -> str | None:
        if type(v) is not cls:
            return f"must be a {name} map, got {type_name(v)}"
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
            raise Complaint(f"has unknown fields [{', '.join(sorted(map(short, unknown))[:8])}]")
        missing = [f.name for f in schema.fields if f.name not in v]
        if missing:
            raise Complaint(f"lacks fields {missing}")
        values = {}
        for f in schema.fields:
            value = v[f.name]
            if f.from_wire is not None:
                try:
                    value = f.from_wire(value)
                except Complaint as err:
                    raise Complaint(f"field {f.name} {err}") from None
            complaint = f.check(value)
            if complaint is not None:
                raise Complaint(f"field {f.name} {complaint}")
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
                except Complaint as err:
                    raise Complaint(f"item {i} {err}") from None
            return out
        return list_check, (lambda v: [item_out(x) for x in v]), list_in  # type: ignore[attr-defined]
    if origin in (Union, types.UnionType) and len(args) == 2 and type(None) in args:
        inner_tp = next(a for a in args if a is not type(None))
        if _is_record(inner_tp):
            check, out, into = _record_plan(inner_tp)
            return ((lambda v: None if v is None else check(v)),
                    (lambda v: None if v is None else out(v)),
                    (lambda v: None if v is None else into(v)))
    return (compile_type(tp), *(_posix_converters(tp) or (None, None)))


def compile_type(tp: object) -> Check:
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
        inner = compile_type(next(a for a in args if a is not type(None)))
        return lambda v: None if v is None else inner(v)
    if origin is Literal and args and all(type(a) is str for a in args):
        allowed = frozenset(args)
        choices = " | ".join(args)

        def literal_check(v: object) -> str | None:
            if type(v) is not str:
                return f"must be a string, got {type_name(v)}"
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


def schema_of(cls: type) -> Schema:
    """A message class's checks, from its annotations (read once, at import)."""
    hints = get_type_hints(cls, include_extras=True)
    names = [f.name for f in fields(cls)]
    if "kind" in names:
        raise TypeError(f"{cls.__name__} may not have a field named 'kind': the body's tag uses it")
    since = {f.name: f.metadata.get(SINCE, 0) for f in fields(cls)}
    return Schema(cls, frozenset(names), tuple(Field(name, *_field_plan(hints[name]), since=since[name])
                                               for name in names))


# Built at import, so a message with a field the codec cannot check fails `import`, not traffic.
SCHEMAS: dict[str, Schema] = {kind: schema_of(cls) for kind, cls in MESSAGES.items()}
