"""The error vocabulary: every qlactors exception descends from QlactorsError, and each knows its
exit status (2 bad input, 1 runtime; None for a bug, which a command ends with as a traceback)."""

from __future__ import annotations


class QlactorsError(Exception):
    """A runtime failure: the request was sound but could not be carried out (exit status 1).

    `exit_status` None marks a fault that is no answer for a user (a bug, a row this qlactors
    did not write): a command meeting one lets it through, traceback and all, instead of
    printing it as one line.
    """

    exit_status: int | None = 1


class PeerFault(QlactorsError, ValueError):
    """What a peer sent cannot be accepted: its fault, answered with a refusal, never a crash.

    The Gateway answers `refused` to a message whose handling raises one (a frame the codec
    refuses, a receipt, a value the store or the state machine rejects); a user's wrong request
    is one too (BadInput). A ValueError as well, so code that catches ValueError still does.
    """


class BadInput(PeerFault):
    """The request itself is wrong; nothing was written (exit status 2). `field` names what is
    refused where one thing is (an API body's path, `trigger.cron`; None otherwise)."""

    exit_status = 2
    field: str | None = None


class NotFound(BadInput):
    """A named task or run does not exist."""


class AlreadyExists(BadInput):
    """A name that must be unique is taken."""


class SchemaError(BadInput):
    """The database is corrupt, foreign, or from a newer qlactors; it was left untouched."""


class Conflict(QlactorsError):
    """A compare-and-set matched no row: someone else changed the state first. Never retried blindly."""


class StoreUnavailable(QlactorsError):
    """The database could not be reached or stayed locked; nothing was changed.

    Transient by nature (SQLite busy beyond its timeout, an I/O error, a PostgreSQL connection
    reset): the runtime retries it with backoff, and stops only when `StoreHealth` says the
    outage has lasted longer than `store_outage_stop_ms`.
    """


class DatabaseMissing(StoreUnavailable):
    """The PostgreSQL server answered, but the database the URL names does not exist. Trying
    again cannot fix it (exit status 2); a runtime that meets it retries as for any outage."""

    exit_status = 2


class Retired(NotFound):
    """The run existed but retention deleted it (its rows and log); only its tombstone is left (exit 4)."""

    exit_status = 4

    def __init__(self, run_id: str, retired_at_ms: int, reason: str) -> None:
        from datetime import datetime, timezone

        when = datetime.fromtimestamp(retired_at_ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
        super().__init__(f"run {run_id} was retired on {when} ({reason}); its log was deleted")
        self.run_id, self.retired_at_ms, self.reason = run_id, retired_at_ms, reason
