"""Migrating an empty database yields exactly the schema of `qlactors.store.schema`, on both dialects."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import CheckConstraint, MetaData, inspect, text
from sqlalchemy.exc import IntegrityError

from qlactors.errors import SchemaError
from qlactors.store.engine import Store
from qlactors.store.migrations import available, current_version, latest_version, migrate
from qlactors.executor.journal.schema import TABLES as JOURNAL_TABLES
from qlactors.store.schema import NAMING_CONVENTION, metadata


@pytest.fixture
def store(store_url):
    s = Store(store_url)
    yield s
    s.close()


def expected_metadata(dialect: str) -> MetaData:
    """The control schema; an edge file (SQLite) holds the executor journal's own tables beside it."""
    if dialect != "sqlite":
        return metadata
    both = MetaData(naming_convention=NAMING_CONVENTION)
    for table in (*metadata.sorted_tables, *JOURNAL_TABLES):
        table.to_metadata(both)
    return both


def test_migrated_database_equals_metadata(store):
    assert migrate(store) == latest_version(store.dialect_name)
    with store.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, expected_metadata(store.dialect_name))
    assert diff == []


def test_the_journal_tables_are_only_in_an_edge_file(store):
    migrate(store)
    with store.engine.connect() as conn:
        names = set(inspect(conn).get_table_names())
    journal = {t.name for t in JOURNAL_TABLES}
    assert (journal <= names) if store.dialect_name == "sqlite" else not (journal & names), sorted(names)
    assert not journal & set(metadata.tables)  # the control schema never names them


def test_migrated_database_has_every_check_constraint(store):
    migrate(store)
    with store.engine.connect() as conn:
        insp = inspect(conn)
        for table in expected_metadata(store.dialect_name).sorted_tables:
            expected = {c.name for c in table.constraints if isinstance(c, CheckConstraint)}
            found = {c["name"] for c in insp.get_check_constraints(table.name)}
            assert expected <= found, (table.name, expected - found)


def test_partial_unique_indexes_exist(store):
    migrate(store)
    with store.engine.connect() as conn:
        insp = inspect(conn)
        unique = {ix["name"] for ix in insp.get_indexes("run_attempts") if ix["unique"]}
        assert "ix_run_attempts_one_active" in unique
        unique = {ix["name"] for ix in insp.get_indexes("tasks") if ix["unique"]}
        assert "ix_tasks_live_name" in unique


def test_migrate_twice_is_a_no_op(store):
    first = migrate(store)
    assert migrate(store) == first
    assert current_version(store) == first


def test_newer_schema_is_refused_and_left_alone(store):
    migrate(store)
    with store.write() as conn:
        conn.execute(text("UPDATE qlactors_schema SET version = 999"))
    with pytest.raises(SchemaError, match="newer"):
        migrate(store)
    assert current_version(store) == 999


def test_foreign_database_is_refused(store):
    with store.write() as conn:
        conn.execute(text("CREATE TABLE someone_elses (x INTEGER)"))
    with pytest.raises(SchemaError, match="not a qlactors database"):
        migrate(store)


def test_migration_files_are_numbered_for_both_dialects():
    assert [m.version for m in available("sqlite")] == [m.version for m in available("postgresql")]
    assert latest_version("sqlite") >= 1


def test_schema_3_database_upgrades_to_4_keeping_its_rows(store, monkeypatch):
    """A database written by schema 3 keeps its tasks, runs and leases through schema 4's rebuild."""
    import qlactors.store.migrations as migrations
    from qlactors.store.schema import run_attempts, run_dispatch_leases, runs, task_revisions, tasks, worker_sessions

    shipped = available(store.dialect_name)
    monkeypatch.setattr(migrations, "available", lambda dialect: shipped[:3])
    assert migrate(store) == 3
    monkeypatch.undo()
    t = 1_700_000_000_000
    with store.write() as conn:
        conn.execute(tasks.insert().values(id="t1", name="old", current_revision=1, version=1, enabled=True,
                                           created_at_ms=t, updated_at_ms=t))
        conn.execute(task_revisions.insert().values(
            task_id="t1", revision=1, command_json='{"argv": ["true"]}', cwd=None, env_json="{}",
            timeout_ms=None, stop_grace_ms=1000, max_concurrent=1, retry_on_lost=False, max_attempts=1,
            safety="unknown", backoff_base_ms=1000, backoff_max_ms=300000, labels_json="[]", created_at_ms=t))
        conn.execute(runs.insert().values(id="r1", task_id="t1", task_revision=1, trigger_type="manual",
                                          status="dispatching", version=2, event_sequence=2,
                                          created_at_ms=t, queued_at_ms=t, updated_at_ms=t))
        conn.execute(run_attempts.insert().values(id="a1", run_id="r1", number=1, status="claimed",
                                                  executor_type="local", callback_sequence=0,
                                                  created_at_ms=t, updated_at_ms=t))
        conn.execute(worker_sessions.insert().values(session_id="s1", worker_id="local", generation=1,
                                                     status="online", version=1, capacity=1, free_slots=0,
                                                     created_at_ms=t, updated_at_ms=t))
        conn.execute(run_dispatch_leases.insert().values(
            attempt_id="a1", lease_generation=1, run_id="r1", status="released", version=2,
            worker_id="local", session_id="s1", session_generation=1, token_hash="0" * 64, offer_id="o1",
            release_reason="declined", created_at_ms=t, updated_at_ms=t))
    assert migrate(store) == latest_version(store.dialect_name) >= 4
    with store.write() as conn:
        revision = conn.execute(task_revisions.select()).one()
        assert (revision.keep_leftovers, revision.max_queued, revision.random_delay_ms) == (False, 1, 0)
        assert conn.execute(runs.select()).one().not_before_ms is None
        lease = conn.execute(run_dispatch_leases.select()).one()
        assert (lease.offer_id, lease.release_reason) == ("o1", "declined")
        # Schema 4 accepts `cancelled` as a release reason, and still refuses what is not one.
        conn.execute(run_dispatch_leases.update().values(release_reason="cancelled"))
    with pytest.raises(IntegrityError, match="release_reason"):
        with store.write() as conn:
            conn.execute(run_dispatch_leases.update().values(release_reason="whatever"))


def test_schema_8_database_upgrades_to_9_keeping_its_attempts_and_their_evidence(store, monkeypatch):
    """Schema 9 rebuilds run_attempts on SQLite (a CHECK cannot be altered there): its rows and
    their references survive; a fact recorded before names no lease generation; the new fact
    `confirmed_stopped` is accepted and anything else still refused."""
    import qlactors.store.migrations as migrations
    from qlactors.store.schema import run_attempts, run_events, runs, task_revisions, tasks

    shipped = available(store.dialect_name)
    monkeypatch.setattr(migrations, "available", lambda dialect: shipped[:8])
    assert migrate(store) == 8
    monkeypatch.undo()
    t = 1_700_000_000_000
    with store.write() as conn:
        conn.execute(tasks.insert().values(id="t1", name="old", current_revision=1, version=1, enabled=True,
                                           created_at_ms=t, updated_at_ms=t))
        conn.execute(task_revisions.insert().values(
            task_id="t1", revision=1, command_json='{"argv": ["true"]}', cwd=None, env_json="{}",
            timeout_ms=None, stop_grace_ms=1000, max_concurrent=1, retry_on_lost=False, max_attempts=1,
            safety="unknown", backoff_base_ms=1000, backoff_max_ms=300000, labels_json="[]", created_at_ms=t))
        conn.execute(runs.insert().values(id="r1", task_id="t1", task_revision=1, trigger_type="manual",
                                          status="running", version=3, event_sequence=1,
                                          created_at_ms=t, queued_at_ms=t, updated_at_ms=t))
        conn.execute(run_attempts.insert().values(
            id="a1", run_id="r1", number=1, status="running", executor_type="cluster", callback_sequence=0,
            callback_token_hash="0" * 64, lease_generation=2, evidence="stopped", evidence_at_ms=t,
            created_at_ms=t, updated_at_ms=t))
        conn.execute(run_events.insert().values(id="e1", run_id="r1", sequence=1, type="started",
                                                actor_type="executor", attempt_id="a1", payload_json="{}",
                                                created_at_ms=t))
    assert migrate(store) == latest_version(store.dialect_name) >= 9
    with store.write() as conn:
        row = conn.execute(run_attempts.select()).one()
        assert (row.id, row.status, row.lease_generation, row.evidence, row.evidence_at_ms) == (
            "a1", "running", 2, "stopped", t)
        assert (row.evidence_lease_generation, row.evidence_by) == (None, None)
        assert conn.execute(run_events.select()).one().attempt_id == "a1"
        conn.execute(run_attempts.update().values(evidence="confirmed_stopped", evidence_by="alice",
                                                  evidence_lease_generation=2))
    with pytest.raises(IntegrityError, match="evidence"):
        with store.write() as conn:
            conn.execute(run_attempts.update().values(evidence="whatever"))


def test_schema_13_database_upgrades_to_14_keeping_its_sessions_with_no_note(store, monkeypatch):
    """Schema 14 adds a session's note (`duplicate`): a session written before it has none."""
    import qlactors.store.migrations as migrations
    from sqlalchemy import insert, select

    from qlactors.store.schema import worker_sessions

    shipped = available(store.dialect_name)
    monkeypatch.setattr(migrations, "available", lambda dialect: [m for m in shipped if m.version <= 13])
    assert migrate(store) == 13
    monkeypatch.undo()
    t = 1_700_000_000_000
    with store.write() as conn:
        conn.execute(text("INSERT INTO worker_sessions (session_id, worker_id, generation, status, version, "
                          "capacity, free_slots, created_at_ms, updated_at_ms) VALUES "
                          f"('s1', 'w1', 1, 'online', 1, 2, 2, {t}, {t})"))
    assert migrate(store) == latest_version(store.dialect_name) >= 14
    with store.write() as conn:
        assert conn.execute(select(worker_sessions.c.session_id, worker_sessions.c.note)).all() == [("s1", None)]
        conn.execute(insert(worker_sessions).values(session_id="s2", worker_id="w1", generation=2, status="online",
                                                    version=1, capacity=2, free_slots=2, created_at_ms=t,
                                                    updated_at_ms=t, note="duplicate"))


def test_schema_17_outbox_rows_upgrade_to_18_with_their_runs_facts(store, monkeypatch):
    """Schema 18 copies a run's facts into its outbox rows: a row queued under schema 17 is filled
    from its run as it is at the upgrade (its latest attempt's exit code and number, the run's error
    code and times); a row whose run retention already deleted keeps NULLs (what schema 17 would
    have sent); a rule made before is unsigned; no row holds a schema-18 claim."""
    import qlactors.store.migrations as migrations
    from sqlalchemy import select

    from qlactors.store.schema import notification_outbox, notification_rules

    shipped = available(store.dialect_name)
    monkeypatch.setattr(migrations, "available", lambda dialect: [m for m in shipped if m.version <= 17])
    assert migrate(store) == 17
    monkeypatch.undo()
    t = 1_700_000_000_000
    with store.write() as conn:  # as schema 17 wrote them: plain SQL, its columns only
        for sql in (
            "INSERT INTO tasks (id, name, current_revision, version, enabled, created_at_ms, updated_at_ms) "
            f"VALUES ('t1', 'old', 1, 1, TRUE, {t}, {t})",
            "INSERT INTO task_revisions (task_id, revision, command_json, env_json, timeout_ms, stop_grace_ms, "
            "max_concurrent, retry_on_lost, max_attempts, safety, backoff_base_ms, backoff_max_ms, labels_json, "
            "created_at_ms, keep_leftovers, max_queued, random_delay_ms) VALUES ('t1', 1, '{\"argv\": [\"false\"]}', "
            f"'{{}}', NULL, 1000, 1, FALSE, 2, 'unknown', 1000, 300000, '[]', {t}, FALSE, 1, 0)",
            "INSERT INTO runs (id, task_id, task_revision, trigger_type, status, version, event_sequence, "
            "error_code, created_at_ms, queued_at_ms, started_at_ms, finished_at_ms, updated_at_ms) VALUES "
            f"('r1', 't1', 1, 'manual', 'failed', 9, 4, 'EXIT_NONZERO', {t}, {t}, {t + 10}, {t + 500}, {t + 500})",
            "INSERT INTO run_attempts (id, run_id, number, status, executor_type, callback_sequence, "
            f"callback_token_hash, exit_code, created_at_ms, updated_at_ms) VALUES "
            f"('a1', 'r1', 1, 'failed', 'local', 1, '{'0' * 64}', 3, {t}, {t}), "
            f"('a2', 'r1', 2, 'failed', 'local', 1, '{'0' * 64}', 7, {t}, {t})",
            "INSERT INTO notification_rules (id, task_id, on_states, kind, target, actor_name, created_at_ms) "
            f"VALUES ('n1', 't1', 'failed', 'webhook', 'http://127.0.0.1:9/x', 'tester', {t})",
            "INSERT INTO notification_outbox (id, run_id, rule_id, task_id, state, status, tries, next_try_at_ms, "
            f"claimed_until_ms, created_at_ms) VALUES ('r1:n1:9', 'r1', 'n1', 't1', 'failed', 'pending', 1, {t}, "
            f"{t + 600_000}, {t + 500}), ('gone:n1:5', 'gone', 'n1', 't1', 'failed', 'pending', 0, {t}, NULL, {t})",
        ):
            conn.execute(text(sql))
    assert migrate(store) == latest_version(store.dialect_name) >= 18
    with store.read() as conn:
        rows = {r.id: r for r in conn.execute(select(notification_outbox))}
        rule = conn.execute(select(notification_rules)).one()
    kept = rows["r1:n1:9"]
    assert (kept.state, kept.status, kept.tries, kept.claimed_until_ms, kept.claimed_by) == (
        "failed", "pending", 1, t + 600_000, None)
    assert (kept.exit_code, kept.attempt_number, kept.error_code) == (7, 2, "EXIT_NONZERO")
    assert (kept.run_created_at_ms, kept.started_at_ms, kept.finished_at_ms) == (t, t + 10, t + 500)
    orphan = rows["gone:n1:5"]
    assert (orphan.status, orphan.exit_code, orphan.attempt_number, orphan.error_code, orphan.finished_at_ms) == (
        "pending", None, None, None, None)
    assert (rule.id, rule.secret) == ("n1", None)
    # A schema-18 deliverer honours a claim made under 17 until it runs out, then takes the row,
    # which tells what its run's end did.
    from qlactors.store.admin.notifications import Notifications

    notes = Notifications(store)
    notes.heartbeat("d1", host="here", pid=1)
    with store.write() as conn:  # (the other row is not due: one lane, one row at a time)
        now = store.now_ms(conn)
        conn.execute(text("UPDATE notification_outbox SET claimed_until_ms = :until WHERE id = 'r1:n1:9'"),
                     {"until": now + 600_000})
        conn.execute(text("UPDATE notification_outbox SET next_try_at_ms = :later WHERE id = 'gone:n1:5'"),
                     {"later": now + 3_600_000})
    assert notes.claim_due(owner="d1", limit=4, page_url=None) == []
    with store.write() as conn:
        conn.execute(text("UPDATE notification_outbox SET claimed_until_ms = 1 WHERE id = 'r1:n1:9'"))
    [due] = notes.claim_due(owner="d1", limit=4, page_url=None)
    assert (due.id, due.facts.state, due.facts.attempt, due.facts.exit_code) == ("r1:n1:9", "failed", 2, 7)
