"""The wire codec: every message round-trips, and every malformed frame is refused with DecodeError."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import pickle
import re
import tokenize
import types
from typing import Annotated, ClassVar, Literal, Union, get_args, get_origin, get_type_hints

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qlactors.wire.messages as messages_module
from qlactors.domain.posix import posix_text
from qlactors.domain.states import CancelReason
from qlactors.wire import codec
from qlactors.wire.codec import (
    HEADER,
    KEPT_FRAME_BYTES,
    MAX_FRAME_BYTES,
    MAX_STR_BYTES,
    DecodeError,
    EncodeError,
    VersionMismatch,
    decode,
    encode,
)
from qlactors.wire.validators import INT64_MAX, INT64_MIN, compile_type, schema_of
from qlactors.wire.messages import (
    ACK_RESULTS,
    CONTROL_TO_EXECUTOR,
    EXECUTOR_TO_CONTROL,
    MAX_ID_CHARS,
    MESSAGES,
    STOP_REASONS,
    Ack,
    Activate,
    Attest,
    Completed,
    FencedReport,
    Heartbeat,
    HeartbeatAck,
    Matches,
    MaxLen,
    Nudge,
    Decline,
    FencedLease,
    LeaseRef,
    Offer,
    Offers,
    OfferSlot,
    PosixBytes,
    Pull,
    Renewed,
    Started,
    StartFailed,
    Unactivated,
    Welcome,
    LogChunk,
)

# Classes in messages.py that are not messages: the fence base and the annotation markers.
RECORDS = {OfferSlot, LeaseRef, Unactivated, Renewed, FencedLease, Offer}
NOT_MESSAGES = {FencedReport, MaxLen, Matches, PosixBytes} | RECORDS
FENCE_FIELDS = ["worker_id", "session_id", "session_generation", "run_id", "attempt_id",
                "offer_id", "lease_generation", "lease_token", "lease_version"]
ID_FIELDS = {"run_id", "attempt_id", "offer_id", "session_id"}
ALL_CLASSES = list(MESSAGES.values())


# --- samples built from the annotations ------------------------------------------------------

def _hints(cls: type) -> dict[str, object]:
    return {f.name: get_type_hints(cls, include_extras=True)[f.name] for f in dataclasses.fields(cls)}


def _sample_value(tp: object) -> object:
    """One valid value of a field annotation."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is int:
        return 7
    if tp is bool:
        return True
    if tp is str:
        return "x"
    if tp is bytes:
        return b"\x00\xff"
    if tp in RECORDS:
        return sample(tp)
    if origin is Annotated:
        for marker in args[1:]:
            if isinstance(marker, Matches):
                return "ab" * 32
        return "id-1"
    if origin is Literal:
        return args[0]
    if origin in (Union, types.UnionType):
        return _sample_value(next(a for a in args if a is not type(None)))
    if origin is list and args[0] in RECORDS:
        return [sample(args[0])]
    if origin is list:
        return ["a", "b"]
    if origin is dict:
        return {"K": "v"}
    raise AssertionError(f"no sample for {tp!r}")


def sample(cls: type) -> object:
    return cls(**{name: _sample_value(tp) for name, tp in _hints(cls).items()})


_text = st.text(max_size=40)


def _strategy(tp: object) -> st.SearchStrategy[object]:
    """Any valid value of a field annotation, as hypothesis draws it."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is int:
        return st.integers(INT64_MIN, INT64_MAX)
    if tp is bool:
        return st.booleans()
    if tp is str:
        return _text
    if tp is bytes:
        return st.binary(max_size=40)
    if tp in RECORDS:
        return _message_strategy(tp)
    if origin is Annotated:
        for marker in args[1:]:
            if isinstance(marker, Matches):
                return st.from_regex(re.compile(marker.pattern), fullmatch=True)
            if isinstance(marker, MaxLen):
                return st.text(max_size=marker.chars)
            if isinstance(marker, PosixBytes):  # any bytes at all, held as os.fsdecode holds them
                return st.binary(max_size=40).map(posix_text)
        raise AssertionError(f"no strategy for {tp!r}")
    if origin is Literal:
        return st.sampled_from(args)
    if origin in (Union, types.UnionType):
        return st.none() | _strategy(next(a for a in args if a is not type(None)))
    if origin is list:
        return st.lists(_strategy(args[0]), max_size=3 if args[0] in RECORDS else 5)
    if origin is dict:
        return st.dictionaries(_text, _strategy(args[1]), max_size=5)
    raise AssertionError(f"no strategy for {tp!r}")


def _message_strategy(cls: type) -> st.SearchStrategy[object]:
    return st.fixed_dictionaries({name: _strategy(tp) for name, tp in _hints(cls).items()}).map(
        lambda kw: cls(**kw))


any_message = st.sampled_from(ALL_CLASSES).flatmap(_message_strategy)


def body_of(message: object) -> dict[str, object]:
    """The unpacked body map of a message, to be tampered with."""
    return msgpack.unpackb(encode(message)[1], raw=False)


def in_offers(offer: Offer) -> Offers:
    """An Offer travels only inside an Offers batch."""
    return Offers(answer_to="q", worker_id="w", session_id="s", session_generation=1, pull_id="p", offers=[offer])


def offer_body(offer: Offer) -> dict[str, object]:
    """The unpacked map of one offer inside its Offers body."""
    return body_of(in_offers(offer))["offers"][0]


def offers_frames(offer_map: dict[str, object]) -> list[bytes]:
    """Frames of an Offers body holding one (maybe tampered) offer map."""
    return frames_of({**body_of(in_offers(sample(Offer))), "offers": [offer_map]})


def frames_of(body: object) -> list[bytes]:
    return [HEADER, msgpack.packb(body, use_bin_type=True)]


def refused(frames: object, fragment: str) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        decode(frames)  # type: ignore[arg-type]
    assert fragment in info.value.reason, info.value.reason
    return info.value


# --- the registry and the classes ------------------------------------------------------------

def test_registry_holds_every_message_class_in_the_module_once():
    defined = {obj for _, obj in inspect.getmembers(messages_module, inspect.isclass)
               if obj.__module__ == messages_module.__name__}
    assert defined - NOT_MESSAGES == set(MESSAGES.values())
    assert all(MESSAGES[cls.KIND] is cls for cls in defined - NOT_MESSAGES)
    assert len({cls.KIND for cls in ALL_CLASSES}) == len(ALL_CLASSES) == 20
    assert all(re.fullmatch(r"[a-z]+(_[a-z]+)*", kind) for kind in MESSAGES)
    assert set(EXECUTOR_TO_CONTROL).isdisjoint(CONTROL_TO_EXECUTOR)
    assert not hasattr(FencedReport, "KIND")


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.KIND)
def test_messages_are_frozen_slotted_keyword_only_dataclasses(cls):
    params = cls.__dataclass_params__
    assert params.frozen and "__slots__" in cls.__dict__
    message = sample(cls)
    assert not hasattr(message, "__dict__")
    if dataclasses.fields(cls):
        name = dataclasses.fields(cls)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(message, name, getattr(message, name))
        with pytest.raises(TypeError):
            cls(*[getattr(message, f.name) for f in dataclasses.fields(cls)])


def test_fenced_reports_quote_the_whole_fence():
    fenced = {cls for cls in ALL_CLASSES if issubclass(cls, FencedReport)}
    assert fenced == {Activate, Started, StartFailed, Decline}
    for cls in fenced:
        assert [f.name for f in dataclasses.fields(cls)][:10] == ["request_id", *FENCE_FIELDS]
    # Completed is authenticated by its callback token, not the fence.
    assert not issubclass(Completed, FencedReport)


def test_literal_vocabularies_match_the_domain():
    assert ACK_RESULTS == {"applied", "already_terminal", "fenced", "refused"}
    assert STOP_REASONS == {r.value for r in CancelReason}


def test_id_fields_are_bounded_wherever_they_appear():
    for cls in ALL_CLASSES + sorted(RECORDS, key=lambda c: c.__name__):
        for name, tp in _hints(cls).items():
            if name in ID_FIELDS or name.endswith("session_id"):
                if get_origin(tp) in (Union, types.UnionType):  # an optional id is bounded too
                    tp = next(a for a in get_args(tp) if a is not type(None))
                assert get_origin(tp) is Annotated and MaxLen(MAX_ID_CHARS) in get_args(tp), (cls, name)


def _field_comments() -> dict[tuple[str, str], bool]:
    """(class, field) -> whether the field has a comment on its line or is named in the docstring."""
    source = inspect.getsource(messages_module)
    comment_lines = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                     if tok.type == tokenize.COMMENT}
    found = {}
    for node in ast.parse(source).body:
        markers = {MaxLen.__name__, Matches.__name__}
        if not isinstance(node, ast.ClassDef) or node.name in markers:
            continue
        doc = ast.get_docstring(node) or ""
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and "ClassVar" not in ast.unparse(stmt.annotation):
                name = stmt.target.id  # type: ignore[attr-defined]
                found[(node.name, name)] = stmt.lineno in comment_lines or f"`{name}`" in doc
    return found


def test_every_field_is_documented():
    found = _field_comments()
    assert len(found) > 50
    assert [key for key, documented in found.items() if not documented] == []


def test_secrets_stay_out_of_repr():
    pull = Pull(request_id="q", worker_id="w", session_id="s", session_generation=1, pull_id="p",
                offers=[OfferSlot(offer_id="o", lease_token="LEASE-SECRET")])
    completed = dataclasses.replace(sample(Completed), token="CALLBACK-SECRET")
    offers = in_offers(dataclasses.replace(sample(Offer), env={"PASSWORD": "ENV-SECRET"}))
    decline = dataclasses.replace(sample(Decline), lease_token="LEASE-SECRET")
    heartbeat = dataclasses.replace(sample(Heartbeat), renewals=[
        dataclasses.replace(sample(LeaseRef), lease_token="LEASE-SECRET")])
    welcome = dataclasses.replace(sample(Welcome), resume_secret="RESUME-SECRET")
    text = " ".join(map(repr, [pull, completed, offers, decline, heartbeat, welcome]))
    assert "SECRET" not in text and "PASSWORD" not in text
    assert "offer_id='o'" in text


# --- round trips -----------------------------------------------------------------------------

@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.KIND)
def test_every_kind_round_trips(cls):
    message = sample(cls)
    frames = encode(message)
    assert len(frames) == 2 and frames[0] == HEADER == b"QLACTORS/5"
    assert all(type(f) is bytes for f in frames)
    body = msgpack.unpackb(frames[1], raw=False)
    values = dataclasses.asdict(message)  # records nested in a message travel as maps
    assert body == {"kind": cls.KIND, **values}
    decoded = decode(frames)
    assert type(decoded) is cls and decoded == message


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(any_message)
def test_any_valid_message_round_trips(message):
    assert decode(encode(message)) == message


def test_nudge_has_no_fields_and_a_one_key_body():
    assert dataclasses.fields(Nudge) == ()
    assert encode(Nudge())[1] == msgpack.packb({"kind": "nudge"})


def test_tuples_go_out_as_arrays_and_come_back_as_lists():
    offer = dataclasses.replace(sample(Offer), argv=("/bin/echo", "hi"))
    assert decode(encode(in_offers(offer))).offers[0].argv == ["/bin/echo", "hi"]


def test_optional_fields_carry_none():
    attest = Attest(request_id="q", worker_id="w", session_id="s", session_generation=2, run_id="r", attempt_id="a",
                    lease=None, lease_session_id=None, lease_session_generation=None, fact="ended",
                    stopped_by=None, new_slot=None, boot_id=None, pid=None, pgid=None, start_ticks=None)
    assert decode(encode(attest)) == attest
    offers = in_offers(dataclasses.replace(sample(Offer), cwd=None, timeout_ms=None))
    assert decode(encode(offers)) == offers


def test_extreme_but_valid_values_pass():
    long_id = "r" * MAX_ID_CHARS
    big = dataclasses.replace(sample(Completed), run_id=long_id, started_at_ms=INT64_MIN,
                              finished_at_ms=INT64_MAX, token="t" * MAX_STR_BYTES)
    assert decode(encode(big)) == big


@pytest.mark.parametrize("make", [bytearray, memoryview, zmq.Frame],
                         ids=["bytearray", "memoryview", "zmq.Frame"])
def test_frames_may_be_any_bytes_like(make):
    frames = encode(sample(Heartbeat))
    assert decode([make(f) for f in frames]) == sample(Heartbeat)


# --- refusals: frames and header ---------------------------------------------------------------

def test_one_frame_is_refused():
    refused([HEADER], "expected 2 frames")


def test_three_frames_are_refused():
    refused(encode(Nudge()) + [b""], "expected 2 frames")


def test_no_frames_and_non_list_frames_are_refused():
    refused([], "no frames")
    refused(b"QLACTORS/1", "must be a list")
    refused([HEADER, "not bytes"], "body frame must be bytes")
    refused([None, b""], "header frame must be bytes")


@pytest.mark.parametrize("header", [b"QLACTORZ/1", b"qlactors/1", b"", b"QLACTORS", b"QLACTORS/",
                                    b"MDPW01", b"\xff" * 2000])
def test_a_wrong_header_is_refused(header):
    error = refused([header, encode(Nudge())[1]], "header")
    assert not isinstance(error, VersionMismatch)


@pytest.mark.parametrize("version", [b"1", b"2", b"3", b"0", b"10", b"1.1", b"04"])
def test_another_version_is_refused_naming_both_versions(version):
    with pytest.raises(VersionMismatch) as info:
        decode([b"QLACTORS/" + version, b"\x80"])
    error = info.value
    assert isinstance(error, DecodeError)
    assert error.theirs == version.decode() and error.ours == "4..5"
    assert f"QLACTORS/{version.decode()}" in str(error) and "QLACTORS/4..5" in str(error)


def test_the_version_is_judged_before_the_frame_count():
    # A future version may use another frame layout; its peer must still hear "wrong version".
    with pytest.raises(VersionMismatch):
        decode([b"QLACTORS/6"])
    with pytest.raises(VersionMismatch):
        decode([b"QLACTORS/6", b"a", b"b", b"c"])


def test_a_protocol_4_frame_lacks_the_fields_added_in_5_and_decodes_with_their_defaults():
    """Issue 26: Register/Welcome negotiate 4..5; a frame is written in its reader's version."""
    welcome = dataclasses.replace(sample(Welcome), heartbeat_seq=41)
    old = encode(welcome, 4)
    assert old[0] == b"QLACTORS/4" and "heartbeat_seq" not in msgpack.unpackb(old[1], raw=False)
    assert decode(old) == dataclasses.replace(welcome, heartbeat_seq=None)
    assert decode(old, range(4, 5)) == dataclasses.replace(welcome, heartbeat_seq=None)  # a protocol-4 reader
    new = encode(welcome)
    assert new[0] == b"QLACTORS/5" and decode(new) == welcome
    with pytest.raises(VersionMismatch):
        decode(new, range(4, 5))  # a protocol-4 reader refuses a 5 frame by name
    body = msgpack.unpackb(new[1], raw=False)
    refused([b"QLACTORS/4", msgpack.packb(body)], "unknown fields")  # 4 has no heartbeat_seq
    del body["heartbeat_seq"]
    refused([b"QLACTORS/5", msgpack.packb(body)], "lacks fields")  # 5 must carry it
    ack = dataclasses.replace(sample(HeartbeatAck), last_seq=7)
    assert decode(encode(ack, 4)).last_seq is None and decode(encode(ack)).last_seq == 7
    with pytest.raises(EncodeError):
        encode(welcome, 3)


def test_a_hostile_version_string_is_bounded_in_the_error():
    with pytest.raises(VersionMismatch) as info:
        decode([b"QLACTORS/" + b"9\xff" * 5000, b""])
    assert len(info.value.theirs) < 200 and len(str(info.value)) < 500


def test_an_oversize_body_is_refused_before_unpacking(monkeypatch):
    def boom(*_a, **_k):
        raise AssertionError("unpacked an oversize frame")
    monkeypatch.setattr(codec.msgpack, "unpackb", boom)
    error = refused([HEADER, b"\x00" * (MAX_FRAME_BYTES + 1)], "over the")
    assert error.frame_sizes == (len(HEADER), MAX_FRAME_BYTES + 1)


def test_a_body_of_exactly_the_limit_is_unpacked():
    # a valid msgpack str of a size that makes the whole body exactly MAX_FRAME_BYTES
    payload = b"\xdb" + (MAX_FRAME_BYTES - 5).to_bytes(4, "big") + b"a" * (MAX_FRAME_BYTES - 5)
    assert len(payload) == MAX_FRAME_BYTES
    refused([HEADER, payload], "body must be a msgpack map, got a string")


# --- refusals: the body ------------------------------------------------------------------------

@pytest.mark.parametrize("body", [b"", b"\xc1", b"\xff\xfe\xfd garbage", b"\x92\x01", b"\xa3ab",
                                  b"\x81\xa4kind"], ids=["empty", "reserved", "garbage", "short-array",
                                                        "short-str", "short-map"])
def test_garbage_and_truncated_bodies_are_refused(body):
    refused([HEADER, body], "not one msgpack value")


def test_a_truncated_real_message_is_refused():
    frames = encode(sample(Offers))
    for cut in range(len(frames[1])):
        with pytest.raises(DecodeError):
            decode([HEADER, frames[1][:cut]])


def test_trailing_data_is_refused():
    header, body = encode(sample(Heartbeat))
    refused([header, body + b"\xc0"], "ExtraData")
    refused([header, body + body], "ExtraData")


def test_an_array_body_is_refused():
    refused([HEADER, msgpack.packb(["heartbeat", "w"])], "must be a msgpack map, got an array")


@pytest.mark.parametrize("value", [1, "heartbeat", None, 1.5, b"bin"])
def test_a_body_that_is_not_a_map_is_refused(value):
    refused(frames_of(value), "must be a msgpack map")


def test_non_string_map_keys_are_refused():
    refused([HEADER, msgpack.packb({1: "x", "kind": "nudge"})], "not one msgpack value")
    refused([HEADER, msgpack.packb({b"kind": "nudge"}, use_bin_type=True)], "keys must be strings")
    env_with_bytes_key = {**offer_body(sample(Offer)), "env": {b"K": "v"}}
    refused(offers_frames(env_with_bytes_key), "offers.offers item 0 field env key must be a string, got binary")


class _Raw(bytes):
    """Bytes spliced into a hand-built msgpack map as they are."""


def _raw_map(pairs: list[tuple[str, object]]) -> bytes:
    """A msgpack map built pair by pair, so that it may repeat a key (packb cannot)."""
    n = len(pairs)
    head = bytes([0x80 | n]) if n < 16 else b"\xde" + n.to_bytes(2, "big")
    return head + b"".join(
        msgpack.packb(k) + (v if isinstance(v, _Raw) else msgpack.packb(v, use_bin_type=True))
        for k, v in pairs)


def test_duplicate_keys_are_refused():
    # Without the pairs hook the last value would win silently.
    refused([HEADER, _raw_map([("kind", "log_ack"), ("attempt_id", "a"), ("attempt_id", "b")])],
            "key 'attempt_id' more than once")
    refused([HEADER, _raw_map([("kind", "nudge"), ("kind", "nudge")])], "more than once")
    env = _Raw(_raw_map([("K", "1"), ("K", "2")]))
    pairs = [(k, env if k == "env" else v) for k, v in body_of(sample(Completed)).items()]
    pairs = [(k, v) for k, v in body_of(sample(Activate)).items()]
    offer_pairs = [(k, env if k == "env" else v) for k, v in offer_body(sample(Offer)).items()]
    outer = [(k, _Raw(b"\x91" + _raw_map(offer_pairs)) if k == "offers" else v)
             for k, v in body_of(in_offers(sample(Offer))).items()]
    refused([HEADER, _raw_map(outer)], "key 'K' more than once")
    assert decode([HEADER, _raw_map(pairs)]) == sample(Activate)


def test_unknown_kind_is_refused():
    refused(frames_of({"kind": "launch_missiles"}), "unknown kind 'launch_missiles'")
    refused(frames_of({**body_of(sample(Decline)), "kind": "fenced_report"}), "unknown kind")
    refused(frames_of({**offer_body(sample(Offer)), "kind": "offer"}), "unknown kind 'offer'")


def test_a_missing_or_non_string_kind_is_refused():
    body = body_of(sample(Heartbeat))
    del body["kind"]
    refused(frames_of(body), "no 'kind'")
    refused(frames_of({**body, "kind": 3}), "'kind' must be a string")
    refused(frames_of({**body, "kind": b"heartbeat"}), "'kind' must be a string")


@pytest.mark.parametrize("cls", [c for c in ALL_CLASSES if dataclasses.fields(c)], ids=lambda c: c.KIND)
def test_a_missing_field_is_refused(cls):
    body = body_of(sample(cls))
    name = dataclasses.fields(cls)[-1].name
    del body[name]
    refused(frames_of(body), f"{cls.KIND} lacks fields ['{name}']")


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.KIND)
def test_an_extra_field_is_refused(cls):
    body = {**body_of(sample(cls)), "priority": 1}
    refused(frames_of(body), f"{cls.KIND} has unknown fields ['priority']")


def test_a_missing_optional_field_is_refused_too():
    body = body_of(sample(Completed))
    del body["log_dropped_bytes"]
    refused(frames_of(body), "lacks fields ['log_dropped_bytes']")


# (message class, field, wrong value, complaint fragment)
WRONG_VALUES = [
    (Heartbeat, "free_slots", True, "must be an integer, got a boolean"),
    (Heartbeat, "free_slots", False, "must be an integer, got a boolean"),
    (Heartbeat, "free_slots", 1.0, "must be an integer, got a float"),
    (Heartbeat, "free_slots", "1", "must be an integer, got a string"),
    (Heartbeat, "free_slots", None, "must be an integer, got nil"),
    (Heartbeat, "session_generation", 2**63, "outside the signed 64-bit range"),
    (Heartbeat, "session_generation", 2**64 - 1, "outside the signed 64-bit range"),
    (Attest, "fact", "maybe", "must be one of running | stopped"),
    (Attest, "fact", None, "must be a string, got nil"),
    (Attest, "lease", "l", "must be a LeaseRef map, got a string"),
    (Attest, "lease", {"run_id": "r"}, "lacks fields"),
    (Attest, "new_slot", {"offer_id": "o", "lease_token": "t", "x": 1}, "has unknown fields ['x']"),
    (Heartbeat, "renewals", ["l"], "item 0 must be a LeaseRef map, got a string"),
    (Heartbeat, "renewals", {"a": 1}, "must be an array of LeaseRef maps, got a map"),
    (LogChunk, "data", "text", "must be binary, got a string"),
    (LogChunk, "data", b"x" * (128 * 1024 + 1), "over the 131072-byte limit"),
    (Attest, "stopped_by", "crash", "must be one of exit | term | kill"),
    (Attest, "stopped_by", 1, "must be a string, got an integer"),
    (Heartbeat, "worker_id", None, "must be a string, got nil"),
    (Heartbeat, "worker_id", b"w", "must be a string, got binary"),
    (Heartbeat, "worker_id", ["w"], "must be a string, got an array"),
    (Heartbeat, "session_id", "s" * (MAX_ID_CHARS + 1), f"longer than {MAX_ID_CHARS} characters"),
    (Offer, "run_id", "r" * (MAX_ID_CHARS + 1), f"longer than {MAX_ID_CHARS} characters"),
    (Offer, "cwd", "d" * (MAX_STR_BYTES + 1), "string limit"),
    (Offer, "cwd", "é" * (MAX_STR_BYTES // 2 + 1), "string limit"),  # characters fit, bytes do not
    (Offer, "cwd", 3, "must be a string, got an integer"),
    (Offer, "timeout_ms", True, "must be an integer, got a boolean"),
    (Offer, "timeout_ms", 1.5, "must be an integer, got a float"),
    (Offer, "argv", ["ok", 1], "item 1 must be a string, got an integer"),
    (Offer, "argv", ["ok", None], "item 1 must be a string, got nil"),
    # A PosixStr travels as bin only when its bytes are not UTF-8: one spelling per value.
    (Offer, "argv", ["ok", b"bin"], "item 1 is binary that is valid UTF-8"),
    (Offer, "argv", ["ok", b"\xff" * (MAX_STR_BYTES + 1)], "item 1 is over the 65536-byte string limit"),
    (Offer, "cwd", b"/tmp", "is binary that is valid UTF-8"),
    (Offer, "cwd", b"/\xff" + b"d" * MAX_STR_BYTES, "string limit"),
    (Offer, "env", {"K": b"v"}, "value of key 'K' is binary that is valid UTF-8"),
    (Offer, "argv", "echo hi", "must be an array of strings, got a string"),
    (Offer, "argv", {"a": "b"}, "must be an array of strings, got a map"),
    (Offer, "argv", None, "must be an array of strings, got nil"),
    (Offer, "env", {"K": 1}, "value of key 'K' must be a string, got an integer"),
    (Offer, "env", {"K": None}, "value of key 'K' must be a string, got nil"),
    (Offer, "env", {"K": ["v"]}, "value of key 'K' must be a string, got an array"),
    (Offer, "env", ["K=v"], "must be a map of strings to strings, got an array"),
    (Activate, "callback_token_hash", "AB" * 32, "must match"),
    (Activate, "callback_token_hash", "ab" * 31, "must match"),
    (Activate, "callback_token_hash", "ab" * 32 + "\n", "must match"),
    (Ack, "result", "maybe", "must be one of applied | already_terminal | fenced | refused"),
    (Ack, "result", None, "must be a string, got nil"),
    (Ack, "of", "k" * (MAX_ID_CHARS + 1), "longer than"),
    (Completed, "log_dropped_bytes", True, "must be an integer, got a boolean"),
]


@pytest.mark.parametrize("cls, name, value, fragment", WRONG_VALUES,
                         ids=[f"{getattr(c, 'KIND', 'offer')}.{n}={str(v)[:12]!s}" for c, n, v, _ in WRONG_VALUES])
def test_a_field_of_the_wrong_type_or_out_of_bounds_is_refused(cls, name, value, fragment):
    if cls is Offer:  # an offer travels inside Offers: its complaint names where
        error = refused(offers_frames({**offer_body(sample(Offer)), name: value}),
                        f"offers.offers item 0 field {name} ")
    else:
        error = refused(frames_of({**body_of(sample(cls)), name: value}), f"{cls.KIND}.{name} ")
    assert fragment in error.reason


def test_msgpack_extension_types_are_refused():
    body = body_of(sample(Heartbeat))
    for value in [msgpack.ExtType(5, b"x"), msgpack.Timestamp(1, 0)]:
        refused(frames_of({**body, "free_slots": value}), "heartbeat.free_slots must be an integer")


def test_invalid_utf8_and_deep_nesting_are_refused():
    refused([HEADER, b"\x81\xa4kind\xa2\xff\xfe"], "UnicodeDecodeError")
    refused([HEADER, b"\x91" * 100_000 + b"\xc0"], "not one msgpack value")


def test_refusals_never_echo_field_values():
    body = {**offer_body(sample(Offer)), "env": {"PASSWORD": ["hunter2"]}}
    error = refused(offers_frames(body), "offers.offers item 0 field env")
    assert "hunter2" not in str(error) and "hunter2" not in repr(error)


# --- DecodeError itself ------------------------------------------------------------------------

def test_decode_error_keeps_truncated_frames_for_the_log():
    big = b"\x00" + b"z" * 5000
    error = refused([HEADER, big], "not one msgpack value")
    assert error.frames == (HEADER, big[:KEPT_FRAME_BYTES])
    assert error.frame_sizes == (len(HEADER), len(big)) and error.frame_count == 2
    assert "zzz" not in str(error) and "zzz" not in repr(error)
    many = refused([b"nope"] * 1000, "header")
    assert len(many.frames) == codec.KEPT_FRAMES and many.frame_count == 1000


def test_decode_errors_pickle():
    for frames in ([HEADER, b"\xc1"], [b"QLACTORS/7", b""]):
        with pytest.raises(DecodeError) as info:
            decode(frames)
        copy = pickle.loads(pickle.dumps(info.value))
        assert type(copy) is type(info.value) and str(copy) == str(info.value)
        assert copy.frames == info.value.frames


# --- nothing but DecodeError ---------------------------------------------------------------------

@settings(max_examples=500)
@given(st.binary(max_size=300))
def test_random_bodies_raise_only_decode_error(data):
    try:
        decode([HEADER, data])
    except DecodeError:
        pass


@settings(max_examples=300)
@given(st.lists(st.one_of(st.binary(max_size=40), st.just(HEADER), st.none(), st.integers(), st.text()),
                max_size=4))
def test_random_frame_lists_raise_only_decode_error(frames):
    try:
        decode(frames)
    except DecodeError:
        pass


_msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=10)
    | st.binary(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(any_message, st.data())
def test_tampered_messages_raise_only_decode_error_or_decode_validly(message, data):
    body = body_of(message)
    name = data.draw(st.sampled_from(sorted(body)))
    body[name] = data.draw(_msgpack_values)
    try:
        decoded = decode(frames_of(body))
    except DecodeError:
        return
    assert type(decoded).KIND == body["kind"]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(any_message, st.data())
def test_flipped_bytes_raise_only_decode_error(message, data):
    body = bytearray(encode(message)[1])
    index = data.draw(st.integers(0, len(body) - 1))
    body[index] = data.draw(st.integers(0, 255))
    try:
        decode([HEADER, bytes(body)])
    except DecodeError:
        pass


# --- encode refuses what decode would refuse -------------------------------------------------------

def test_encode_refuses_unregistered_objects():
    fence = FencedReport(**{n: _sample_value(t) for n, t in _hints(FencedReport).items()})
    for obj in [fence, object(), {"kind": "nudge"}, None]:
        with pytest.raises(EncodeError, match="not a registered wire message"):
            encode(obj)

    @dataclasses.dataclass(frozen=True)
    class Impostor:
        KIND: ClassVar[str] = "nudge"
    with pytest.raises(EncodeError):
        encode(Impostor())


def test_encode_refuses_bad_values_at_their_origin():
    with pytest.raises(EncodeError, match="heartbeat.free_slots must be an integer, got a boolean"):
        encode(dataclasses.replace(sample(Heartbeat), free_slots=True))
    with pytest.raises(EncodeError, match="offers.offers item 0 field argv item 0"):
        encode(in_offers(dataclasses.replace(sample(Offer), argv=[1])))
    with pytest.raises(EncodeError, match="ack.result must be one of"):
        encode(dataclasses.replace(sample(Ack), result="ok"))
    with pytest.raises(EncodeError, match="cannot be packed"):
        encode(dataclasses.replace(sample(Ack), detail="\ud800"))


def test_posix_values_travel_as_str_when_utf8_and_as_bin_otherwise():
    """Command words, env values and cwd reach the executor byte for byte, UTF-8 or not."""
    offer = dataclasses.replace(sample(Offer), argv=["printf", "\udcff\udcfe", "é"],
                                cwd="/tmp/\udcff", env={"A": "plain", "B": "x\udc80y"})
    body = offer_body(offer)
    assert body["argv"] == ["printf", b"\xff\xfe", "é"]
    assert body["cwd"] == b"/tmp/\xff"
    assert body["env"] == {"A": "plain", "B": b"x\x80y"}
    assert decode(encode(in_offers(offer))).offers == [offer]
    # Escaped bytes that happen to form UTF-8 go out as that text: the same bytes, one spelling.
    assert offer_body(dataclasses.replace(offer, argv=["\udcc3\udca9"]))["argv"] == ["é"]


def test_posix_values_are_limited_in_bytes_and_must_stand_for_bytes():
    where = "offers.offers item 0 field"
    with pytest.raises(EncodeError, match=f"{where} argv item 0 holds a lone surrogate"):
        encode(in_offers(dataclasses.replace(sample(Offer), argv=["\ud800"])))
    with pytest.raises(EncodeError, match=f"{where} cwd is over the 65536-byte string limit"):
        encode(in_offers(dataclasses.replace(sample(Offer), cwd="/" + "\udcff" * MAX_STR_BYTES)))
    with pytest.raises(EncodeError, match=f"{where} env value of key 'K' must be a string, got binary"):
        encode(in_offers(dataclasses.replace(sample(Offer), env={"K": b"\xff"})))
    fits = in_offers(dataclasses.replace(sample(Offer), argv=["\udcff" * MAX_STR_BYTES]))
    assert decode(encode(fits)) == fits


def test_posix_str_takes_no_other_constraint():
    with pytest.raises(TypeError, match="PosixStr"):
        compile_type(Annotated[str, messages_module.PosixBytes(), MaxLen(3)])


def test_encode_refuses_a_message_over_the_frame_limit():
    env = {f"K{i}": "v" * 60_000 for i in range(5)}
    with pytest.raises(EncodeError, match="over the"):
        encode(in_offers(dataclasses.replace(sample(Offer), env=env)))


# --- the schema compiler -------------------------------------------------------------------------

@pytest.mark.parametrize("tp", [float, bytearray, list[int], dict[str, int], tuple[str, ...], int | str,
                                Literal[1, 2], Annotated[int, MaxLen(3)], Annotated[str, "free text"]])
def test_annotations_the_wire_cannot_carry_fail_at_import_time(tp):
    with pytest.raises(TypeError):
        compile_type(tp)


def test_a_field_named_kind_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Bad:
        KIND: ClassVar[str] = "bad"
        kind: str
    with pytest.raises(TypeError, match="kind"):
        schema_of(Bad)
