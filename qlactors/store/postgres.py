"""PostgreSQL specifics: READ COMMITTED, per-connection timeouts, database time, advisory locks,
and which server errors are transient."""

from __future__ import annotations

from sqlalchemy import event, text
from sqlalchemy.dialects.postgresql import insert as _insert
from sqlalchemy.engine import Connection, Engine

from ..errors import BadInput

_NOW = text("SELECT (extract(epoch FROM statement_timestamp()) * 1000)::bigint")
_ADVISORY = text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))")


DEFAULT_POOL_SIZE = 4

# Store argument -> server setting (SEMANTICS.md §9 Transport: shorter than the heartbeat).
_TIMEOUTS = {
    "lock_timeout_ms": "lock_timeout",
    "statement_timeout_ms": "statement_timeout",
    "idle_in_transaction_timeout_ms": "idle_in_transaction_session_timeout",
}
# SQLSTATEs that say "try again": the transaction was rolled back or the connection is gone.
# Class 08 (connection exception) and 57P0x (server shutdown, crash, starting) included; psycopg
# raises most of them as OperationalError, but not all (25P03 is an InternalError).
_TRANSIENT = frozenset({
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "55P03",  # lock_not_available (lock_timeout, NOWAIT)
    "57014",  # query_canceled (statement_timeout, pg_cancel_backend)
    "57P01", "57P02", "57P03",  # admin_shutdown, crash_shutdown, cannot_connect_now
    "25P03",  # idle_in_transaction_session_timeout
    "53300",  # too_many_connections
})


def session_timeouts(**values: int | None) -> dict[str, int]:
    """The given timeouts as server settings (milliseconds); None leaves the server's own."""
    settings = {}
    for name, value in values.items():
        if value is None:
            continue
        if type(value) is not int or not 1 <= value <= 2**31 - 1:
            raise BadInput(f"{name} must be a positive integer of milliseconds")
        settings[_TIMEOUTS[name]] = value
    return settings


def configure(engine: Engine, timeouts: dict[str, int]) -> None:
    """Set the timeouts on every new connection; isolation is set on the engine, time is read per
    statement."""
    if not timeouts:
        return
    statement = "SELECT " + ", ".join(f"set_config('{name}', %s, false)" for name in timeouts)
    values = [f"{ms}ms" for ms in timeouts.values()]

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        with dbapi_conn.cursor() as cursor:
            cursor.execute(statement, values)
        dbapi_conn.commit()  # a session setting outlives the transaction that set it


def transient(driver_error) -> bool:
    """Whether a driver error is one the actor that met it retries (see `_TRANSIENT`)."""
    state = getattr(driver_error, "sqlstate", None)
    return isinstance(state, str) and (state in _TRANSIENT or state.startswith("08"))


def now_ms(conn: Connection) -> int:
    """Cluster time is the database's, never a worker's clock."""
    return int(conn.execute(_NOW).scalar_one())


def advisory_lock(conn: Connection, key: str) -> None:
    """Serialise on `key` until the transaction ends (attempt authority, SEMANTICS.md §9)."""
    conn.execute(_ADVISORY, {"key": key})


insert = _insert
