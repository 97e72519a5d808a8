"""Wire: the versioned msgpack codec: a message is two frames, a header and a body checked field by field
(the checks compiled by validators.py)."""

from __future__ import annotations

from typing import Any

import msgpack

from ..errors import PeerFault, QlactorsError
from .validators import MAX_STR_BYTES, SCHEMAS, Complaint, short, type_name

PROTOCOL = b"QLACTORS"
# 2: batched offers, numbered heartbeats with renewals, resume, Decline, LogChunk, Attest quoting
# its lease (issue 10). 3: Leave, a worker's drain (issue 11). 4: the exchange (issue 17): a
# `request_id` on every request, `answer_to` on every answer, `register_id` on Register. 5
# (issue 26): `Welcome.heartbeat_seq`, `HeartbeatAck.last_seq` (fields marked `SINCE` 5 in
# messages.py). Register names the range a worker speaks; Welcome the version agreed, the highest
# both speak, so replicas and workers are upgraded one at a time:
# - a frame is written in the version its reader speaks: a replica writes to a worker in the
#   version agreed with that worker's peer (PROTOCOL_MIN while it knows none: a replica that did
#   not answer its Register); a worker writes its requests in PROTOCOL_MIN, since protocol 5
#   added nothing to them, so every replica of the range reads them;
# - a frame of an older version lacks the fields added since (they take their defaults).
VERSION = 5
PROTOCOL_MIN, PROTOCOL_MAX = 4, VERSION
# The first frame of every message (Majordomo's `MDPW01` habit): a peer on another version is
# recognised before its body is read, and refused by name.
HEADERS = {v: PROTOCOL + b"/" + str(v).encode("ascii") for v in range(PROTOCOL_MIN, PROTOCOL_MAX + 1)}
HEADER = HEADERS[VERSION]
_VERSION_OF = {header: v for v, header in HEADERS.items()}

MAX_FRAME_BYTES = 256 * 1024

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
        self.ours = f"{PROTOCOL_MIN}..{PROTOCOL_MAX}"
        super().__init__(
            f"peer speaks protocol {PROTOCOL.decode()}/{theirs}, this side speaks "
            f"{PROTOCOL.decode()}/{self.ours}: upgrade the older side to a release that speaks the other's", frames)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.theirs, list(self.frames)))


class EncodeError(QlactorsError, ValueError):
    """A message this side must not send: the peer's decoder would refuse it."""


def encode(message: object, protocol: int = VERSION) -> list[bytes]:
    """The two frames of a registered message in version `protocol` of the range: [its header,
    msgpack map of its kind and the fields that version has] (a field added later is not sent).

    The fields are checked by the same rules decode applies, so a bad value fails here, at
    its origin, and not as a refusal on the other side. Tuples go out as msgpack arrays.
    """
    cls = type(message)
    kind = getattr(cls, "KIND", None)
    schema = SCHEMAS.get(kind) if type(kind) is str else None
    if schema is None or schema.cls is not cls:
        raise EncodeError(f"{cls.__name__} is not a registered wire message")
    header = HEADERS.get(protocol)
    if header is None:
        raise EncodeError(f"protocol {protocol!r} is not in {PROTOCOL_MIN}..{PROTOCOL_MAX}")
    body: dict[str, object] = {"kind": kind}
    for f in schema.fields:
        if f.since > protocol:
            continue
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
    return [header, packed]


def decode(frames: list[bytes], protocols: range = range(PROTOCOL_MIN, PROTOCOL_MAX + 1)) -> object:
    """The message two frames carry, or DecodeError: the only exception this function raises.

    The header is read first, so a peer on a version outside `protocols` (by default the range
    this release speaks) gets VersionMismatch naming both whatever its frames look like. The body
    must be one msgpack map holding a known kind and exactly the fields its header's version gives
    that message, each of exactly its annotated type; a field added later takes its default.
    """
    if type(frames) not in (list, tuple):
        raise DecodeError(f"frames must be a list of bytes, got {type_name(frames)}", frames)
    if not frames:
        raise DecodeError("no frames: expected 2 (header, body)", frames)
    header = _as_bytes(frames[0], "header", frames)
    protocol = _VERSION_OF.get(header)
    if protocol is None or protocol not in protocols:
        prefix = PROTOCOL + b"/"
        if header.startswith(prefix) and len(header) > len(prefix):
            theirs = header[len(prefix):len(prefix) + _KEPT_VERSION_CHARS]
            raise VersionMismatch(theirs.decode("ascii", "backslashreplace"), frames)
        raise DecodeError(f"first frame is not a {PROTOCOL.decode()}/{PROTOCOL_MIN}..{PROTOCOL_MAX} header", frames)
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
    return _build(obj, frames, protocol)


# --- internals -----------------------------------------------------------------------------

class _Refused(PeerFault):
    """Raised from inside the unpacker's hook; decode turns it into a DecodeError."""


def _build(obj: object, frames: object, protocol: int) -> object:
    """Check an unpacked body against its kind's schema and construct the message."""
    if type(obj) is not dict:
        raise DecodeError(f"body must be a msgpack map, got {type_name(obj)}", frames)
    if any(type(key) is not str for key in obj):
        raise DecodeError("body map keys must be strings", frames)
    kind = obj.pop("kind", None)
    if kind is None:
        raise DecodeError("body has no 'kind'", frames)
    if type(kind) is not str:
        raise DecodeError(f"body 'kind' must be a string, got {type_name(kind)}", frames)
    schema = SCHEMAS.get(kind)
    if schema is None:
        raise DecodeError(f"unknown kind {short(kind)}", frames)
    carried = [f for f in schema.fields if f.since <= protocol]
    unknown = set(obj) - {f.name for f in carried}
    if unknown:
        names = ", ".join(sorted(map(short, unknown))[:8])
        raise DecodeError(f"{kind} has unknown fields [{names}]", frames)
    missing = [f.name for f in carried if f.name not in obj]
    if missing:
        raise DecodeError(f"{kind} lacks fields {missing}", frames)
    for f in carried:
        if f.from_wire is not None:
            try:
                obj[f.name] = f.from_wire(obj[f.name])
            except Complaint as err:
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
            raise _Refused(f"map has the key {short(key)} more than once")
        result[key] = value
    return result


def _as_bytes(frame: object, which: str, frames: object) -> bytes:
    """A frame as bytes; bytes, bytearray, memoryview and zmq.Frame all pass."""
    if type(frame) is bytes:
        return frame
    try:
        return memoryview(frame).tobytes()  # type: ignore[arg-type]
    except TypeError:
        raise DecodeError(f"{which} frame must be bytes, got {type_name(frame)}", frames) from None


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


