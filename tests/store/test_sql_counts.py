"""QLACTORS_COUNT_SQL: the benchmarks' opt-in statement and transaction counts of a Store."""

from __future__ import annotations

import json

from sqlalchemy import text

from qlactors.store import sql_counts
from qlactors.store.engine import Store


def test_statement_kinds_name_the_verb_and_the_main_table():
    assert sql_counts.kind_of("UPDATE run_attempts SET status=%(s)s WHERE id=%(i)s") == "UPDATE run_attempts"
    assert sql_counts.kind_of("INSERT INTO run_events (a) VALUES (1)") == "INSERT run_events"
    assert sql_counts.kind_of("SELECT runs.id FROM runs JOIN tasks ON 1=1") == "SELECT runs"
    assert sql_counts.kind_of("SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0))") == \
        "SELECT pg_advisory_xact_lock"
    assert sql_counts.kind_of("DELETE FROM log_chunks WHERE run_id = 1") == "DELETE log_chunks"
    assert sql_counts.kind_of("SAVEPOINT sa_1") == "SAVEPOINT"


def test_without_the_variable_nothing_is_installed(tmp_path, monkeypatch):
    monkeypatch.delenv(sql_counts.ENV, raising=False)
    monkeypatch.setattr(sql_counts, "_COUNTS", None)
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        with store.write() as conn:
            conn.execute(text("SELECT 1"))
    finally:
        store.close()
    assert sql_counts._COUNTS is None


def test_a_store_counts_its_statements_and_transactions_into_the_file(store_url, tmp_path, monkeypatch):
    out = tmp_path / "counts.json"
    monkeypatch.setenv(sql_counts.ENV, str(out))
    monkeypatch.setattr(sql_counts, "_COUNTS", None)
    store = Store(store_url)
    try:
        before = sql_counts._COUNTS.snapshot()
        for _ in range(3):
            with store.write() as conn:
                conn.execute(text("SELECT 1"))
                conn.execute(text("SELECT 2"))
        with store.read() as conn:
            conn.execute(text("SELECT 3"))
        sql_counts._COUNTS.dump()
    finally:
        store.close()
    data = json.loads(out.read_text())
    assert data["statements"] - before["statements"] >= 7
    assert data["commits"] - before["commits"] >= 4
    assert data["kinds"]["SELECT"] >= 7
    assert "pings" not in data  # the pool does not pre-ping: no statement runs outside the events
