"""A run that cannot be carried never blocks other runs (issue 9 §1, SEMANTICS.md §4).

An offer the control side cannot build or encode for its task revision ends that attempt
`failed` (OFFER_UNENCODABLE) in the offer's own transaction, taking no lease and no slot, and
the pull is answered with the next run's offer. The revisions are planted straight into the
database, past `task add`'s checks, as a database written by an older version could hold them.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3

import pytest
from sqlalchemy import and_, func, select

from qlactors.store.schema import run_dispatch_leases, task_revisions, tasks
from qlactors.wire.offers import check_offer
from store_helpers import db_state, new_hash, spec

HUGE_ENV = json.dumps({f"K{i}": "b" * 60_000 for i in range(20)})  # far over the 256 KiB frame


def plant(write, name: str, **columns) -> None:
    """Overwrite the current revision of task `name` with `columns`, as raw column values."""
    with write() as conn:
        task_id = conn.execute(select(tasks.c.id).where(tasks.c.name == name)).scalar_one()
        conn.execute(task_revisions.update().where(task_revisions.c.task_id == task_id).values(**columns))


def offer(dispatch, session, offer_id: str, check=check_offer):
    return dispatch.offers.one(session.worker_id, session.session_id, session.generation, offer_id, new_hash(),
                          log_cap_bytes=0, check=check)


def live_leases(repo) -> int:
    with repo.store.read() as conn:
        return conn.execute(select(func.count()).select_from(run_dispatch_leases).where(
            run_dispatch_leases.c.status == "leased")).scalar_one()


def assert_failed_unencodable(repo, run_id: str, fragment: str) -> None:
    run, (attempt,), leases, _ = db_state(repo, run_id)
    assert (run["status"], run["error_code"]) == ("failed", "OFFER_UNENCODABLE")
    assert (attempt["status"], attempt["error_code"]) == ("failed", "OFFER_UNENCODABLE")
    assert run["finished_at_ms"] is not None and attempt["finished_at_ms"] is not None
    assert fragment in run["error_summary"] and "b" * 100 not in run["error_summary"]
    assert all(lease["status"] != "leased" for lease in leases)  # it holds no slot
    assert [e.type for e in repo.runs.get(run_id).events][-3:] == ["run.dispatching", "attempt.failed",
                                                                    "run.failed"]


@pytest.mark.parametrize("bad_columns, fragment", [
    ({"env_json": HUGE_ENV}, "over the 262144-byte limit"),  # cannot be encoded
    ({"command_json": '{"argv": 5}'}, "a command is"),  # cannot be built
    ({"cwd": "relative"}, "expected an absolute path"),
], ids=["env-over-the-frame", "unreadable-command", "unreadable-cwd"])
def test_an_unencodable_run_fails_and_the_same_pull_gets_the_next_run(repo, dispatch, bad_columns, fragment):
    repo.tasks.add(spec("bad"), actor_name="tester")
    repo.tasks.add(spec("good"), actor_name="tester")
    plant(repo.store.write, "bad", **bad_columns)
    bad = repo.runs.request("bad").run.id  # the oldest: offered first
    good = repo.runs.request("good").run.id
    session = dispatch.sessions.register("edge", 1)
    got = offer(dispatch, session, "o-1")
    assert got is not None and got.run_id == good
    assert_failed_unencodable(repo, bad, fragment)
    assert live_leases(repo) == 1  # only the good run's: the slot count was never touched
    assert db_state(repo, good)[0]["status"] == "dispatching"


def test_a_declined_claim_that_cannot_be_encoded_fails_when_offered_again(repo, dispatch):
    """A run already `dispatching` (offered before by a version without the check, then declined)."""
    repo.tasks.add(spec("bad"), actor_name="tester")
    repo.tasks.add(spec("good"), actor_name="tester")
    bad = repo.runs.request("bad").run.id
    good = repo.runs.request("good").run.id
    session = dispatch.sessions.register("edge", 1)
    lease_hash = new_hash()
    first = dispatch.offers.one("edge", session.session_id, 1, "o-old", lease_hash, log_cap_bytes=0)
    assert first.run_id == bad
    assert dispatch.reports.decline(first.fence(lease_hash), "declined").result == "applied"
    plant(repo.store.write, "bad", env_json=HUGE_ENV)
    got = offer(dispatch, session, "o-new")
    assert got is not None and got.run_id == good
    run, (attempt,), leases, _ = db_state(repo, bad)
    assert (run["status"], attempt["status"], attempt["error_code"]) == ("failed", "failed", "OFFER_UNENCODABLE")
    assert [(lease["status"], lease["release_reason"]) for lease in leases] == [("released", "declined")]


def test_only_the_unencodable_run_ends_and_all_others_are_offered_in_turn(repo, dispatch):
    for name in ("bad1", "good", "bad2"):
        repo.tasks.add(spec(name, max_concurrent=4), actor_name="tester")
    plant(repo.store.write, "bad1", env_json=HUGE_ENV)
    plant(repo.store.write, "bad2", command_json="not json")
    order = [repo.runs.request(n).run.id for n in ("bad1", "good", "bad2", "good", "bad1")]
    session = dispatch.sessions.register("edge", 8)
    offered = [offer(dispatch, session, f"o-{i}") for i in range(3)]
    assert [o.run_id if o else None for o in offered] == [order[1], order[3], None]
    for run_id in (order[0], order[2], order[4]):
        assert db_state(repo, run_id)[0]["error_code"] == "OFFER_UNENCODABLE"


def test_without_a_check_an_encodable_revision_is_offered_unchanged(repo, dispatch):
    repo.tasks.add(spec("job", env={"A": "1"}), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    session = dispatch.sessions.register("edge", 1)
    got = offer(dispatch, session, "o-1", check=None)
    assert got.run_id == run_id and dict(got.env) == {"A": "1"}
    with repo.store.read() as conn:
        assert conn.execute(select(func.count()).select_from(run_dispatch_leases).where(and_(
            run_dispatch_leases.c.run_id == run_id, run_dispatch_leases.c.status == "leased"))).scalar_one() == 1


# --- the real runtime ----------------------------------------------------------------------------

def test_a_planted_unencodable_run_among_good_ones_never_blocks_them(home):
    """slots = 1 (the edge default): the bad run ends failed, every good one runs to succeeded."""
    home.add_tasks(("bad", "--", "true"), ("good1", "--", "echo one"), ("good2", "--", "echo two"))
    with contextlib.closing(sqlite3.connect(home.db_path)) as conn, conn:
        conn.execute("UPDATE task_revisions SET env_json = ? WHERE task_id = (SELECT id FROM tasks "
                     "WHERE name = 'bad')", (HUGE_ENV,))
    runs = [home.run(name) for name in ("bad", "good1", "bad", "good2")]
    edge = home.start_edge()
    states = {run_id: home.wait_terminal(run_id, timeout=30) for run_id in runs}
    assert [states[r] for r in runs] == ["failed", "succeeded", "failed", "succeeded"], home.edge_logs()
    for run_id in (runs[0], runs[2]):
        view = home.view(run_id)
        assert view["error_code"] == "OFFER_UNENCODABLE" and view["attempts"][0]["error_code"] == "OFFER_UNENCODABLE"
    assert [home.logs(r) for r in (runs[1], runs[3])] == [b"one\n", b"two\n"]
    edge.wait_log("event=offer_unencodable")
    assert "report_refused" not in edge.log()
    assert edge.terminate() == 0


# --- schema 5 ------------------------------------------------------------------------------------

def test_a_schema_4_database_migrates_to_5_with_its_attempts_and_references_kept(store_url, monkeypatch):
    """SQLite rebuilds run_attempts for the new CHECK: events and leases still point at it.

    The rows are written as schema 4 had them (Core inserts of its columns only: today's code
    reads later columns), then the database is migrated to the newest schema.
    """
    import qlactors.store.migrations as migrations
    from qlactors.store.dispatch.dispatch import Dispatch
    from qlactors.store.engine import Store
    from qlactors.store.migrations import available, current_version, latest_version, migrate
    from qlactors.store.repository import Repository
    from qlactors.store.schema import run_attempts, run_events, runs, worker_sessions

    store = Store(store_url)
    try:
        shipped = available(store.dialect_name)
        monkeypatch.setattr(migrations, "available", lambda dialect: shipped[:4])
        assert migrate(store) == 4
        monkeypatch.undo()
        t = 1_700_000_000_000
        with store.write() as conn:
            conn.execute(tasks.insert().values(id="t1", name="old", current_revision=1, version=1,
                                               enabled=True, created_at_ms=t, updated_at_ms=t))
            conn.execute(task_revisions.insert().values(
                task_id="t1", revision=1, command_json='{"argv": ["true"]}', cwd=None, env_json="{}",
                timeout_ms=None, stop_grace_ms=1000, max_concurrent=1, retry_on_lost=False, max_attempts=1,
                safety="unknown", backoff_base_ms=1000, backoff_max_ms=300000, labels_json="[]",
                created_at_ms=t, keep_leftovers=False, max_queued=1, random_delay_ms=0))
            conn.execute(worker_sessions.insert().values(
                session_id="s1", worker_id="edge", generation=1, status="online", version=1, capacity=1,
                free_slots=0, created_at_ms=t, updated_at_ms=t))
            for n, status in ((1, "dispatching"), (2, "queued")):
                conn.execute(runs.insert().values(
                    id=f"r{n}", task_id="t1", task_revision=1, trigger_type="manual", status=status,
                    version=2, event_sequence=2, created_at_ms=t, queued_at_ms=t, updated_at_ms=t))
                conn.execute(run_attempts.insert().values(
                    id=f"a{n}", run_id=f"r{n}", number=1, status="claimed", executor_type="local",
                    callback_sequence=0, created_at_ms=t, updated_at_ms=t))
                for seq, kind in ((1, "run.created"), (2, "run.queued")):
                    conn.execute(run_events.insert().values(
                        id=f"e{n}{seq}", run_id=f"r{n}", sequence=seq, type=kind, actor_type="user",
                        attempt_id=f"a{n}", payload_json="{}", created_at_ms=t))
            conn.execute(run_dispatch_leases.insert().values(  # a lease that references its attempt
                attempt_id="a1", lease_generation=1, run_id="r1", status="leased", version=1,
                worker_id="edge", session_id="s1", session_generation=1, token_hash="0" * 64,
                offer_id="o-1", created_at_ms=t, updated_at_ms=t))
        assert current_version(store) == 4
        assert migrate(store) == latest_version(store.dialect_name) >= 5
        repo, dispatch = Repository(store), Dispatch.open(store)
        with store.read() as conn:
            if store.dialect_name == "sqlite":
                assert conn.exec_driver_sql("PRAGMA foreign_key_check").all() == []
                sql = dict(conn.exec_driver_sql("SELECT name, sql FROM sqlite_master WHERE type = 'table'").all())
                assert "run_attempts_old" not in " ".join(sql.values())
                assert "REFERENCES run_attempts (id)" in sql["run_events"]
            attempts = conn.execute(select(run_attempts.c.id, run_attempts.c.status).order_by(run_attempts.c.id)).all()
            assert [tuple(a) for a in attempts] == [("a1", "claimed"), ("a2", "claimed")]
            assert conn.execute(select(func.count()).select_from(run_events)).scalar_one() == 4
            lease = conn.execute(select(run_dispatch_leases)).one()
            assert (lease.attempt_id, lease.offer_id, lease.status) == ("a1", "o-1", "leased")
        # The new CHECK admits exactly the unencodable end: plant one and offer again.
        repo.tasks.add(spec("bad"), actor_name="tester")
        plant(store.write, "bad", env_json=HUGE_ENV)
        bad = repo.runs.request("bad").run.id
        session = dispatch.sessions.register("edge", 2)
        assert offer(dispatch, session, "o-2") is None  # "old" is at its limit; "bad" cannot go
        assert db_state(repo, bad)[1][0]["error_code"] == "OFFER_UNENCODABLE"
    finally:
        store.close()
