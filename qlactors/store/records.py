"""Store: plain records the store's executor-facing operations exchange: sessions, fences, offers, lease
quotes, heartbeat answers, the facts of an activation's and an attestation's `Outcome`, and
process identities, with the checks their fields need."""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import BadInput, QlactorsError

_HASH = re.compile(r"[0-9a-f]{64}")


class Fenced(QlactorsError):
    """A pull names a worker session that is unknown, superseded, expired or not online: no offer."""


@dataclass(frozen=True, slots=True)
class Identity:
    """A launched process as the store keeps it; `qlactors.process.identity.ProcessIdentity` fits."""

    boot_id: str
    pid: int
    pgid: int
    start_ticks: int

    def __post_init__(self) -> None:
        if type(self.boot_id) is not str or not 1 <= len(self.boot_id) <= 64:
            raise BadInput("a process identity's boot id is 1 to 64 characters")
        for name in ("pid", "pgid", "start_ticks"):
            value = getattr(self, name)
            low = 1 if name == "pid" else 0
            if type(value) is not int or not low <= value < 2**63:
                raise BadInput(f"a process identity's {name} must be a non-negative integer, got {value!r}")

    @classmethod
    def of(cls, value: Any) -> "Identity":
        """From any object with the four attributes (duck typed: the store imports no process code)."""
        return value if isinstance(value, Identity) else cls(
            value.boot_id, value.pid, value.pgid, value.start_ticks)

    @classmethod
    def from_row(cls, row: Any, prefix: str = "") -> "Identity | None":
        """The identity columns of a row, or None while any of them is still unknown."""
        values = [getattr(row, prefix + n) for n in ("boot_id", "pid", "pgid", "start_ticks")]
        return None if any(v is None for v in values) else cls(*values)


@dataclass(frozen=True, slots=True)
class Session:
    """A registered worker session (edge: the one built-in local session of this process).

    `lease_expires_at_ms` None: the session lives as long as the process (edge). `heartbeat_seq`
    is the last heartbeat number the session stored: a resumed worker numbers on from it.
    """

    session_id: str
    worker_id: str
    generation: int
    capacity: int
    lease_expires_at_ms: int | None = None
    labels: tuple[str, ...] = ()
    boot_id: str | None = None
    heartbeat_seq: int = 0
    # `duplicate`: this Register opened it by taking the key back from a second live process (a
    # repeat's answer carries no note: the first copy was the one that found the duplicate)
    note: str | None = None


@dataclass(frozen=True, slots=True)
class Fence:
    """Everything a fenced report quotes (SEMANTICS.md §9); any mismatch answers `fenced`."""

    worker_id: str
    session_id: str
    session_generation: int
    run_id: str
    attempt_id: str
    offer_id: str
    lease_generation: int
    lease_token_hash: str
    lease_version: int


@dataclass(frozen=True, slots=True)
class LeaseQuote:
    """One lease as a heartbeat renews it or an attestation names it (SEMANTICS.md §9 Renewal).

    The lease version is never quoted: it never fences.
    """

    run_id: str
    attempt_id: str
    offer_id: str
    lease_generation: int
    lease_token_hash: str


@dataclass(frozen=True, slots=True)
class HeartbeatAnswer:
    """What a heartbeat answers; a repeat of the same `seq` gets this same answer back.

    `renewed`: (attempt id, lease generation, lease version, expires at) per renewed lease;
    `fenced`: (attempt id, lease generation, reason word) per quoted lease not renewed.
    `session_ended`: the session is not the worker's current live one (register anew), `stale`:
    a heartbeat older than the last one stored; both change nothing, and `reason` says why.
    """

    seq: int
    session_expires_at_ms: int | None
    renewed: tuple[tuple[str, int, int, int], ...] = ()
    fenced: tuple[tuple[str, int, str], ...] = ()
    session_ended: bool = False
    stale: bool = False
    reason: str | None = None
    last_seq: int | None = None
    """When `stale`: the number the session stored last, which the worker jumps past."""


@dataclass(frozen=True, slots=True)
class LeaseTerms:
    """An applied attestation's `Outcome.value`: the lease the worker holds afterwards (the new
    one after a `running` re-bind). An attestation answers applied, fenced, refused or
    superseded (stop the process: its attempt ended or a later attempt replaced it)."""

    lease_generation: int | None = None
    lease_version: int | None = None
    expires_at_ms: int | None = None


@dataclass(frozen=True, slots=True)
class OfferView:
    """One offered attempt: what to run and the fence its reports must quote (minus the token hash)."""

    run_id: str
    attempt_id: str
    attempt_number: int
    offer_id: str
    lease_generation: int
    lease_version: int
    worker_id: str
    session_id: str
    session_generation: int
    task: str
    argv: tuple[str, ...]
    cwd: str | None
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_ms: int | None = None
    stop_grace_ms: int = 1_000
    log_cap_bytes: int = 0
    keep_leftovers: bool = False

    def fence(self, lease_token_hash: str) -> Fence:
        """The fence for reports on this offer, given the lease token hash the pull carried."""
        return Fence(self.worker_id, self.session_id, self.session_generation, self.run_id,
                     self.attempt_id, self.offer_id, self.lease_generation, lease_token_hash,
                     self.lease_version)


@dataclass(frozen=True, slots=True)
class Activation:
    """An Activate's `Outcome.value` (spawn only on `applied`): the attempt's deadline and the
    lease's version after it (a refusal names the version it found)."""

    deadline_at_ms: int | None = None
    lease_version: int | None = None


def same_hash(stored: str | None, given: Any) -> bool:
    """Constant-time equality of two hex hashes; False for anything that is not a string."""
    return (isinstance(stored, str) and isinstance(given, str)
            and hmac.compare_digest(stored.encode("utf-8"), given.encode("utf-8")))


def check_hash(name: str, value: Any) -> str:
    if type(value) is not str or _HASH.fullmatch(value) is None:
        raise BadInput(f"{name} must be a lowercase hex SHA-256 (64 characters); never the raw token")
    return value


def check_id(name: str, value: Any, max_len: int = 36) -> str:
    if type(value) is not str or not 1 <= len(value) <= max_len:
        raise BadInput(f"{name} must be a string of 1 to {max_len} characters")
    return value
