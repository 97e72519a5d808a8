"""Migrated PostgreSQL schemas for the store tests, emptied and handed to the next test.

Migrating a brand-new schema is some eighty DDL statements (~0.5 s a test, more on a busy
machine) and dropping it another ~0.2 s; emptying a used one is a few cheap DELETEs. A schema is
handed on only when it is the same as a fresh migrated one would be: no connection of the last
test left (each URL names its schema as `application_name`), the same catalog (tables, columns,
constraints, indexes, types, functions, privileges), the same `qlactors_schema` row, every other
table empty. Anything else, or any error on the way, and the schema is dropped as before.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import psycopg
from psycopg import sql

# Everything in a schema a test could change that a fresh migration fixes, as one text.
_CATALOG = """
SELECT md5(coalesce(string_agg(item, E'\\n' ORDER BY item), '')) FROM (
  SELECT concat_ws(' ', 'rel', c.relname, c.relkind, c.relpersistence, c.relacl, c.reloptions,
                   c.relrowsecurity)
    FROM pg_class c WHERE c.relnamespace = %(ns)s::regnamespace
  UNION ALL
  SELECT concat_ws(' ', 'col', c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                   pg_get_expr(d.adbin, d.adrelid))
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
   WHERE c.relnamespace = %(ns)s::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
  SELECT concat_ws(' ', 'con', conname, pg_get_constraintdef(oid))
    FROM pg_constraint WHERE connamespace = %(ns)s::regnamespace
  UNION ALL
  SELECT concat_ws(' ', 'idx', pg_get_indexdef(i.indexrelid))
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relnamespace = %(ns)s::regnamespace
  UNION ALL
  SELECT concat_ws(' ', 'trg', t.tgname) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
   WHERE c.relnamespace = %(ns)s::regnamespace AND NOT t.tgisinternal
  UNION ALL
  SELECT concat_ws(' ', 'fn', p.oid::regprocedure) FROM pg_proc p WHERE p.pronamespace = %(ns)s::regnamespace
  UNION ALL
  SELECT concat_ws(' ', 'type', t.typname) FROM pg_type t WHERE t.typnamespace = %(ns)s::regnamespace
  UNION ALL
  SELECT concat_ws(' ', 'schema', n.nspacl, n.nspowner::regrole)
    FROM pg_namespace n WHERE n.oid = %(ns)s::regnamespace
) catalog(item)
"""
_VERSION_ROW = "SELECT id, version, applied_at_ms FROM {}.qlactors_schema ORDER BY id"
_TABLES = "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename <> 'qlactors_schema'"
_CONNECTED = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND pid <> pg_backend_pid()"
_GONE_WITHIN_S = 2.0  # a closed connection's server process exits a moment after the client closes


def schema_url(base_url: str, schema: str) -> str:
    """`base_url` with `schema` as its search_path and its connections' application_name."""
    sep = "&" if "?" in base_url else "?"
    return f"{base_url}{sep}options=-csearch_path%3D{schema}&application_name={schema}"


def create_schema(admin_conninfo: str) -> str:
    """A brand-new empty schema; its name."""
    schema = f"qlt_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(admin_conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    return schema


def drop_schema(admin_conninfo: str, schema: str) -> None:
    with psycopg.connect(admin_conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


class SchemaPool:
    """Schemas at the newest version: `take()` one (a URL), `give_back()` it after the test."""

    def __init__(self, admin_conninfo: str, base_url: str, migrate: Callable[[str], None]) -> None:
        self._admin = admin_conninfo
        self._base = base_url
        self._migrate = migrate  # opens the URL as the product does, which migrates it
        self._idle: list[str] = []
        self._fresh: dict[str, tuple] = {}  # schema -> its `_state` when freshly migrated

    def take(self) -> str:
        if self._idle:
            return schema_url(self._base, self._idle.pop())
        schema = create_schema(self._admin)
        try:
            self._migrate(schema_url(self._base, schema))
            with psycopg.connect(self._admin) as conn:
                self._fresh[schema] = self._state(conn, schema)
        except BaseException:
            drop_schema(self._admin, schema)
            raise
        return schema_url(self._base, schema)

    def give_back(self, url: str) -> None:
        schema = url.rsplit("application_name=", 1)[1]
        try:
            reusable = self._empty(schema)
        except (psycopg.Error, KeyError):
            reusable = False
        if reusable:
            self._idle.append(schema)
        else:
            self._fresh.pop(schema, None)
            drop_schema(self._admin, schema)

    def close(self) -> None:
        while self._idle:
            drop_schema(self._admin, self._idle.pop())

    # -- one schema -------------------------------------------------------------------------------

    def _state(self, conn: psycopg.Connection, schema: str) -> tuple:
        """(catalog digest, qlactors_schema rows, the other tables)."""
        digest = conn.execute(_CATALOG, {"ns": schema}).fetchone()[0]
        rows = conn.execute(sql.SQL(_VERSION_ROW).format(sql.Identifier(schema))).fetchall()
        tables = conn.execute(_TABLES, (schema,)).fetchall()
        return digest, tuple(rows), tuple(sorted(t for (t,) in tables))

    def _empty(self, schema: str) -> bool:
        """Empty the tables of a used schema; True when it now equals its freshly migrated self."""
        deadline = time.monotonic() + _GONE_WITHIN_S
        with psycopg.connect(self._admin) as conn:
            while conn.execute(_CONNECTED, (schema,)).fetchone()[0]:
                conn.rollback()  # a new snapshot of pg_stat_activity
                if time.monotonic() >= deadline:
                    return False  # the test left a connection open: it could still write
                time.sleep(0.02)
            # One round trip; no reference checks (every table is emptied); the tables are those
            # of the fresh schema (another table would change the catalog digest below).
            conn.execute(sql.SQL("; ").join([
                sql.SQL("SET LOCAL lock_timeout = '5s'"), sql.SQL("SET LOCAL session_replication_role = replica"),
                *(sql.SQL("DELETE FROM {}.{}").format(sql.Identifier(schema), sql.Identifier(table))
                  for table in self._fresh[schema][2])]))
            if self._state(conn, schema) != self._fresh[schema]:
                conn.rollback()
                return False
            conn.commit()
        return True
