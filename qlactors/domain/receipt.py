"""The strict codec of completion receipts (schema 2, and schema 1 as written before it), their
token check and their path (SEMANTICS.md §5)."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from typing import Any

from ..errors import PeerFault

SCHEMA_VERSION = 2
# Schema 1 (no outputOpen) is still read: receipts written by a launcher before an upgrade.
SCHEMA_VERSIONS = (1, 2)
MAX_RECEIPT_BYTES = 4096
MAX_ID_LEN = 36
TOKEN_MIN_LEN = 32
TOKEN_MAX_LEN = 128
MAX_EXIT_CODE = 255
MAX_CALLBACK_SEQUENCE = 2**31 - 1
# Largest integer a JavaScript or double-based JSON reader still holds exactly.
MAX_TIME_MS = 2**53 - 1

# ASCII only, spelled out: `\w` would also match non-ASCII letters and digits.
ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,%d}" % MAX_ID_LEN)
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_-]{%d,%d}" % (TOKEN_MIN_LEN, TOKEN_MAX_LEN))

# Every `ReceiptError.reason`, so callers and tests can rely on the vocabulary.
REASONS = frozenset({
    "too_large", "not_utf8", "bad_json", "bad_constant", "duplicate_key", "not_object",
    "unknown_key", "missing_key", "bad_type", "bad_format", "out_of_range",
    "unsupported_version", "path_mismatch",
})


class ReceiptError(PeerFault):
    """A receipt the codec refuses; `reason` is a short machine string from REASONS."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True, repr=False)
class Receipt:
    """How a launched job ended, as its launcher reports it; valid by construction.

    `finished_at_ms < started_at_ms` is accepted on purpose: both come from the launcher's own
    clock, and the CompletionService clamps them to the attempt's committed times rather than
    refusing the fact of how the process ended. Likewise `callback_sequence` is only range
    checked here; whether it is the expected next value is the service's decision.
    """

    schema_version: int
    run_id: str
    attempt_id: str
    callback_sequence: int
    token: str
    started_at_ms: int
    finished_at_ms: int
    exit_code: int
    output_open: int = 0
    """1 when something outside the job's process group still held its output open after the
    drain bound (the dropped-byte count is then unknown); always 0 in schema 1."""

    def __post_init__(self) -> None:
        """Refuse to build a receipt that decode_receipt would reject."""
        _validate(self)

    def __repr__(self) -> str:
        # The token is a credential: keep it out of logs and tracebacks.
        return (f"Receipt(schema_version={self.schema_version}, run_id={self.run_id!r}, "
                f"attempt_id={self.attempt_id!r}, callback_sequence={self.callback_sequence}, "
                f"token=<redacted>, started_at_ms={self.started_at_ms}, "
                f"finished_at_ms={self.finished_at_ms}, exit_code={self.exit_code}, "
                f"output_open={self.output_open})")


# Wire key -> attribute, in the schema's order (which is also the encoding's order): schema 1's,
# then what schema 2 adds.
_KEYS_V1: tuple[tuple[str, str], ...] = (
    ("schemaVersion", "schema_version"),
    ("runId", "run_id"),
    ("attemptId", "attempt_id"),
    ("callbackSequence", "callback_sequence"),
    ("token", "token"),
    ("startedAtMs", "started_at_ms"),
    ("finishedAtMs", "finished_at_ms"),
    ("exitCode", "exit_code"),
)
_KEYS = {1: _KEYS_V1, 2: (*_KEYS_V1, ("outputOpen", "output_open"))}

_INT_RANGES: tuple[tuple[str, str, int, int], ...] = (
    ("callbackSequence", "callback_sequence", 1, MAX_CALLBACK_SEQUENCE),
    ("startedAtMs", "started_at_ms", 0, MAX_TIME_MS),
    ("finishedAtMs", "finished_at_ms", 0, MAX_TIME_MS),
    ("exitCode", "exit_code", 0, MAX_EXIT_CODE),
    ("outputOpen", "output_open", 0, 1),
)


def _kind(value: object) -> str:
    """A JSON-ish name of a value's type, for error messages that never echo the value."""
    return {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null",
            dict: "object", list: "array"}.get(type(value), type(value).__name__)


def _check_int(key: str, value: object, low: int, high: int) -> None:
    """A real int in range; bool is refused although Python counts it as an int."""
    if type(value) is not int:
        raise ReceiptError("bad_type", f"receipt {key} must be an integer, got {_kind(value)}")
    if not low <= value <= high:
        raise ReceiptError("out_of_range", f"receipt {key} must be from {low} to {high}")


def _check_str(key: str, value: object, pattern: re.Pattern[str], rule: str) -> None:
    """A str matching `pattern` in full (no trailing newline sneaking past `$`)."""
    if type(value) is not str:
        raise ReceiptError("bad_type", f"receipt {key} must be a string, got {_kind(value)}")
    if pattern.fullmatch(value) is None:
        raise ReceiptError("bad_format", f"receipt {key} must be {rule}")


def _check_version(version: object) -> None:
    if type(version) is not int:
        raise ReceiptError("bad_type", f"receipt schemaVersion must be an integer, got {_kind(version)}")
    if version not in SCHEMA_VERSIONS:
        raise ReceiptError("unsupported_version",
                           f"receipt schemaVersion {version} is not supported (this codec reads "
                           f"{', '.join(map(str, SCHEMA_VERSIONS))}); upgrade qlactors to read it")


def _validate(r: Receipt) -> None:
    """The one set of field rules, shared by construction, decoding and encoding."""
    _check_version(r.schema_version)
    ids = f"1 to {MAX_ID_LEN} characters of A-Z a-z 0-9 _ -"
    _check_str("runId", r.run_id, ID_PATTERN, ids)
    _check_str("attemptId", r.attempt_id, ID_PATTERN, ids)
    _check_str("token", r.token, TOKEN_PATTERN,
               f"{TOKEN_MIN_LEN} to {TOKEN_MAX_LEN} characters of base64url (A-Z a-z 0-9 _ -)")
    for key, attr, low, high in _INT_RANGES:
        _check_int(key, getattr(r, attr), low, high)
    if r.schema_version == 1 and r.output_open != 0:
        raise ReceiptError("bad_format", "a schema 1 receipt has no outputOpen: it must stay 0")


def _pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Build a JSON object, refusing duplicate keys that `json` would silently overwrite."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ReceiptError("duplicate_key", f"receipt key {key!r} appears more than once")
        obj[key] = value
    return obj


def _refuse_constant(name: str) -> Any:
    """NaN and Infinity are not JSON; Python's `json` would accept them."""
    raise ReceiptError("bad_constant", f"receipt holds {name}, which is not valid JSON")


def decode_receipt(data: bytes, *, expected_attempt_id: str | None = None) -> Receipt:
    """Parse receipt bytes strictly, or raise ReceiptError saying why they were refused.

    Anything a careful launcher cannot have written (a half-written file, duplicate or unknown
    keys, a boolean or float for an integer, NaN) is refused rather than guessed at, since the
    result decides how a run ends. `expected_attempt_id` is the id the file's path names.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ReceiptError("bad_type", f"receipt data must be bytes, got {type(data).__name__}")
    raw = bytes(data)
    # Size first, before any decoding work is spent on a hostile file.
    if len(raw) > MAX_RECEIPT_BYTES:
        raise ReceiptError("too_large", f"receipt is {len(raw)} bytes, over the "
                                        f"{MAX_RECEIPT_BYTES}-byte limit")
    try:
        text = raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise ReceiptError("not_utf8", f"receipt is not valid UTF-8 at byte {exc.start}") from None
    try:
        obj = json.loads(text, object_pairs_hook=_pairs_hook, parse_constant=_refuse_constant)
    except ReceiptError:
        raise
    except json.JSONDecodeError as exc:
        raise ReceiptError("bad_json", f"receipt is not one complete JSON value: {exc.msg} "
                                       f"at character {exc.pos}") from None
    except (ValueError, RecursionError) as exc:
        raise ReceiptError("bad_json", f"receipt is not acceptable JSON: {type(exc).__name__}") from None
    if type(obj) is not dict:
        raise ReceiptError("not_object", f"receipt must be a JSON object, got {_kind(obj)}")
    # The version picks the key set, so it is checked first (an unknown one names no key set).
    if "schemaVersion" not in obj:
        raise ReceiptError("missing_key", "receipt lacks keys ['schemaVersion']")
    version = obj["schemaVersion"]
    _check_version(version)
    keys = _KEYS[version]
    allowed = {k for k, _ in keys}
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ReceiptError("unknown_key", f"receipt has unknown keys {unknown} "
                                          f"(schema {version} allows exactly {sorted(allowed)})")
    missing = [k for k, _ in keys if k not in obj]
    if missing:
        raise ReceiptError("missing_key", f"receipt lacks keys {missing}")
    receipt = Receipt(**{attr: obj[key] for key, attr in keys})
    if expected_attempt_id is not None and receipt.attempt_id != expected_attempt_id:
        raise ReceiptError("path_mismatch", f"receipt names attempt {receipt.attempt_id!r} "
                                            f"but its path names {expected_attempt_id!r}")
    return receipt


def encode_receipt(r: Receipt) -> bytes:
    """The canonical bytes of a receipt: compact ASCII JSON in its schema's key order.

    Deterministic so that tests and launchers agree byte for byte; re-validated because a frozen
    dataclass can still be forced, and a receipt we write must be one we would read.
    """
    _validate(r)
    obj = {key: getattr(r, attr) for key, attr in _KEYS[r.schema_version]}
    data = json.dumps(obj, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")
    if len(data) > MAX_RECEIPT_BYTES:  # cannot happen with the field limits above; kept as a guard
        raise ReceiptError("too_large", f"encoded receipt is {len(data)} bytes")
    return data


def token_hash(token: str) -> str:
    """The hex SHA-256 of a callback token: the database keeps this, never the token."""
    try:
        raw = token.encode("ascii")
    except UnicodeEncodeError:  # only a peer's token can be other (a lease token in a report)
        raise PeerFault("a callback token is ASCII base64url") from None
    return hashlib.sha256(raw).hexdigest()


def token_matches(token: str, expected_hash: str) -> bool:
    """Whether `token` hashes to `expected_hash`, compared in constant time.

    Constant time so that a forger learns nothing from how long a refusal takes.
    """
    try:
        actual = token_hash(token).encode("ascii")
        expected = expected_hash.encode("utf-8")
    except (ValueError, AttributeError):
        return False
    return hmac.compare_digest(actual, expected)


def _check_attempt_id(attempt_id: str) -> None:
    """Refuse an id that could escape the receipts directory or collide after sharding."""
    if type(attempt_id) is not str or ID_PATTERN.fullmatch(attempt_id) is None:
        raise ValueError(f"attempt id must be 1 to {MAX_ID_LEN} characters of A-Z a-z 0-9 _ -, "
                         f"got {attempt_id!r}")


def receipt_shard(attempt_id: str) -> str:
    """The 2-hex-character shard directory of an attempt's receipt.

    A hash, not an id prefix: UUIDv7 ids created together share their prefix.
    """
    _check_attempt_id(attempt_id)
    return hashlib.sha256(attempt_id.encode("ascii")).hexdigest()[:2]


def receipt_relpath(attempt_id: str) -> str:
    """The receipt's path relative to the receipts root, always '/'-separated."""
    return f"{receipt_shard(attempt_id)}/{attempt_id}.json"
