"""Store: the pure decisions of worker sessions, renewals and attestations (SEMANTICS.md §9): argument
checks, why a session cannot act or resume, why a quoted lease is not renewed, and the stored
heartbeat answer. No I/O: sessions.py, heartbeats.py and attestations.py read the rows and act.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable

from ...domain.model import MAX_LABELS
from ...domain.states import AttemptStatus, LeaseStatus
from ...errors import BadInput
from ..records import HeartbeatAnswer, LeaseQuote, check_hash, check_id, same_hash

MAX_CAPACITY = 4096
# A heartbeat quotes at most this many leases: more than a session can hold is a broken worker.
MAX_QUOTES = MAX_CAPACITY
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")

# Why a resume is refused (the `Fenced` message starts with the word); a session the operator
# ended is refused with its `ended_by` word (REVOKED, RETIRED), a worker off the allow-list with
# REVOKED.
UNKNOWN_SESSION, SUPERSEDED, OFFLINE, EXPIRED, REBOOTED, WRONG_SECRET = (
    "unknown_session", "superseded", "offline", "expired", "rebooted", "wrong_secret")
REVOKED, RETIRED = "revoked", "retired"
ENDED_BY = (REVOKED, RETIRED)

# Two live processes presenting one worker's key (SEMANTICS.md §9 Sessions): a session opened by
# taking the key back from the other is noted DUPLICATE; a Register refused as the other process
# coming back is answered with a detail starting DUPLICATE_WORKER (the worker exits 1 with it).
DUPLICATE = "duplicate"
DUPLICATE_WORKER = "duplicate_worker"

# What an attestation may say about a process (SEMANTICS.md §9 Re-attest); `running` re-binds the
# lease, the others are recorded as the attempt's evidence for recovery (§10).
RUNNING = "running"
EVIDENCE_FACTS = frozenset({"stopped", "ended", "never_launched", "launch_unknown", "ended_with_receipt"})


def check_capacity(capacity: Any) -> int:
    if type(capacity) is not int or not 0 <= capacity <= MAX_CAPACITY:
        raise BadInput(f"session capacity must be an integer from 0 to {MAX_CAPACITY}")
    return capacity


def check_ms(name: str, value: Any, *, optional: bool = False) -> int | None:
    """A positive duration in milliseconds (None allowed only when `optional`)."""
    if value is None and optional:
        return None
    if type(value) is not int or not 1 <= value < 2**62:
        raise BadInput(f"{name} must be a positive integer of milliseconds")
    return value


def normal_labels(labels: Iterable[str]) -> tuple[str, ...]:
    """The worker's labels as stored: sorted, each once."""
    if isinstance(labels, str):
        raise BadInput("labels are a list of strings, not one string")
    unique = sorted(set(labels))
    if len(unique) > MAX_LABELS:
        raise BadInput(f"at most {MAX_LABELS} labels")
    for label in unique:
        if type(label) is not str or _LABEL.fullmatch(label) is None:
            raise BadInput(f"invalid label {label!r}: use 1-128 letters, digits, '.', '_', ':' or '-'")
    return tuple(unique)


def labels_json(labels: tuple[str, ...]) -> str:
    return json.dumps(list(labels), separators=(",", ":"))


def check_quote(quote: Any) -> LeaseQuote:
    if not isinstance(quote, LeaseQuote):
        raise BadInput("a lease is quoted as a LeaseQuote")
    check_id("run id", quote.run_id)
    check_id("attempt id", quote.attempt_id)
    check_id("offer id", quote.offer_id)
    if type(quote.lease_generation) is not int or quote.lease_generation < 1:
        raise BadInput("a quoted lease generation is a positive integer")
    check_hash("lease token hash", quote.lease_token_hash)
    return quote


def session_mismatch(session, worker_id: str, generation: int, now: int, *, online_only: bool) -> str | None:
    """Why `session` cannot act for (worker, generation) at `now`, or None when it can.

    Reports are accepted from a `draining` session too: it no longer pulls, but it must still be
    able to start and finish what it holds.
    """
    if session is None:
        return "unknown_session"
    if session.worker_id != worker_id:
        return "session_worker"
    if session.generation != generation:
        return "session_generation"
    if session.status != "online" and (online_only or session.status != "draining"):
        return f"session_{session.status}"
    if session.ended_at_ms is not None:
        return "session_ended"
    if session.lease_expires_at_ms is not None and session.lease_expires_at_ms <= now:
        return "session_expired"
    return None


def resume_refusal(session, worker_id: str, generation: int, latest_generation: int, boot_id: str,
                   secret_hash: str, now: int) -> str | None:
    """Why the worker may not resume `session` at `now`, or None: it must be the worker's current
    session, `online` or ended by its own drain (`drained_at_ms`: a planned restart, SEMANTICS.md
    §9 Drain), unexpired, on the same boot, and the secret's hash must match (constant time). A
    session ended otherwise is never resumed: one the operator ended (`ended_by`: `worker
    revoke`, `worker retire`, drained before or not) is refused with that word, any other
    `offline` one with OFFLINE."""
    if session is None or session.worker_id != worker_id or session.generation != generation:
        return UNKNOWN_SESSION
    if latest_generation > session.generation:
        return SUPERSEDED
    if session.ended_by is not None:
        return session.ended_by
    if session.status != "online" and session.drained_at_ms is None:
        return OFFLINE
    if session.lease_expires_at_ms is not None and session.lease_expires_at_ms <= now:
        return EXPIRED
    if session.boot_id != boot_id:
        return REBOOTED
    if not same_hash(session.resume_secret_hash, secret_hash):
        return WRONG_SECRET
    return None


def _live(session, now: int) -> bool:
    return (session.status in ("online", "draining") and session.ended_at_ms is None
            and session.lease_expires_at_ms is not None and session.lease_expires_at_ms > now)


def _took_over(previous, current) -> bool:
    """Whether `current` was opened by a Register that ended `previous` while it was live (not
    expired, not drained, not ended by the operator): a session taken from a process that may
    still run."""
    return (previous.generation == current.generation - 1 and previous.ended_at_ms == current.created_at_ms
            and previous.ended_by is None and previous.drained_at_ms is None
            and previous.lease_expires_at_ms is not None and previous.lease_expires_at_ms > previous.ended_at_ms)


def duplicate_verdict(lost, successor, now: int, session_lease_ms: int | None) -> str | None:
    """What a Register says about a second process presenting its worker's key, when it asked to
    resume the session `lost` and was refused; `successor` is the session that ended `lost`
    (its generation + 1), when that is the worker's newest.

    Only a process whose own session was taken from it while it lived comes back naming that
    session: a restart names the session it holds (and resumes it), a fresh process names none,
    so neither is ever a duplicate, however often it restarts. The successor live, younger than a
    session lease and opened by taking `lost` over while `lost` lived: two processes alternate.
    DUPLICATE: open the session anyway (this process held the key before; it keeps working) and
    note it. DUPLICATE_WORKER: the successor is itself so noted, so this is the other process
    coming back: refuse it. None: an ordinary Register."""
    if lost is None or successor is None or session_lease_ms is None:
        return None
    if not _live(successor, now) or now - successor.created_at_ms >= session_lease_ms:
        return None
    if not _took_over(lost, successor):
        return None
    return DUPLICATE_WORKER if successor.note == DUPLICATE else DUPLICATE


def clock_skew(now_ms: int, worker_clock_ms: int | None) -> int | None:
    """Database time minus the worker's clock (for `workers`; a value no clock gives is no skew)."""
    if type(worker_clock_ms) is not int or worker_clock_ms < 0:
        return None
    return now_ms - worker_clock_ms


def ended_at(session, now: int) -> int:
    """When a session that is being ended ended: as recorded, else at its lease's expiry if that is
    past, else now (the recovery grace counts from here)."""
    if session.ended_at_ms is not None:
        return session.ended_at_ms
    if session.lease_expires_at_ms is not None and session.lease_expires_at_ms < now:
        return session.lease_expires_at_ms
    return now


def renewal_fence(quote: LeaseQuote, lease, attempt, worker_id: str, session_id: str,
                  generation: int) -> str | None:
    """Why a heartbeat of (worker, session, generation) may not renew the quoted lease, or None.

    Expiry never fences a renewal (an expired but `leased` lease of a running attempt is only a
    recovery candidate), and the lease version is not quoted.
    """
    if attempt is None or attempt.run_id != quote.run_id:
        return "unknown_attempt"
    if lease is None or lease.run_id != quote.run_id:
        return "lease_generation"
    if lease.offer_id != quote.offer_id:
        return "offer_id"
    if (lease.worker_id, lease.session_id, lease.session_generation) != (worker_id, session_id, generation):
        return "lease_session"
    if not same_hash(lease.token_hash, quote.lease_token_hash):
        return "lease_token"
    if lease.status != LeaseStatus.LEASED.value:
        return f"lease_{lease.status}"
    status = AttemptStatus(attempt.status)
    if status is AttemptStatus.LOST:
        return "attempt_lost"
    if status.terminal:
        return "attempt_terminal"
    return None


def answer_json(answer: HeartbeatAnswer) -> str:
    """The stored form of a heartbeat's answer (a repeat of its number gets it back unchanged)."""
    return json.dumps({
        "seq": answer.seq, "session_expires_at_ms": answer.session_expires_at_ms,
        "renewed": [list(r) for r in answer.renewed], "fenced": [list(f) for f in answer.fenced],
        "session_ended": answer.session_ended, "stale": answer.stale, "reason": answer.reason,
    }, separators=(",", ":"))


def answer_from_json(text: str) -> HeartbeatAnswer:
    data = json.loads(text)
    return HeartbeatAnswer(
        seq=data["seq"], session_expires_at_ms=data["session_expires_at_ms"],
        renewed=tuple(tuple(r) for r in data["renewed"]), fenced=tuple(tuple(f) for f in data["fenced"]),
        session_ended=data["session_ended"], stale=data["stale"], reason=data["reason"])
