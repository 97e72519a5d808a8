"""Executor side: the records the executor journal reads and writes, and the checks on what it is
given."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import BadInput
from ...store.records import Identity, check_id

ACCEPTED = "accepted"
LAUNCHING = "launching"
STARTED = "started"
COMPLETED = "completed"
QUARANTINED = "quarantined"
STATES = (ACCEPTED, LAUNCHING, STARTED, COMPLETED, QUARANTINED)
IN_FLIGHT = (ACCEPTED, LAUNCHING, STARTED)  # what the post-start probe re-attests
MAX_PAGE = 1000
MAX_PATH = 4096
MAX_SECRET = 64  # a lease token or resume secret: token_urlsafe(32) is 43 characters
MAX_WORKER_ID = 128
LEASE_FACTS = ("offer_id", "lease_generation", "lease_token", "session_id", "session_generation")


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One journal row: what this executor knows about an attempt it accepted."""

    attempt_id: str
    run_id: str
    state: str
    log_path: str
    receipt_path: str
    callback_token_hash: str
    identity: Identity | None
    purge_after_ms: int | None
    created_at_ms: int
    updated_at_ms: int
    lease: "LeaseFacts | None" = None
    """The lease this executor holds for the attempt (None: not recorded, e.g. on edge)."""
    shipped_offset: int = 0
    """How far the control side acknowledged the log (SEMANTICS.md §13)."""
    final_offset: int | None = None
    """The log's length when the attempt completed (sent with `Completed`)."""
    activated_at_ms: int | None = None
    """Activation on the executor's own clock; `local_deadline_ms` = it + timeout (§5)."""
    local_deadline_ms: int | None = None
    timeout_intent_at_ms: int | None = None
    """When this executor committed a local timeout intent (no replica reachable, §7)."""

    @classmethod
    def from_row(cls, row: Any, prefix: str = "") -> "JournalEntry":
        g = lambda name: getattr(row, prefix + name)  # noqa: E731 - a column reader for one row
        return cls(attempt_id=g("attempt_id"), run_id=g("run_id"), state=g("state"),
                   log_path=g("log_path"), receipt_path=g("receipt_path"),
                   callback_token_hash=g("callback_token_hash"),
                   identity=Identity.from_row(row, prefix), purge_after_ms=g("purge_after_ms"),
                   created_at_ms=g("created_at_ms"), updated_at_ms=g("updated_at_ms"),
                   lease=LeaseFacts.from_row(row, prefix), shipped_offset=g("shipped_offset"),
                   final_offset=g("final_offset"), activated_at_ms=g("activated_at_ms"),
                   local_deadline_ms=g("local_deadline_ms"),
                   timeout_intent_at_ms=g("timeout_intent_at_ms"))


@dataclass(frozen=True, slots=True)
class LeaseFacts:
    """What a report about an offered attempt quotes besides worker, run and attempt (§9 Fence)."""

    offer_id: str
    lease_generation: int
    lease_token: str
    session_id: str
    session_generation: int

    def __post_init__(self) -> None:
        check_id("offer id", self.offer_id)
        check_id("session id", self.session_id)
        secret_checked("lease token", self.lease_token)
        positive_checked("lease generation", self.lease_generation)
        positive_checked("session generation", self.session_generation)

    @classmethod
    def from_row(cls, row: Any, prefix: str = "") -> "LeaseFacts | None":
        values = [getattr(row, prefix + name) for name in LEASE_FACTS]
        return None if any(v is None for v in values) else cls(*values)

    def columns(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in LEASE_FACTS}


@dataclass(frozen=True, slots=True)
class JournaledPull:
    """A Pull as journalled before it was sent: its (offer id, lease token) pairs still unanswered."""

    pull_id: str
    pairs: tuple[tuple[str, str], ...]
    created_at_ms: int


@dataclass(frozen=True, slots=True)
class OwedReport:
    """A report the executor owes the control side, as journalled before it was first sent."""

    request_id: str
    kind: str
    attempt_id: str | None
    body: bytes
    created_at_ms: int

    @classmethod
    def from_row(cls, row: Any) -> "OwedReport":
        return cls(row.request_id, row.kind, row.attempt_id, bytes(row.body), row.created_at_ms)


@dataclass(frozen=True, slots=True)
class SavedSession:
    """This executor's current session, to resume it after a restart on the same boot (§9)."""

    worker_id: str
    session_id: str
    generation: int
    resume_secret: str
    boot_id: str
    updated_at_ms: int


def state_checked(state: str) -> str:
    if state not in STATES:
        raise BadInput(f"unknown journal state {state!r}: one of {', '.join(STATES)}")
    return state


def limit_checked(limit: int) -> int:
    if type(limit) is not int or not 1 <= limit <= MAX_PAGE:
        raise BadInput(f"a journal page holds 1 to {MAX_PAGE} rows")
    return limit


def positive_checked(name: str, value: Any) -> int:
    if type(value) is not int or not 1 <= value < 2**31:
        raise BadInput(f"{name} must be a positive integer, got {value!r}")
    return value


def ms_checked(name: str, value: Any) -> int:
    if type(value) is not int or not 0 <= value < 2**63:
        raise BadInput(f"{name} must be a non-negative integer of milliseconds, got {value!r}")
    return value


def offset_checked(value: Any) -> int:
    if type(value) is not int or not 0 <= value < 2**63:
        raise BadInput(f"a log offset must be a non-negative integer of bytes, got {value!r}")
    return value


def secret_checked(name: str, value: Any) -> str:
    if type(value) is not str or not 1 <= len(value) <= MAX_SECRET or not value.isascii():
        raise BadInput(f"{name} must be 1 to {MAX_SECRET} ASCII characters")
    return value


def path_checked(name: str, value: Any) -> str:
    if type(value) is not str or not 1 <= len(value) <= MAX_PATH or "\0" in value:
        raise BadInput(f"{name} must be a path of 1 to {MAX_PATH} characters without NUL")
    return value
