"""Domain: the one result vocabulary of the fenced operations, and the one record they answer with.

Every fenced operation of the store (a report, an activation, an attestation, a completion, a log
chunk, a re-bind, recovery's and retry's steps, ending a session, confirm-stopped) and a cancel
answer with an `Outcome`: a `Result` word, a short machine word `detail` saying why (None when
there is nothing to add), the run's status after it, and the operation's own facts in `value`
(a lease's terms, the new fence, the stored log's end...). The wire's answer literals
(`wire.messages.AckResult`, `AttestResult`) are values of `Result`:
tests/domain/test_domain_results.py compares them, so a word cannot mean one thing in the store
and another on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

T = TypeVar("T")


class Result(StrEnum):
    """What a fenced operation did. A StrEnum: each member equals its word (`Result.APPLIED ==
    "applied"`), so a word decoded from the wire or the answer ledger compares as it is."""

    APPLIED = "applied"
    """It took effect now, or a repeat found its effect already stored (`detail` may say which)."""
    ALREADY_TERMINAL = "already_terminal"
    """The run or attempt had ended before: nothing changed, and nothing is wrong."""
    FENCED = "fenced"
    """The caller's fence (session, lease generation, token, offer) is no longer current: nothing
    changed; the caller stops acting on that lease."""
    REFUSED = "refused"
    """The fence holds, or there is none, but the request is wrong now (a token, a gap, a state
    that forbids it): nothing changed; `detail` says why."""
    SUPERSEDED = "superseded"
    """The attempt ended or a later attempt replaced it: stop the process (attestations)."""
    CANCELLED = "cancelled"
    """A cancel ended the run in the same transaction (no process was live)."""
    REQUESTED = "requested"
    """A cancel's intent is committed; the runtime stops the job and the run ends cancelled."""
    ALREADY_REQUESTED = "already_requested"
    """An earlier cancel is still being carried out: nothing changed."""


# The results after which the operation's subject is settled: the report or receipt that asked
# has been taken into account (now, or by an earlier copy, or the run had ended anyway).
SETTLED = frozenset({Result.APPLIED, Result.ALREADY_TERMINAL})


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """The answer of a fenced operation: `result`, why (`detail`), the run's status after it
    (`run_state`, None when no run was found or the operation does not say), and the operation's
    own facts (`value`, None for operations that have none). `result` is always a `Result`: a
    word outside the vocabulary raises ValueError when the record is built."""

    result: Result
    detail: str | None = None
    run_state: str | None = None
    value: T | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "result", Result(self.result))

    @property
    def applied(self) -> bool:
        return self.result is Result.APPLIED

    @property
    def settled(self) -> bool:
        """Applied or already terminal: see `SETTLED`."""
        return self.result in SETTLED
