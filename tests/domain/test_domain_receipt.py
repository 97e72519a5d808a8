"""The strict completion-receipt codec: every valid receipt round-trips, every broken one is refused."""

from __future__ import annotations

import ast
import hashlib
import json
import pathlib
import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import qlactors.domain.receipt as receipt_module
from qlactors.domain.receipt import (
    MAX_CALLBACK_SEQUENCE,
    MAX_EXIT_CODE,
    MAX_ID_LEN,
    MAX_RECEIPT_BYTES,
    MAX_TIME_MS,
    REASONS,
    SCHEMA_VERSION,
    TOKEN_MAX_LEN,
    TOKEN_MIN_LEN,
    Receipt,
    ReceiptError,
    decode_receipt,
    encode_receipt,
    receipt_relpath,
    receipt_shard,
    token_hash,
    token_matches,
)

ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
KEYS_V1 = ["schemaVersion", "runId", "attemptId", "callbackSequence", "token",
           "startedAtMs", "finishedAtMs", "exitCode"]
KEYS = [*KEYS_V1, "outputOpen"]  # schema 2, the one launchers write
INT_RANGES = {"schemaVersion": (1, 2), "callbackSequence": (1, MAX_CALLBACK_SEQUENCE),
              "startedAtMs": (0, MAX_TIME_MS), "finishedAtMs": (0, MAX_TIME_MS),
              "exitCode": (0, MAX_EXIT_CODE), "outputOpen": (0, 1)}
ID_KEYS = ["runId", "attemptId"]
EX = settings(max_examples=100, deadline=None)

ids = st.text(ALPHABET, min_size=1, max_size=MAX_ID_LEN)
tokens = st.text(ALPHABET, min_size=TOKEN_MIN_LEN, max_size=TOKEN_MAX_LEN)
receipts = st.builds(
    Receipt,
    schema_version=st.just(SCHEMA_VERSION),
    run_id=ids,
    attempt_id=ids,
    callback_sequence=st.integers(1, MAX_CALLBACK_SEQUENCE),
    token=tokens,
    started_at_ms=st.integers(0, MAX_TIME_MS),
    finished_at_ms=st.integers(0, MAX_TIME_MS),
    exit_code=st.integers(0, MAX_EXIT_CODE),
    output_open=st.integers(0, 1),
)
# Written by launchers before schema 2: still read, never with outputOpen.
receipts_v1 = st.builds(
    Receipt,
    schema_version=st.just(1),
    run_id=ids,
    attempt_id=ids,
    callback_sequence=st.integers(1, MAX_CALLBACK_SEQUENCE),
    token=tokens,
    started_at_ms=st.integers(0, MAX_TIME_MS),
    finished_at_ms=st.integers(0, MAX_TIME_MS),
    exit_code=st.integers(0, MAX_EXIT_CODE),
)


def pairs_of(r: Receipt) -> list[tuple[str, object]]:
    """The receipt as ordered (wire key, value) pairs, ready to be mutated."""
    return list(json.loads(encode_receipt(r)).items())


def render(pairs: list[tuple[str, object]]) -> bytes:
    """Hand-built JSON text, so duplicate keys survive."""
    body = ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in pairs)
    return ("{" + body + "}").encode("utf-8")


def replace(pairs, key, value):
    return [(k, value if k == key else v) for k, v in pairs]


def refused(data: bytes, reason: str | None = None, **kw) -> ReceiptError:
    with pytest.raises(ReceiptError) as info:
        decode_receipt(data, **kw)
    assert info.value.reason in REASONS
    if reason is not None:
        assert info.value.reason == reason, str(info.value)
    return info.value


def example() -> Receipt:
    return Receipt(2, "0190c3a1-7b2e-7cc0-8f00-aaaaaaaaaaaa", "0190c3a1-7b2e-7cc0-8f00-bbbbbbbbbbbb",
                   1, "t" * 43, 1_700_000_000_000, 1_700_000_000_500, 0)


# --- valid receipts -------------------------------------------------------------------------

@EX
@given(receipts)
def test_every_valid_receipt_round_trips(r):
    data = encode_receipt(r)
    assert len(data) <= MAX_RECEIPT_BYTES
    assert decode_receipt(data) == r
    assert decode_receipt(data, expected_attempt_id=r.attempt_id) == r
    assert encode_receipt(decode_receipt(data)) == data


@EX
@given(receipts, st.permutations(range(9)), st.sampled_from([" ", "\n", "\t", "\r\n  "]))
def test_any_key_order_and_whitespace_is_accepted(r, order, ws):
    pairs = pairs_of(r)
    body = ("," + ws).join(f"{json.dumps(pairs[i][0])}{ws}:{ws}{json.dumps(pairs[i][1])}" for i in order)
    assert decode_receipt(f"{ws}{{{ws}{body}{ws}}}{ws}".encode()) == r


def test_encoding_is_compact_in_schema_order():
    data = encode_receipt(example())
    assert list(json.loads(data)) == KEYS
    assert b" " not in data


@EX
@given(receipts_v1)
def test_a_schema_1_receipt_is_still_read_with_its_own_keys(r):
    data = encode_receipt(r)
    assert list(json.loads(data)) == KEYS_V1
    assert decode_receipt(data) == r
    assert decode_receipt(data).output_open == 0


@EX
@given(receipts_v1, st.integers(0, 1))
def test_a_schema_1_receipt_with_output_open_is_refused(r, value):
    refused(render(pairs_of(r) + [("outputOpen", value)]), "unknown_key")


@EX
@given(receipts_v1, st.sampled_from(KEYS_V1))
def test_a_schema_1_receipt_missing_a_key_is_refused(r, key):
    refused(render([p for p in pairs_of(r) if p[0] != key]), "missing_key")


def test_a_schema_2_receipt_without_output_open_is_refused():
    pairs = [p for p in pairs_of(example()) if p[0] != "outputOpen"]
    refused(render(pairs), "missing_key")
    refused(render(replace(pairs, "schemaVersion", 2) + [("outputOpen", True)]), "bad_type")


def test_output_open_cannot_be_set_on_a_schema_1_receipt():
    with pytest.raises(ReceiptError):
        Receipt(1, "r", "a", 1, "x" * 32, 0, 0, 0, 1)
    assert Receipt(2, "r", "a", 1, "x" * 32, 0, 0, 0, 1).output_open == 1


def test_finished_before_started_is_accepted_for_the_service_to_clamp():
    r = Receipt(1, "r", "a", 1, "x" * 32, 2_000, 1_000, 137)
    assert decode_receipt(encode_receipt(r)).finished_at_ms == 1_000


def test_repr_hides_the_token():
    assert "t" * 43 not in repr(example())


# --- broken receipts ------------------------------------------------------------------------

@EX
@given(receipts, st.sampled_from(KEYS))
def test_missing_key_is_refused(r, key):
    refused(render([p for p in pairs_of(r) if p[0] != key]), "missing_key")


@EX
@given(receipts, st.text(min_size=1, max_size=20), st.integers())
def test_unknown_key_is_refused(r, key, value):
    assume(key not in KEYS)
    refused(render(pairs_of(r) + [(key, value)]), "unknown_key")


@EX
@given(receipts, st.sampled_from(KEYS), st.booleans())
def test_duplicate_key_is_refused_even_with_the_same_value(r, key, same):
    pairs = pairs_of(r)
    value = dict(pairs)[key] if same else "other"
    refused(render(pairs + [(key, value)]), "duplicate_key")


@EX
@given(receipts, st.sampled_from(list(INT_RANGES)),
       st.one_of(st.booleans(), st.floats(allow_nan=False, allow_infinity=False),
                 st.text(max_size=5), st.none(), st.just([]), st.just({})))
def test_non_integer_where_an_integer_belongs_is_refused(r, key, value):
    refused(render(replace(pairs_of(r), key, value)), "bad_type")


@pytest.mark.parametrize("literal", ["1.0", "1e3", "1E0", "-0.0", "0.5"])
def test_number_with_fraction_or_exponent_is_refused(literal):
    data = encode_receipt(example()).replace(b'"exitCode":0', b'"exitCode":' + literal.encode())
    refused(data, "bad_type")


@EX
@given(receipts, st.sampled_from(list(INT_RANGES)), st.data())
def test_out_of_range_integer_is_refused(r, key, data):
    low, high = INT_RANGES[key]
    value = data.draw(st.one_of(st.integers(max_value=low - 1), st.integers(min_value=high + 1),
                                st.just(10**40), st.just(-(10**40))))
    reason = "unsupported_version" if key == "schemaVersion" else "out_of_range"
    refused(render(replace(pairs_of(r), key, value)), reason)


bad_ids = st.one_of(
    st.just(""),
    st.text(ALPHABET, min_size=MAX_ID_LEN + 1, max_size=MAX_ID_LEN + 20),
    st.text(min_size=1, max_size=MAX_ID_LEN).filter(lambda s: re.fullmatch(r"[A-Za-z0-9_-]+", s) is None),
    st.sampled_from(["../etc", "a/b", "a.json", "abc\n", "é", "a b", "a\x00"]),
)


@EX
@given(receipts, st.sampled_from(ID_KEYS), bad_ids)
def test_invalid_id_is_refused(r, key, value):
    refused(render(replace(pairs_of(r), key, value)), "bad_format")


bad_tokens = st.one_of(
    st.text(ALPHABET, max_size=TOKEN_MIN_LEN - 1),
    st.text(ALPHABET, min_size=TOKEN_MAX_LEN + 1, max_size=TOKEN_MAX_LEN + 50),
    st.builds(lambda a, c, b: a + c + b, st.text(ALPHABET, min_size=16, max_size=40),
              st.sampled_from(["=", "+", "/", " ", ".", "\n", "é"]),
              st.text(ALPHABET, min_size=16, max_size=40)),
)


@EX
@given(receipts, bad_tokens)
def test_invalid_token_is_refused(r, value):
    refused(render(replace(pairs_of(r), "token", value)), "bad_format")


@EX
@given(receipts, st.sampled_from(["runId", "attemptId", "token"]),
       st.one_of(st.integers(), st.booleans(), st.none(), st.just([]), st.just({"a": 1})))
def test_non_string_where_a_string_belongs_is_refused(r, key, value):
    refused(render(replace(pairs_of(r), key, value)), "bad_type")


@EX
@given(receipts, st.sampled_from(KEYS), st.sampled_from(["NaN", "Infinity", "-Infinity"]))
def test_nan_and_infinity_literals_are_refused(r, key, literal):
    body = ",".join(f'"{k}":{literal if k == key else json.dumps(v)}' for k, v in pairs_of(r))
    refused(("{" + body + "}").encode(), "bad_constant")


@EX
@given(receipts, st.sampled_from(KEYS))
def test_nested_object_is_refused(r, key):
    refused(render(replace(pairs_of(r), key, dict(pairs_of(r)))))


@EX
@given(receipts)
def test_top_level_array_or_scalar_is_refused(r):
    refused(render(pairs_of(r)).join([b"[", b"]"]), "not_object")
    refused(b'"' + r.token.encode() + b'"', "not_object")
    refused(b"1", "not_object")
    refused(b"null", "not_object")


@EX
@given(receipts, st.data())
def test_every_strict_prefix_of_a_valid_receipt_is_refused(r, data):
    encoded = encode_receipt(r)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    refused(encoded[:cut], "bad_json")


@EX
@given(receipts, st.sampled_from([b"x", b"{}", b",", b"}", b"\x00", b" 1", b"[]"]))
def test_trailing_garbage_is_refused(r, tail):
    refused(encode_receipt(r) + tail, "bad_json")


@EX
@given(receipts, st.integers(1, 200), st.sampled_from([b" ", b"\n"]))
def test_oversize_receipt_is_refused_even_if_only_whitespace(r, extra, pad):
    encoded = encode_receipt(r)
    refused(encoded + pad * (MAX_RECEIPT_BYTES - len(encoded) + extra), "too_large")


def test_receipt_at_exactly_the_size_limit_is_accepted():
    encoded = encode_receipt(example())
    assert decode_receipt(encoded + b" " * (MAX_RECEIPT_BYTES - len(encoded))) == example()


def test_size_is_checked_before_utf8():
    refused(b"\xff" * (MAX_RECEIPT_BYTES + 1), "too_large")


@EX
@given(receipts, st.data(),
       st.sampled_from([b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xe2\x82", b"\x80", b"\xf8\x88\x80\x80\x80"]))
def test_invalid_utf8_is_refused(r, data, bad):
    encoded = encode_receipt(r)
    at = data.draw(st.integers(0, len(encoded)))
    refused(encoded[:at] + bad + encoded[at:], "not_utf8")


def test_utf8_bom_is_refused():
    refused(b"\xef\xbb\xbf" + encode_receipt(example()), "bad_json")


def test_deep_nesting_is_refused_without_crashing():
    refused(b"[" * 4000 + b"]" * 4000)
    refused(b'{"a":' * 800 + b"1" + b"}" * 800)


@EX
@given(receipts, ids)
def test_attempt_id_that_does_not_match_the_path_is_refused(r, path_id):
    assume(path_id != r.attempt_id)
    refused(encode_receipt(r), "path_mismatch", expected_attempt_id=path_id)


def test_str_input_is_refused():
    with pytest.raises(ReceiptError) as info:
        decode_receipt(encode_receipt(example()).decode())  # type: ignore[arg-type]
    assert info.value.reason == "bad_type"


def test_invalid_receipt_cannot_be_built_or_encoded():
    with pytest.raises(ReceiptError):
        Receipt(1, "r", "a", 1, "short", 0, 0, 0)
    with pytest.raises(ReceiptError):
        Receipt(1, "r", "a", True, "x" * 32, 0, 0, 0)
    r = example()
    object.__setattr__(r, "exit_code", 256)
    with pytest.raises(ReceiptError):
        encode_receipt(r)


def test_receipt_error_is_a_value_error():
    assert issubclass(ReceiptError, ValueError)


# --- token and path -------------------------------------------------------------------------

@EX
@given(tokens, tokens)
def test_token_matches_only_its_own_hash(token, other):
    h = token_hash(token)
    assert re.fullmatch(r"[0-9a-f]{64}", h)
    assert h == hashlib.sha256(token.encode("ascii")).hexdigest()
    assert token_matches(token, h)
    assert token_matches(other, h) == (other == token)


def test_token_matches_refuses_odd_inputs_without_raising():
    h = token_hash("x" * 32)
    assert not token_matches("x" * 32, h.upper())
    assert not token_matches("x" * 32, "")
    assert not token_matches("é" * 32, h)
    assert not token_matches("x" * 32, "\udcff")


@EX
@given(ids)
def test_shard_is_two_hex_chars_of_the_sha256_of_the_id(attempt_id):
    shard = receipt_shard(attempt_id)
    assert re.fullmatch(r"[0-9a-f]{2}", shard)
    assert shard == hashlib.sha256(attempt_id.encode()).hexdigest()[:2]
    assert receipt_relpath(attempt_id) == f"{shard}/{attempt_id}.json"


def test_relpath_example():
    assert receipt_relpath("abc") == hashlib.sha256(b"abc").hexdigest()[:2] + "/abc.json"


@pytest.mark.parametrize("bad", ["", "../x", "a/b", "x" * (MAX_ID_LEN + 1), "é", None])
def test_path_of_an_invalid_attempt_id_is_refused(bad):
    with pytest.raises(ValueError):
        receipt_relpath(bad)  # type: ignore[arg-type]


def test_receipt_module_imports_no_io():
    tree = ast.parse(pathlib.Path(receipt_module.__file__).read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    forbidden = {"os", "io", "socket", "subprocess", "time", "sqlalchemy", "zmq", "pykka", "psycopg"}
    assert not names & forbidden
