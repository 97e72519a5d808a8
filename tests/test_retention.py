"""Retention (store + files) and manual retry, on a SQLite file and on PostgreSQL (see conftest)."""

from __future__ import annotations

import secrets

import pytest
from sqlalchemy import func, select

from qlactors.domain.receipt import Receipt, token_hash
from qlactors.domain.retry import RetryPolicy
from qlactors.errors import BadInput, NotFound, Retired
from qlactors.ids import new_id
from qlactors.process.logs import LogStore, UnsafeLogPath
from qlactors.process.receipts import ReceiptStore
from qlactors.store.completion import CompletionService
from qlactors.store.engine import Store
from qlactors.store.journal import Journal
from qlactors.store.retention import Retention
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
def retention(repo, files):
    return Retention(repo.store, *files)


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
    session = dispatch.register_session("edge", 8)
    run_id = repo.runs.request(task).run.id
    lease_hash = token_hash(secrets.token_urlsafe(32))
    offer = dispatch.offer(session.worker_id, session.session_id, session.generation, secrets.token_hex(8),
                           lease_hash, log_cap_bytes=0)
    assert offer.run_id == run_id
    fence = offer.fence(lease_hash)
    token = secrets.token_urlsafe(32)
    assert dispatch.activate(fence, token_hash(token), "log").result == "applied"
    assert dispatch.started(fence, "boot", 100, 100, 5).result == "applied"
    receipt = Receipt(schema_version=1, run_id=run_id, attempt_id=offer.attempt_id, callback_sequence=1,
                      token=token, started_at_ms=1, finished_at_ms=2, exit_code=0)
    assert CompletionService(repo.store).complete(run_id, offer.attempt_id, receipt, 0).result == "applied"
    return run_id


# -- retention: what is due -----------------------------------------------------------------------

def test_runs_past_max_age_are_retired_oldest_first_within_the_page_budget(repo, files, retention):
    logs, _ = files
    repo.tasks.add(spec("a"))
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
    repo.tasks.add(spec("a"))
    repo.tasks.add(spec("b"))
    a = [finished_run(repo, "a", T0 + i) for i in range(5)]
    b = [finished_run(repo, "b", T0 + 100 + i) for i in range(2)]
    report = retention.retire_page(T0 + DAY, max_age_ms=7 * DAY, max_runs=2, page=16)
    assert report.retired == 3 and report.reasons == {"max_runs": 3}
    assert run_ids(repo) == {a[3], a[4], *b}
    stones = tombstones(repo)  # tombstones obey the same count: 2 of the 3 are left
    assert len(stones) == 2 and set(stones) <= set(a[:3]) and {v[3] for v in stones.values()} == {"max_runs"}


def test_active_runs_are_never_retired_however_old_or_many(repo, retention):
    repo.tasks.add(spec("a", max_concurrent=1))
    done = finished_run(repo, "a", T0)
    queued = [repo.runs.request("a").run.id for _ in range(3)]
    report = retention.retire_page(T0 + 365 * DAY, max_age_ms=DAY, max_runs=1, page=16)
    assert report.retired == 1
    assert run_ids(repo) == set(queued)
    assert set(tombstones(repo)) == {done}


def test_a_run_with_a_journal_row_or_a_receipt_file_is_kept_and_the_rest_of_the_page_goes_on(
        repo, files, retention):
    _, receipts = files
    repo.tasks.add(spec("a"))
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


# -- retention: how a run goes ----------------------------------------------------------------------

def test_log_files_are_deleted_before_the_rows_and_a_missing_log_is_fine(repo, files):
    logs, receipts = files
    repo.tasks.add(spec("a"))
    with_log = finished_run(repo, "a", T0, log=logs)
    without_log = finished_run(repo, "a", T0 + 1)
    seen = []

    class Spy(LogStore):
        def remove(self, run_id, attempt_id):
            seen.append((run_id, run_id in run_ids(repo), self.path_for(run_id, attempt_id).exists()))
            return super().remove(run_id, attempt_id)

    report = Retention(repo.store, Spy(logs.root), receipts).retire_page(
        T0 + 30 * DAY, max_age_ms=DAY, max_runs=100, page=16)
    assert report.retired == 2 and report.logs_deleted == 1
    assert seen == [(with_log, True, True), (without_log, True, False)]  # rows still there each time
    assert not any(logs.root.glob("*/*.log"))


def test_a_log_that_cannot_be_deleted_keeps_the_run_for_the_next_page(repo, files):
    logs, receipts = files
    repo.tasks.add(spec("a"))
    run_id = finished_run(repo, "a", T0, log=logs)

    class Stuck(LogStore):
        def remove(self, run_id, attempt_id):
            raise PermissionError(13, "read-only file system")

    report = Retention(repo.store, Stuck(logs.root), receipts).retire_page(
        T0 + 30 * DAY, max_age_ms=DAY, max_runs=100, page=16)
    assert report.retired == 0 and report.skipped == {"log_error": 1}
    assert run_ids(repo) == {run_id} and tombstones(repo) == {}


def test_every_row_of_a_retired_run_goes_and_references_to_it_are_cleared(repo, dispatch, retention):
    repo.tasks.add(spec("a", retry=RETRY))
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
    repo.tasks.add(spec("a"))
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
    repo.tasks.add(spec("a"))
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
    repo.tasks.add(spec("a", retry=RETRY))
    first = repo.runs.request("a").run.id
    repo.runs.cancel(first)
    repo.tasks.update("a", max_concurrent=3, retry=RetryPolicy())  # revision 2: no retry policy
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
    repo.tasks.add(spec("a"))
    queued = repo.runs.request("a").run.id
    before = run_ids(repo)
    with pytest.raises(BadInput, match="only a finished run can be retried"):
        repo.runs.retry(queued)
    assert run_ids(repo) == before
    with pytest.raises(NotFound):
        repo.runs.retry(new_id())


def test_retry_of_a_run_whose_task_was_removed_is_refused(repo):
    repo.tasks.add(spec("a"))
    run_id = repo.runs.request("a").run.id
    repo.runs.cancel(run_id)
    repo.remove_task("a")
    with pytest.raises(BadInput, match="which was removed"):
        repo.runs.retry(run_id)
    with repo.store.read() as conn:
        assert conn.execute(select(func.count()).select_from(runs)).scalar_one() == 1
        assert conn.execute(select(tasks.c.deleted_at_ms)).scalar_one() is not None


def test_a_run_can_be_retried_again_and_each_retry_points_at_its_own_origin(repo):
    repo.tasks.add(spec("a"))
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
            assert conn.execute(select(func.count()).select_from(run_tombstones)).scalar_one() == 0
    finally:
        store.close()
