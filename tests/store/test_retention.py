"""Retention (store + files) and manual retry, on a SQLite file and on PostgreSQL (see conftest)."""

from __future__ import annotations

import secrets

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from qlactors.domain.receipt import Receipt, token_hash
from qlactors.domain.retention import RetentionPolicy, TaskRetention
from qlactors.domain.retry import RetryPolicy
from qlactors.errors import BadInput, NotFound, Retired
from qlactors.ids import new_id
from qlactors.process.logs import LogStore, UnsafeLogPath
from qlactors.process.receipts import ReceiptStore
from qlactors.store.dispatch.completion import CompletionService
from qlactors.store.engine import Store
from qlactors.executor.edge_files import EdgeFiles
from qlactors.executor.journal.file import open_journal_file
from qlactors.executor.journal.journal import Journal
from qlactors.store.cadence.retention import Retention
from qlactors.store.migrations import available, current_version, latest_version, migrate
from qlactors.store.schema import (
    run_attempts,
    run_dispatch_leases,
    run_events,
    run_retry_policies,
    run_tombstones,
    runs,
    schema_version,
    tasks,
    trigger_events,
    triggers,
)
from store_helpers import spec

DAY = 86_400_000
T0 = 1_700_000_000_000  # finished times the tests set; "now" is chosen relative to them
RETRY = RetryPolicy(retry_on_lost=True, max_attempts=3, safety="idempotent", backoff_base_ms=1000,
                    backoff_max_ms=60_000)


@pytest.fixture
def files(tmp_path):
    logs, receipts = LogStore(tmp_path / "logs"), ReceiptStore(tmp_path / "receipts")
    logs.ensure()
    receipts.ensure()
    return logs, receipts


@pytest.fixture
def journal(repo, tmp_path):
    """The executor's journal: in the edge file (SQLite); PostgreSQL never holds one, so beside a
    PostgreSQL store it is a journal file of its own, as a worker's."""
    if repo.store.dialect_name == "sqlite":
        yield Journal(repo.store)
        return
    store = open_journal_file(tmp_path)
    yield Journal(store)
    store.close()


@pytest.fixture
def local(journal, files):
    return EdgeFiles(journal, *files)


@pytest.fixture
def retention(repo, local):
    return Retention(repo.store, local)


def finished_run(repo, task: str, finished_at_ms: int, *, log: LogStore | None = None) -> str:
    """A cancelled (terminal) run of `task` finished at `finished_at_ms`, with a log file if asked."""
    run_id = repo.runs.request(task).run.id
    repo.runs.cancel(run_id)
    set_finished(repo, run_id, finished_at_ms)
    if log is not None:
        log.create(run_id, attempt_ids(repo, run_id)[0])
    return run_id


def set_finished(repo, run_id: str, at_ms: int) -> None:
    with repo.store.write() as conn:
        conn.execute(runs.update().where(runs.c.id == run_id).values(finished_at_ms=at_ms))


def attempt_ids(repo, run_id: str) -> list[str]:
    with repo.store.read() as conn:
        return list(conn.execute(select(run_attempts.c.id).where(run_attempts.c.run_id == run_id)
                                 .order_by(run_attempts.c.number)).scalars())


def run_ids(repo) -> set[str]:
    with repo.store.read() as conn:
        return set(conn.execute(select(runs.c.id)).scalars())


def tombstones(repo) -> dict[str, tuple]:
    with repo.store.read() as conn:
        return {r.run_id: (r.task_id, r.finished_at_ms, r.retired_at_ms, r.reason)
                for r in conn.execute(select(run_tombstones))}


def count(repo, table, column, run_id) -> int:
    with repo.store.read() as conn:
        return conn.execute(select(func.count()).select_from(table).where(column == run_id)).scalar_one()


def completed_run(repo, dispatch, task: str) -> str:
    """A run that really ran: offered (a lease), activated, started, completed from a receipt."""
    session = dispatch.sessions.register("edge", 8)
    run_id = repo.runs.request(task).run.id
    lease_hash = token_hash(secrets.token_urlsafe(32))
    offer = dispatch.offers.one(session.worker_id, session.session_id, session.generation, secrets.token_hex(8),
                           lease_hash, log_cap_bytes=0)
    assert offer.run_id == run_id
    fence = offer.fence(lease_hash)
    token = secrets.token_urlsafe(32)
    assert dispatch.reports.activate(fence, token_hash(token), "log").result == "applied"
    assert dispatch.reports.started(fence, "boot", 100, 100, 5).result == "applied"
    receipt = Receipt(schema_version=1, run_id=run_id, attempt_id=offer.attempt_id, callback_sequence=1,
                      token=token, started_at_ms=1, finished_at_ms=2, exit_code=0)
    assert CompletionService(repo.store).complete(run_id, offer.attempt_id, receipt, 0).result == "applied"
    return run_id


# -- retention: what is due -----------------------------------------------------------------------

def test_runs_past_max_age_are_retired_oldest_first_within_the_page_budget(repo, files, retention):
    logs, _ = files
    repo.tasks.add(spec("a"), actor_name="tester")
    old = [finished_run(repo, "a", T0 + i, log=logs) for i in range(5)]
    young = finished_run(repo, "a", T0 + 10 * DAY, log=logs)
    old_logs = [logs.path_for(r, attempt_ids(repo, r)[0]) for r in old]
    now = T0 + 10 * DAY

    first = retention.retire_page(now, max_age_ms=7 * DAY, max_runs=100, page=3)
    assert first.retired == 3 and first.reasons == {"max_age": 3} and first.more
    assert run_ids(repo) == {*old[3:], young}
    second = retention.retire_page(now, max_age_ms=7 * DAY, max_runs=100, page=3)
    assert second.retired == 2 and not second.more
    assert run_ids(repo) == {young}
    assert retention.retire_page(now, max_age_ms=7 * DAY, max_runs=100, page=3).retired == 0

    stones = tombstones(repo)
    assert set(stones) == set(old)
    task_id = repo.tasks.get("a").id
    assert stones[old[0]] == (task_id, T0, now, "max_age")
    assert not any(path.exists() for path in old_logs)
    assert logs.path_for(young, attempt_ids(repo, young)[0]).exists()


def test_each_task_keeps_its_newest_max_runs_finished_runs(repo, retention):
    repo.tasks.add(spec("a"), actor_name="tester")
    repo.tasks.add(spec("b"), actor_name="tester")
    a = [finished_run(repo, "a", T0 + i) for i in range(5)]
    b = [finished_run(repo, "b", T0 + 100 + i) for i in range(2)]
    report = retention.retire_page(T0 + DAY, max_age_ms=7 * DAY, max_runs=2, page=16)
    assert report.retired == 3 and report.reasons == {"max_runs": 3}
    assert run_ids(repo) == {a[3], a[4], *b}
    stones = tombstones(repo)  # tombstones obey the same count: 2 of the 3 are left
    assert len(stones) == 2 and set(stones) <= set(a[:3]) and {v[3] for v in stones.values()} == {"max_runs"}


def test_active_runs_are_never_retired_however_old_or_many(repo, retention):
    repo.tasks.add(spec("a", max_concurrent=1), actor_name="tester")
    done = finished_run(repo, "a", T0)
    queued = [repo.runs.request("a").run.id for _ in range(3)]
    report = retention.retire_page(T0 + 365 * DAY, max_age_ms=DAY, max_runs=1, page=16)
    assert report.retired == 1
    assert run_ids(repo) == set(queued)
    assert set(tombstones(repo)) == {done}


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # a journal lives in an edge file only
def test_a_run_with_a_journal_row_or_a_receipt_file_is_kept_and_the_rest_of_the_page_goes_on(
        repo, files, retention):
    _, receipts = files
    repo.tasks.add(spec("a"), actor_name="tester")
    journaled, receipted, plain = (finished_run(repo, "a", T0 + i) for i in range(3))
    attempt = attempt_ids(repo, journaled)[0]
    Journal(repo.store).accept(attempt, journaled, "/x.log", "/x.json", "a" * 64)
    path = receipts.final_path(attempt_ids(repo, receipted)[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")

    report = retention.retire_page(T0 + 30 * DAY, max_age_ms=DAY, max_runs=100, page=16)
    assert report.retired == 1 and report.skipped == {"journal": 1, "receipt": 1}
    assert run_ids(repo) == {journaled, receipted}
    assert set(tombstones(repo)) == {plain}

    Journal(repo.store).clear(attempt)
    path.unlink()
    assert retention.retire_page(T0 + 30 * DAY, max_age_ms=DAY, max_runs=100, page=16).retired == 2
    assert run_ids(repo) == set()


# -- retention: a task's own bounds ----------------------------------------------------------------

def test_a_task_with_its_own_keep_runs_keeps_that_many_while_another_keeps_the_global_count(repo, retention):
    repo.tasks.add(spec("few"), retention=TaskRetention(max_runs=1), actor_name="tester")
    repo.tasks.add(spec("many"), actor_name="tester")
    repo.tasks.add(spec("more"), retention=TaskRetention(max_runs=4), actor_name="tester")
    few = [finished_run(repo, "few", T0 + i) for i in range(4)]
    many = [finished_run(repo, "many", T0 + 10 + i) for i in range(4)]
    more = [finished_run(repo, "more", T0 + 20 + i) for i in range(4)]
    report = retention.retire_page(T0 + DAY, max_age_ms=7 * DAY, max_runs=2, page=16)
    assert report.retired == 5 and report.reasons == {"max_runs": 5}
    assert run_ids(repo) == {few[3], *many[2:], *more}
    stones = tombstones(repo)  # the same count per task prunes the tombstones: 1 left of few's 3
    assert set(stones) == {few[2], *many[:2]}


def test_a_task_s_own_age_retires_it_earlier_or_later_than_the_global_age(repo, retention):
    repo.tasks.add(spec("short"), retention=TaskRetention(max_age_ms=DAY), actor_name="tester")
    repo.tasks.add(spec("plain"), actor_name="tester")
    repo.tasks.add(spec("long"), retention=TaskRetention(max_age_ms=30 * DAY, max_runs=3), actor_name="tester")
    short, plain, long = (finished_run(repo, t, T0 + i) for i, t in enumerate(("short", "plain", "long")))
    assert retention.retire_page(T0 + DAY - 1, max_age_ms=7 * DAY, max_runs=100, page=16).retired == 0
    report = retention.retire_page(T0 + 2 * DAY, max_age_ms=7 * DAY, max_runs=100, page=16)
    assert report.reasons == {"max_age": 1} and run_ids(repo) == {plain, long}
    report = retention.retire_page(T0 + 8 * DAY, max_age_ms=7 * DAY, max_runs=100, page=16)
    assert report.reasons == {"max_age": 1} and run_ids(repo) == {long}
    # Tombstones age by their task's bound too: short's (retired on day 2) is gone by day 8.
    assert set(tombstones(repo)) == {plain}
    assert retention.retire_page(T0 + 29 * DAY, max_age_ms=7 * DAY, max_runs=100, page=16).retired == 0
    assert retention.retire_page(T0 + 31 * DAY, max_age_ms=7 * DAY, max_runs=100, page=16).retired == 1
    assert run_ids(repo) == set() and set(tombstones(repo)) == {long}
    retention.retire_page(T0 + 60 * DAY, max_age_ms=7 * DAY, max_runs=100, page=16)
    assert set(tombstones(repo)) == {long}  # 29 days since it was retired: kept, by its own 30
    retention.retire_page(T0 + 61 * DAY, max_age_ms=7 * DAY, max_runs=100, page=16)
    assert tombstones(repo) == {}


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # a journal lives in an edge file only
def test_a_task_s_own_bounds_keep_every_safety_rule(repo, files, retention):
    _, receipts = files
    repo.tasks.add(spec("few", max_concurrent=1), retention=TaskRetention(max_age_ms=3_600_000, max_runs=1),
                   actor_name="tester")
    journaled, receipted, plain, newest = (finished_run(repo, "few", T0 + i) for i in range(4))
    queued = repo.runs.request("few").run.id
    attempt = attempt_ids(repo, journaled)[0]
    Journal(repo.store).accept(attempt, journaled, "/x.log", "/x.json", "a" * 64)
    path = receipts.final_path(attempt_ids(repo, receipted)[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")
    report = retention.retire_page(T0 + 30 * DAY, max_age_ms=7 * DAY, max_runs=100, page=16)
    assert report.retired == 2 and report.skipped == {"journal": 1, "receipt": 1}
    assert run_ids(repo) == {journaled, receipted, queued}
    stones = tombstones(repo)  # both retired; the task's count of 1 prunes one of their tombstones
    assert len(stones) == 1 and set(stones) <= {plain, newest}


def test_tasks_with_their_own_age_beyond_the_page_budget_are_served_by_the_next_pages(repo, retention):
    names = [f"t{i}" for i in range(3)]
    for name in names:
        repo.tasks.add(spec(name), retention=TaskRetention(max_age_ms=DAY), actor_name="tester")
    done = {name: [finished_run(repo, name, T0 + i), finished_run(repo, name, T0 + 10 + i)] for i, name in
            enumerate(names)}
    retired = [retention.retire_page(T0 + 2 * DAY, max_age_ms=7 * DAY, max_runs=100, page=1).retired
               for _ in range(6)]
    assert retired == [1] * 6 and run_ids(repo) == set()
    assert set(tombstones(repo)) == {r for runs_of in done.values() for r in runs_of}
    assert retention.retire_page(T0 + 2 * DAY, max_age_ms=7 * DAY, max_runs=100, page=1).retired == 0


def test_going_back_to_the_global_bounds(repo, retention):
    repo.tasks.add(spec("a"), retention=TaskRetention(max_age_ms=30 * DAY, max_runs=1), actor_name="tester")
    runs_of_a = [finished_run(repo, "a", T0 + i) for i in range(3)]
    view = repo.tasks.update("a", retention={"max_runs": None}, actor_name="tester")
    assert view.retention == TaskRetention(max_age_ms=30 * DAY) and view.revision == 1
    assert retention.retire_page(T0 + 8 * DAY, max_age_ms=7 * DAY, max_runs=2, page=16).reasons == {"max_runs": 1}
    assert run_ids(repo) == set(runs_of_a[1:])
    view = repo.tasks.update("a", retention={"max_age_ms": None}, actor_name="tester")
    assert view.retention == TaskRetention() and view.retention.is_default
    assert retention.retire_page(T0 + 8 * DAY, max_age_ms=7 * DAY, max_runs=2, page=16).reasons == {"max_age": 2}
    assert run_ids(repo) == set()


def test_a_task_s_own_bounds_are_stored_on_its_head_and_bad_ones_write_nothing(repo):
    added = repo.tasks.add(spec("a"), retention=TaskRetention(max_age_ms=2 * DAY), actor_name="tester")
    assert added.retention == TaskRetention(max_age_ms=2 * DAY) and added.revision == 1
    assert added.to_json()["retention"] == {"max_age_ms": 2 * DAY, "max_age_from": "task",
                                            "max_runs": None, "max_runs_from": "global"}
    assert added.to_json(RetentionPolicy(max_age_ms=7 * DAY, max_runs=100))["retention"]["max_runs"] == 100
    changed = repo.tasks.update("a", retention={"max_runs": 3}, max_concurrent=2, actor_name="tester")
    assert changed.revision == 2 and changed.retention == TaskRetention(max_age_ms=2 * DAY, max_runs=3)
    assert repo.tasks.get("a").retention == changed.retention
    assert [v.retention for v in repo.tasks.list()] == [changed.retention]
    same = repo.tasks.update("a", retention={"max_runs": 3}, actor_name="tester")
    assert (same.revision, same.updated_at_ms) == (2, changed.updated_at_ms)  # nothing differs, nothing written
    with repo.store.read() as conn:
        before = conn.execute(select(tasks)).all()
    for bad in ({"max_runs": 0}, {"max_age_ms": 60_000}, {"max_age_ms": 3_651 * DAY}, {"keep": 1}):
        with pytest.raises(BadInput):
            repo.tasks.update("a", retention=bad, max_concurrent=5, actor_name="tester")
    with pytest.raises(BadInput):
        repo.tasks.add(spec("b"), retention=TaskRetention(max_runs=0), actor_name="tester")
    with repo.store.read() as conn:
        assert conn.execute(select(tasks)).all() == before
    # The schema keeps the same bounds, whoever writes.
    for column, value in ((tasks.c.retention_max_runs, 0), (tasks.c.retention_max_age_ms, 1000)):
        with pytest.raises(IntegrityError, match=f"ck_tasks_{column.name.removesuffix('_ms')}_range"):
            with repo.store.write() as conn:
                conn.execute(tasks.update().values({column: value}))
    assert repo.tasks.get("a").retention == changed.retention


# -- retention: how a run goes ----------------------------------------------------------------------

def test_log_files_are_deleted_before_the_rows_and_a_missing_log_is_fine(repo, files, journal):
    logs, receipts = files
    repo.tasks.add(spec("a"), actor_name="tester")
    with_log = finished_run(repo, "a", T0, log=logs)
    without_log = finished_run(repo, "a", T0 + 1)
    seen = []

    class Spy(LogStore):
        def remove(self, run_id, attempt_id):
            seen.append((run_id, run_id in run_ids(repo), self.path_for(run_id, attempt_id).exists()))
            return super().remove(run_id, attempt_id)

    report = Retention(repo.store, EdgeFiles(journal, Spy(logs.root), receipts)).retire_page(
        T0 + 30 * DAY, max_age_ms=DAY, max_runs=100, page=16)
    assert report.retired == 2 and report.logs_deleted == 1
    assert seen == [(with_log, True, True), (without_log, True, False)]  # rows still there each time
    assert not any(logs.root.glob("*/*.log"))


def test_a_log_that_cannot_be_deleted_keeps_the_run_for_the_next_page(repo, files, journal):
    logs, receipts = files
    repo.tasks.add(spec("a"), actor_name="tester")
    run_id = finished_run(repo, "a", T0, log=logs)

    class Stuck(LogStore):
        def remove(self, run_id, attempt_id):
            raise PermissionError(13, "read-only file system")

    report = Retention(repo.store, EdgeFiles(journal, Stuck(logs.root), receipts)).retire_page(
        T0 + 30 * DAY, max_age_ms=DAY, max_runs=100, page=16)
    assert report.retired == 0 and report.skipped == {"log_error": 1}
    assert run_ids(repo) == {run_id} and tombstones(repo) == {}


def test_every_row_of_a_retired_run_goes_and_references_to_it_are_cleared(repo, dispatch, retention):
    repo.tasks.add(spec("a", retry=RETRY), actor_name="tester")
    done = completed_run(repo, dispatch, "a")
    set_finished(repo, done, T0)
    again = repo.runs.retry(done).run.id
    task_id = repo.tasks.get("a").id
    trigger_id, event_id = new_id(), new_id()
    with repo.store.write() as conn:
        conn.execute(triggers.insert().values(id=trigger_id, task_id=task_id, revision=1, cron="* * * * *",
                                              tz="UTC", misfire="fire_once", grace_ms=30_000, overlap="queue",
                                              created_at_ms=T0, updated_at_ms=T0))
        conn.execute(trigger_events.insert().values(id=event_id, trigger_id=trigger_id, trigger_revision=1,
                                                    type="skipped", scheduled_for_ms=T0, occurrences=1,
                                                    run_id=done, created_at_ms=T0))
    assert count(repo, run_dispatch_leases, run_dispatch_leases.c.run_id, done) == 1
    assert count(repo, run_retry_policies, run_retry_policies.c.run_id, done) == 1

    report = retention.retire_page(T0 + 30 * DAY, max_age_ms=DAY, max_runs=100, page=16)
    assert report.retired == 1
    for table in (runs, run_attempts, run_events, run_dispatch_leases, run_retry_policies):
        column = table.c.id if table is runs else table.c.run_id
        assert count(repo, table, column, done) == 0, table.name
    with repo.store.read() as conn:
        assert conn.execute(select(trigger_events.c.run_id).where(trigger_events.c.id == event_id)).scalar_one() \
            is None
        assert conn.execute(select(runs.c.retry_of_run_id).where(runs.c.id == again)).scalar_one() is None
    assert repo.runs.get(again).state == "queued"  # the run that referenced it is untouched otherwise


def test_a_retired_run_reads_as_retired_not_as_missing(repo, retention):
    repo.tasks.add(spec("a"), actor_name="tester")
    run_id = finished_run(repo, "a", T0)
    retention.retire_page(T0 + 30 * DAY, max_age_ms=DAY, max_runs=100, page=16)
    with pytest.raises(Retired, match=rf"run {run_id} was retired on 2023-12-1\d .*\(max_age\); its log was deleted") \
            as caught:
        repo.runs.get(run_id)
    assert caught.value.exit_status == 4
    with pytest.raises(Retired):
        repo.runs.retry(run_id)
    with pytest.raises(Retired):
        repo.runs.cancel(run_id)
    with pytest.raises(NotFound) as unknown:
        repo.runs.get(new_id())
    assert not isinstance(unknown.value, Retired)


def test_tombstones_are_pruned_by_the_same_bounds_as_runs(repo, retention):
    repo.tasks.add(spec("a"), actor_name="tester")
    task_id = repo.tasks.get("a").id
    stones = [f"0000000{i}-0000-7000-8000-000000000000" for i in range(5)]
    with repo.store.write() as conn:
        conn.execute(run_tombstones.insert(), [dict(run_id=s, task_id=task_id, finished_at_ms=T0 - DAY,
                                                    retired_at_ms=T0 + i, reason="max_runs")
                                               for i, s in enumerate(stones)])
    # Count: at most max_runs tombstones per task, the newest kept; within the page budget.
    report = retention.retire_page(T0 + DAY, max_age_ms=7 * DAY, max_runs=2, page=2)
    assert report.tombstones_purged == 2 and report.more
    assert set(tombstones(repo)) == set(stones[2:])
    report = retention.retire_page(T0 + DAY, max_age_ms=7 * DAY, max_runs=2, page=2)
    assert report.tombstones_purged == 1 and not report.more
    assert set(tombstones(repo)) == set(stones[3:])
    # Age: retired max_age ago, a tombstone goes too (the id is then simply unknown).
    retention.retire_page(T0 + 7 * DAY + 3, max_age_ms=7 * DAY, max_runs=2, page=16)
    assert set(tombstones(repo)) == {stones[4]}
    with pytest.raises(NotFound) as caught:
        repo.runs.get(stones[0])
    assert not isinstance(caught.value, Retired)
    with pytest.raises(Retired):
        repo.runs.get(stones[4])


def test_bad_arguments_are_refused(retention):
    for kw in ({"max_age_ms": 0, "max_runs": 1, "page": 1}, {"max_age_ms": DAY, "max_runs": 0, "page": 1},
               {"max_age_ms": DAY, "max_runs": 1, "page": 0}, {"max_age_ms": DAY, "max_runs": 1, "page": 257}):
        with pytest.raises(BadInput):
            retention.retire_page(T0, **kw)


def test_log_remove_never_follows_a_symlinked_shard(files, tmp_path):
    logs, _ = files
    run_id, attempt_id = new_id(), new_id()
    path = logs.path_for(run_id, attempt_id)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / path.name).write_text("not a log of ours")
    path.parent.symlink_to(elsewhere)
    with pytest.raises(UnsafeLogPath):
        logs.remove(run_id, attempt_id)
    assert (elsewhere / path.name).exists()
    path.parent.unlink()
    created = logs.create(run_id, attempt_id)
    assert logs.remove(run_id, attempt_id) is True and not created.exists()
    assert logs.remove(run_id, attempt_id) is False


# -- manual retry -------------------------------------------------------------------------------------

def test_retry_makes_a_new_manual_run_of_the_same_revision_after_the_task_changed(repo):
    repo.tasks.add(spec("a", retry=RETRY), actor_name="tester")
    first = repo.runs.request("a").run.id
    repo.runs.cancel(first)
    repo.tasks.update("a", max_concurrent=3, retry=RetryPolicy(), actor_name="tester")  # revision 2: no retry policy
    again = repo.runs.retry(first)
    assert again.created
    view = repo.runs.get(again.run.id)
    assert (view.task_revision, view.retry_of_run_id, view.trigger_type, view.state) == (1, first, "manual", "queued")
    assert [a.state for a in view.attempts] == ["claimed"]
    assert [e.type for e in view.events] == ["run.created", "run.queued", "attempt.claimed"]
    with repo.store.read() as conn:  # its own snapshot, of revision 1's policy
        policy = conn.execute(select(run_retry_policies).where(
            run_retry_policies.c.run_id == again.run.id)).one()
    assert (policy.max_attempts, policy.safety, policy.retry_on_lost) == (3, "idempotent", True)
    assert repo.runs.request("a").run.task_revision == 2


def test_retry_is_refused_for_a_run_that_has_not_finished_and_writes_nothing(repo):
    repo.tasks.add(spec("a"), actor_name="tester")
    queued = repo.runs.request("a").run.id
    before = run_ids(repo)
    with pytest.raises(BadInput, match="only a finished run can be retried"):
        repo.runs.retry(queued)
    assert run_ids(repo) == before
    with pytest.raises(NotFound):
        repo.runs.retry(new_id())


def test_retry_of_a_run_whose_task_was_removed_is_refused(repo):
    repo.tasks.add(spec("a"), actor_name="tester")
    run_id = repo.runs.request("a").run.id
    repo.runs.cancel(run_id)
    repo.remove_task("a", actor_name="tester")
    with pytest.raises(BadInput, match="which was removed"):
        repo.runs.retry(run_id)
    with repo.store.read() as conn:
        assert conn.execute(select(func.count()).select_from(runs)).scalar_one() == 1
        assert conn.execute(select(tasks.c.deleted_at_ms)).scalar_one() is not None


def test_a_run_can_be_retried_again_and_each_retry_points_at_its_own_origin(repo):
    repo.tasks.add(spec("a"), actor_name="tester")
    first = repo.runs.request("a").run.id
    repo.runs.cancel(first)
    second = repo.runs.retry(first).run.id
    repo.runs.cancel(second)
    third = repo.runs.retry(second).run.id
    fourth = repo.runs.retry(first).run.id
    assert [repo.runs.get(r).retry_of_run_id for r in (second, third, fourth)] == [first, second, first]


# -- schema ---------------------------------------------------------------------------------------------

def test_a_schema_2_database_migrates_to_3_with_its_rows_kept(store_url):
    store = Store(store_url)
    try:
        with store.engine.begin() as conn:
            for migration in available(store.dialect_name)[:2]:
                for statement in migration.statements:
                    conn.exec_driver_sql(statement)
            conn.execute(schema_version.insert().values(id=1, version=2, applied_at_ms=0))
            conn.execute(tasks.insert().values(id=new_id(), name="old", current_revision=1, version=1,
                                               enabled=True, created_at_ms=0, updated_at_ms=0))
        assert current_version(store) == 2
        assert migrate(store) == latest_version(store.dialect_name) >= 3
        with store.read() as conn:
            assert conn.execute(select(tasks.c.name)).scalars().all() == ["old"]
            # an existing task keeps the global retention bounds
            assert conn.execute(select(tasks.c.retention_max_age_ms, tasks.c.retention_max_runs)).one() == (
                None, None)
            assert conn.execute(select(func.count()).select_from(run_tombstones)).scalar_one() == 0
    finally:
        store.close()
