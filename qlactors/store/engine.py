"""Store: opening one: the engine for a URL, dialect wiring, short transactions and driver-error translation."""

from __future__ import annotations

import contextlib
import os
import re
import threading
from typing import Callable, Iterator

from sqlalchemy import create_engine, exc
from sqlalchemy.engine import Connection, Engine, make_url

from ..errors import BadInput, DatabaseMissing, QlactorsError, SchemaError, StoreUnavailable
from . import postgres, sqlite
from .health import StoreHealth


# The server's words for a database it does not have (psycopg gives no SQLSTATE for a refused
# connection, so the text is all there is).
_NO_SUCH_DATABASE = re.compile(r'database "(?P<name>[^"]+)" does not exist')


class Store:
    """An engine plus the one way qlactors talks to it: `write()` and `read()` transactions."""

    def __init__(self, url: str, *, echo: bool = False, pool_size: int | None = None,
                 lock_timeout_ms: int | None = None, statement_timeout_ms: int | None = None,
                 idle_in_transaction_timeout_ms: int | None = None) -> None:
        """`pool_size` (PostgreSQL, default 4; as many again may overflow) and the three
        PostgreSQL timeouts, set on every connection (SEMANTICS.md §9 Transport): None leaves the
        server's setting. A wait or statement cut short by one raises `StoreUnavailable`."""
        parsed = make_url(url)
        self.url = parsed
        self.dialect_name = parsed.get_backend_name()
        timeouts = postgres.session_timeouts(lock_timeout_ms=lock_timeout_ms,
                                             statement_timeout_ms=statement_timeout_ms,
                                             idle_in_transaction_timeout_ms=idle_in_transaction_timeout_ms)
        if pool_size is not None and (type(pool_size) is not int or not 1 <= pool_size <= 256):
            raise BadInput("pool_size must be an integer from 1 to 256")
        if self.dialect_name == "sqlite":
            if timeouts or pool_size is not None:
                raise BadInput("pool_size and the lock, statement and idle-in-transaction timeouts are "
                               "PostgreSQL settings; a SQLite store takes none of them")
            self._dialect = sqlite
            # hide_parameters: a database error's message and traceback never quote a bound value
            # (a command, an environment value, a token hash).
            self.engine: Engine = create_engine(parsed, echo=echo, pool_size=2, max_overflow=2, hide_parameters=True)
            self._dialect.configure(self.engine)
        elif self.dialect_name == "postgresql":
            if parsed.get_driver_name() != "psycopg":
                raise QlactorsError("PostgreSQL URLs must use psycopg 3: postgresql+psycopg://...")
            postgres.require_driver()  # one line instead of SQLAlchemy's ModuleNotFoundError
            self._dialect = postgres
            size = pool_size if pool_size is not None else postgres.DEFAULT_POOL_SIZE
            self.engine = create_engine(parsed, echo=echo, isolation_level="READ COMMITTED",
                                        pool_size=size, max_overflow=size, hide_parameters=True)
            postgres.configure(self.engine, timeouts)
        else:
            raise QlactorsError(f"unsupported database {self.dialect_name!r}: use sqlite or postgresql+psycopg")
        if os.environ.get("QLACTORS_COUNT_SQL"):  # benchmarks only: off unless asked for
            from . import sql_counts
            sql_counts.install(self.engine, os.environ["QLACTORS_COUNT_SQL"])
        # SQLite has one writer. Threads of this process queue here for it instead of in SQLite's
        # busy handler, which sleeps 1-100 ms between retries while the lock is held.
        self._writer = threading.RLock() if self._dialect is sqlite else None
        # ...and share two connections, held open (checking one out of the pool and back in, with
        # its reset, costs more than a short transaction): one per durability, see `write`.
        self._write_conns: dict[bool, Connection] = {}
        self._insert_new: dict[str, object] = {}
        self.health = StoreHealth()

    @property
    def is_postgres(self) -> bool:
        return self._dialect is postgres

    def insert_new(self, conn: Connection, table, values: dict) -> bool:
        """INSERT unless a unique key already holds the row; True when this call inserted it.

        `ON CONFLICT DO NOTHING RETURNING` instead of catching IntegrityError: a caught error
        leaves a PostgreSQL transaction aborted. The caller re-reads the winner if it needs it.
        """
        query = self._insert_new.get(table.name)
        if query is None:  # built once per table: the VALUES come from the parameters
            key = list(table.primary_key.columns)[0]
            query = self._insert_new[table.name] = (
                self._dialect.insert(table).on_conflict_do_nothing().returning(key))
        return conn.execute(query, values).first() is not None

    def now_ms(self, conn: Connection) -> int:
        """The time every decision in this transaction uses (SQLite: system clock; PostgreSQL: database)."""
        return self._dialect.now_ms(conn)

    def advisory_lock(self, conn: Connection, key: str) -> None:
        """Serialise on a key for the rest of the transaction (PostgreSQL); SQLite already has one writer."""
        self.advisory_locks(conn, [key])

    def try_advisory_lock(self, conn: Connection, key: str) -> bool:
        """`advisory_lock` without waiting: False when another transaction holds it (PostgreSQL)."""
        return self._dialect.try_advisory_lock(conn, key)

    def advisory_locks(self, conn: Connection, keys: list[str]) -> None:
        """`advisory_lock` on each key in the order given, in one statement."""
        if keys:
            self._dialect.advisory_locks(conn, keys)

    def advisory_locks_then_tasks(self, conn: Connection, keys: list[str], run_ids: list[str]) -> None:
        """`advisory_locks(keys)`, then the `task:<id>` locks of these runs' tasks in task-id
        order (PostgreSQL), in one statement."""
        if not run_ids:
            self.advisory_locks(conn, keys)
        else:
            self._dialect.advisory_locks_then_tasks(conn, keys, run_ids)

    @contextlib.contextmanager
    def write(self, *, durable: bool = True) -> Iterator[Connection]:
        """One short write transaction (SQLite: `BEGIN IMMEDIATE`); commits on success.

        `durable=False` is for a commit whose loss in a power failure cannot change any outcome,
        because the processes it describes die with the machine (an executor journal step, an
        offer, a Started report; docs/semantics.md, "Durability of commits"). On SQLite it
        commits without an fsync (WAL, `synchronous=NORMAL`): it survives a crash of qlactors,
        and the next durable commit flushes it with everything before it. On PostgreSQL every
        commit is synchronous.
        """
        if self._writer is None:
            with translate_errors(self), self.engine.begin() as conn:
                with _last_steps(conn):
                    yield conn
            return
        with self._writer, translate_errors(self):
            conn = self._write_conns.get(durable)
            if conn is None or conn.closed or conn.invalidated:
                if conn is not None:
                    conn.close()
                conn = self._write_conns[durable] = self.engine.connect()
                if not durable:  # on the driver's connection: SQLAlchemy would begin first
                    conn.connection.driver_connection.execute(sqlite.NOT_DURABLE)
            with conn.begin(), _last_steps(conn):
                yield conn

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        """One read transaction (a consistent snapshot); never takes the SQLite write lock."""
        with translate_errors(self, write=False), self.engine.connect() as conn:
            conn = conn.execution_options(**{sqlite.READ_ONLY_OPTION: True})
            with conn.begin():
                yield conn

    def describe(self) -> str:
        return self.url.render_as_string(hide_password=True)

    def close(self) -> None:
        if self._writer is not None:
            with self._writer:
                for conn in self._write_conns.values():
                    conn.close()
                self._write_conns.clear()
        self.engine.dispose()


_LAST_STEPS = "qlactors_last_steps"


def last_step(conn: Connection, step: Callable[[Connection], None]) -> None:
    """Run `step(conn)` once, after everything else in this write transaction and before it commits.

    For writes that lock rows no lock order covers (the `/metrics` counters of store/run_endings.py):
    done last, in an order of their own, they cannot close a deadlock with the run, attempt and
    lease locks a transaction takes first (SEMANTICS.md §9's order)."""
    steps = conn.info.setdefault(_LAST_STEPS, [])
    if step not in steps:
        steps.append(step)


@contextlib.contextmanager
def _last_steps(conn: Connection) -> Iterator[None]:
    """Around one write transaction's body: its `last_step`s run when the body ends without an
    error; none survive into the next transaction on the same connection either way."""
    info = conn.info  # held: after a lost connection, reading conn.info would raise
    info.pop(_LAST_STEPS, None)
    try:
        yield
        for step in info.pop(_LAST_STEPS, ()):
            step(conn)
    finally:
        info.pop(_LAST_STEPS, None)


@contextlib.contextmanager
def translate_errors(store: Store, *, write: bool = True) -> Iterator[None]:
    """Turn driver errors into qlactors errors at the store boundary; actors never see a driver."""
    try:
        yield
    except exc.DBAPIError as err:
        message = " ".join(str(getattr(err, "orig", err)).split())  # one line (libpq adds hints)
        if "file is not a database" in message or "malformed" in message:
            raise SchemaError(
                f"{store.describe()} is not a readable qlactors database ({message}); it was left "
                "untouched: move it aside or point --home elsewhere") from err
        # OperationalError: busy/locked, I/O, a server gone, and on PostgreSQL a serialization
        # failure, a deadlock, a lock or statement timeout, a server shutdown; InterfaceError or
        # an invalidated connection: a connection reset under us. All transient: the transaction
        # was rolled back, nothing was changed.
        if (isinstance(err, (exc.OperationalError, exc.InterfaceError)) or err.connection_invalidated
                or postgres.transient(err.orig)):
            store.health.failed(message, write=write)
            missing = _NO_SUCH_DATABASE.search(message)
            if missing is not None:
                name = missing.group("name")
                raise DatabaseMissing(
                    f"the database {name} does not exist on the server of {store.describe()}: create it "
                    f"(`createdb {name}`, or CREATE DATABASE {name}) or correct the URL") from err
            # A read changes nothing whatever happens: saying so would suggest it might have.
            then = ("nothing was changed, try again" if write else
                    "is the database up? try again" if store.is_postgres else "try again")
            raise StoreUnavailable(
                f"database {store.describe()} is unavailable: {message}; {then}") from err
        raise
    store.health.succeeded(write=write)
