"""Store: PostgreSQL specifics: READ COMMITTED, per-connection timeouts, database time, advisory locks,
and which server errors are transient."""

from __future__ import annotations

from sqlalchemy import event, text
from sqlalchemy.dialects.postgresql import insert as _insert
from sqlalchemy.engine import Connection, Engine

from ..errors import BadInput

NOW_SQL = "(extract(epoch FROM statement_timestamp()) * 1000)::bigint"
_NOW = text(f"SELECT {NOW_SQL}")
# Advisory locks on keys in the order given (a function scan keeps the array's order). A lock
# statement also reads the database time, so a transaction that starts with a lock needs no
# statement of its own for it (see `now_ms`).
_ADVISORY_MANY = text(f"SELECT count(pg_advisory_xact_lock(hashtextextended(k, 0))), {NOW_SQL} "
                      "FROM unnest(CAST(:keys AS text[])) AS k")
# Those keys, then the `task:<id>` locks of some runs' tasks in task-id order (as the offers take
# them): the CTE's aggregate ends before the select list's subquery starts. A task id never
# changes, so it is read before its lock.
_THEN_TASKS_OF_RUNS = text(
    "WITH a AS (SELECT count(pg_advisory_xact_lock(hashtextextended(k, 0))) AS n "
    "FROM unnest(CAST(:keys AS text[])) AS k) "
    "SELECT a.n + (SELECT count(pg_advisory_xact_lock(hashtextextended('task:' || t.task_id, 0))) "
    "FROM (SELECT task_id FROM runs WHERE id = ANY(CAST(:ids AS text[])) "
    f'GROUP BY task_id ORDER BY task_id COLLATE "C") AS t), {NOW_SQL} FROM a')
_TRY_ADVISORY = text("SELECT pg_try_advisory_xact_lock(hashtextextended(:key, 0))")
_TIME_KEY = "qlactors_transaction_time"


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


def require_driver() -> None:
    """BadInput unless psycopg 3 imports: it is an extra (`qlactors[postgres]`), not a dependency."""
    try:
        import psycopg  # noqa: F401  (SQLAlchemy imports it again when the engine is made)
    except ImportError as err:
        why = "" if isinstance(err, ModuleNotFoundError) and err.name == "psycopg" else f" ({err})"
        raise BadInput(f"the cluster profile needs psycopg{why}: pip install 'qlactors[postgres]'") from None


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
    """Cluster time is the database's, never a worker's clock: the first time this transaction
    read (`statement_timestamp()` of its first lock statement, or of this call), so a
    transaction decides by one time and reads it with no statement of its own after a lock."""
    held = _held_time(conn)
    return held if held is not None else keep_time(conn, conn.execute(_NOW).scalar_one())


def keep_time(conn: Connection, value) -> int:
    """Keep `value` (a NOW_SQL column a statement read) as the transaction's time, unless it has
    one already; the transaction's time."""
    held = _held_time(conn)
    if held is not None:
        return held
    conn.info[_TIME_KEY] = (conn.get_transaction(), int(value))
    return int(value)


def _held_time(conn: Connection) -> int | None:
    held = conn.info.get(_TIME_KEY)  # per driver connection: valid for the transaction it names
    return held[1] if held is not None and held[0] is conn.get_transaction() else None


def advisory_locks(conn: Connection, keys: list[str]) -> None:
    """Serialise on each of `keys`, in their order, until the transaction ends (attempt, task
    and worker authority, SEMANTICS.md §9), in one statement."""
    keep_time(conn, conn.execute(_ADVISORY_MANY, {"keys": keys}).one()[1])


def try_advisory_lock(conn: Connection, key: str) -> bool:
    """Take `key`'s advisory lock until the transaction ends if no one holds it; whether it did."""
    return bool(conn.execute(_TRY_ADVISORY, {"key": key}).scalar_one())


def advisory_locks_then_tasks(conn: Connection, keys: list[str], run_ids: list[str]) -> None:
    """`advisory_locks(keys)`, then the `task:<id>` locks of the runs' tasks in task-id order,
    in one statement."""
    keep_time(conn, conn.execute(_THEN_TASKS_OF_RUNS, {"keys": keys, "ids": run_ids}).one()[1])


insert = _insert
