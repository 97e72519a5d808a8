"""The repository contract: the same tests on a SQLite file and on PostgreSQL (see conftest)."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from qlactors.domain.retry import RetryPolicy
from qlactors.domain.states import CancelReason
from qlactors.domain.transitions import plan_activate, plan_cancel, plan_offer, plan_started
from qlactors.errors import AlreadyExists, BadInput, Conflict, NotFound
from qlactors.ids import new_id
from qlactors.store.plans import apply_plan, attempt_snapshot, current_attempt, load_run, run_snapshot
from qlactors.store.schema import run_attempts, run_events, run_retry_policies, runs, tasks
from store_helpers import spec


def events_of(repo, run_id) -> list[str]:
    return [e.type for e in repo.runs.get(run_id).events]


def advance(repo, run_id, planner, **attempt_values):
    """Move a run one step with a domain plan, as the executor path will (test scaffolding)."""
    with repo.store.write() as conn:
        row = load_run(conn, run_id)
        attempt = current_attempt(conn, run_id)
        plan = planner(run_snapshot(row), attempt_snapshot(attempt))
        apply_plan(conn, plan, repo.store.now_ms(conn), actor_type="executor",
                   expected_callback_sequence=attempt.callback_sequence, attempt_values=attempt_values)


def make_running(repo, run_id):
    advance(repo, run_id, plan_offer)
    advance(repo, run_id, plan_activate, callback_token_hash="a" * 64)
    advance(repo, run_id, plan_started, pid=4242)


# -- tasks -------------------------------------------------------------------------------------

def test_task_add_and_get_roundtrip(repo):
    policy = RetryPolicy(retry_on_lost=True, max_attempts=3, safety="idempotent",
                         backoff_base_ms=2000, backoff_max_ms=60000)
    added = repo.tasks.add(spec(cwd="/tmp", env={"A": "1"}, timeout_ms=5000, max_concurrent=2, retry=policy),
                           actor_name="tester")
    got = repo.tasks.get("job")
    assert got.spec == added.spec
    assert got.revision == 1 and got.enabled
    assert got.spec.retry.safety.value == "idempotent"


def test_duplicate_task_name_is_refused_and_nothing_written(repo):
    repo.tasks.add(spec(), actor_name="tester")
    with pytest.raises(AlreadyExists):
        repo.tasks.add(spec(max_concurrent=3), actor_name="tester")
    assert [t.spec.max_concurrent for t in repo.tasks.list()] == [1]


def test_update_adds_a_revision_and_runs_keep_theirs(repo):
    repo.tasks.add(spec(), actor_name="tester")
    first = repo.runs.request("job").run
    updated = repo.tasks.update("job", timeout_ms=1000, actor_name="tester")
    assert updated.revision == 2 and updated.spec.timeout_ms == 1000
    second = repo.runs.request("job").run
    assert (first.task_revision, second.task_revision) == (1, 2)
    assert repo.tasks.update("job", timeout_ms=1000, actor_name="tester").revision == 2  # no change, no revision


def test_unknown_task_is_not_found(repo):
    with pytest.raises(NotFound):
        repo.tasks.get("nope")
    with pytest.raises(NotFound):
        repo.runs.request("nope")
    with pytest.raises(NotFound):
        repo.tasks.update("nope", timeout_ms=5, actor_name="tester")


def test_enable_disable(repo):
    repo.tasks.add(spec(), actor_name="tester")
    assert repo.tasks.set_enabled("job", False, actor_name="tester").enabled is False
    assert repo.tasks.get("job").enabled is False
    assert repo.tasks.set_enabled("job", True, actor_name="tester").enabled is True


# -- runs --------------------------------------------------------------------------------------

def test_request_run_queues_attempt_one_with_events(repo):
    repo.tasks.add(spec(), actor_name="tester")
    admission = repo.runs.request("job")
    run = repo.runs.get(admission.run.id)
    assert admission.created
    assert run.state == "queued" and run.version == 3 and run.trigger_type == "manual"
    assert [(a.number, a.state) for a in run.attempts] == [(1, "claimed")]
    assert [(e.seq, e.type) for e in run.events] == [
        (1, "run.created"), (2, "run.queued"), (3, "attempt.claimed")]


def test_retry_policy_is_snapshotted_at_admission(repo):
    policy = RetryPolicy(retry_on_lost=True, max_attempts=2, safety="deduplicated")
    repo.tasks.add(spec(retry=policy), actor_name="tester")
    with_policy = repo.runs.request("job").run.id
    repo.tasks.update("job", retry=RetryPolicy(), actor_name="tester")
    without = repo.runs.request("job").run.id
    with repo.store.read() as conn:
        rows = {r.run_id: r for r in conn.execute(select(run_retry_policies))}
    assert set(rows) == {with_policy} and rows[with_policy].max_attempts == 2
    assert without not in rows


def test_idempotency_key_returns_the_first_run(repo):
    repo.tasks.add(spec(), actor_name="tester")
    first = repo.runs.request("job", idempotency_key="k1")
    again = repo.runs.request("job", idempotency_key="k1")
    assert first.created and not again.created
    assert again.run.id == first.run.id
    assert len(events_of(repo, first.run.id)) == 3
    with repo.store.read() as conn:
        assert conn.execute(select(func.count()).select_from(runs)).scalar_one() == 1


def test_concurrent_requests_with_one_key_admit_one_run(repo):
    repo.tasks.add(spec(), actor_name="tester")
    results, errors = [], []
    barrier = threading.Barrier(4)

    def request():
        barrier.wait()
        try:
            results.append(repo.runs.request("job", idempotency_key="same"))
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=request) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert len({r.run.id for r in results}) == 1
    assert sum(r.created for r in results) == 1


def test_cancel_of_queued_run_ends_it_at_once(repo):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    result = repo.runs.cancel(run_id)
    assert result.result == "cancelled" and result.value.state == "cancelled"
    run = repo.runs.get(run_id)
    assert run.attempts[0].state == "cancelled" and run.cancel_reason == "user"
    assert run.finished_at_ms is not None
    assert events_of(repo, run_id)[3:] == ["run.cancel_requested", "attempt.cancelled", "run.cancelled"]
    again = repo.runs.cancel(run_id)
    assert again.result == "already_terminal"
    assert len(events_of(repo, run_id)) == 6


def test_cancel_of_running_run_records_intent_only(repo):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    make_running(repo, run_id)
    result = repo.runs.cancel(run_id)
    assert result.result == "requested" and result.value.state == "running"
    assert result.value.cancel_reason == "user"
    assert repo.runs.cancel(run_id).result == "already_requested"
    # the first committed reason sticks: shutdown does not overwrite it
    assert repo.runs.cancel(run_id, CancelReason.SHUTDOWN).result == "already_requested"
    run = repo.runs.get(run_id)
    assert run.cancel_reason == "user"
    assert [e.type for e in run.events].count("run.cancel_requested") == 1


def test_cancel_of_offered_but_unactivated_run_ends_it(repo):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    advance(repo, run_id, plan_offer)
    assert repo.runs.cancel(run_id).result == "cancelled"


def test_unknown_run_is_not_found(repo):
    with pytest.raises(NotFound):
        repo.runs.get(new_id())
    with pytest.raises(NotFound):
        repo.runs.cancel("x" * 80)


def test_stale_writers_race_and_exactly_one_wins(repo):
    """Two transactions that read the same version: the second compare-and-set matches no row."""
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    make_running(repo, run_id)
    snapshots = []
    for _ in range(2):
        with repo.store.read() as conn:
            snapshots.append((run_snapshot(load_run(conn, run_id, lock=False)),
                              attempt_snapshot(current_attempt(conn, run_id))))
    outcomes = []
    for reason, (run, attempt) in zip((CancelReason.USER, CancelReason.TIMEOUT), snapshots):
        plan = plan_cancel(run, attempt, reason)
        try:
            with repo.store.write() as conn:
                apply_plan(conn, plan, repo.store.now_ms(conn), actor_type="user")
            outcomes.append("won")
        except Conflict:
            outcomes.append("conflict")
    assert outcomes == ["won", "conflict"]
    run = repo.runs.get(run_id)
    assert run.cancel_reason == "user"
    assert [e.type for e in run.events].count("run.cancel_requested") == 1


def test_concurrent_cancels_add_one_intent(repo):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    make_running(repo, run_id)
    outcomes, barrier = [], threading.Barrier(4)

    def cancel():
        barrier.wait()
        try:
            outcomes.append(repo.runs.cancel(run_id).result)
        except Conflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=cancel) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert outcomes.count("requested") == 1
    assert [e.type for e in repo.runs.get(run_id).events].count("run.cancel_requested") == 1


# -- schema invariants -------------------------------------------------------------------------

def _raw_attempt(run_id, number, status="claimed"):
    return dict(id=new_id(), run_id=run_id, number=number, status=status, executor_type="local_process",
                callback_sequence=0, created_at_ms=1, updated_at_ms=1)


def test_schema_allows_one_active_attempt_per_run(repo):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    with pytest.raises(IntegrityError):
        with repo.store.write() as conn:
            conn.execute(run_attempts.insert().values(**_raw_attempt(run_id, 2)))


def test_schema_keeps_attempt_numbers_and_event_sequences_unique(repo):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    with pytest.raises(IntegrityError):
        with repo.store.write() as conn:
            conn.execute(run_attempts.insert().values(**_raw_attempt(run_id, 1, "lost")))
    with pytest.raises(IntegrityError):
        with repo.store.write() as conn:
            conn.execute(run_events.insert().values(
                id=new_id(), run_id=run_id, sequence=2, type="run.queued", actor_type="user",
                payload_json="{}", created_at_ms=1))


def test_schema_rejects_unknown_status_and_unsafe_policy(repo):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    with pytest.raises(IntegrityError):
        with repo.store.write() as conn:
            conn.execute(runs.update().where(runs.c.id == run_id).values(status="exploded"))
    with pytest.raises(IntegrityError):
        with repo.store.write() as conn:
            conn.execute(run_retry_policies.insert().values(
                run_id=run_id, max_attempts=3, retry_on_lost=True, safety="unknown",
                backoff_base_ms=1000, backoff_max_ms=2000, version=0, created_at_ms=1, updated_at_ms=1))


# -- listing -----------------------------------------------------------------------------------

def test_runs_are_listed_newest_first_in_keyset_pages(repo):
    repo.tasks.add(spec("a"), actor_name="tester")
    repo.tasks.add(spec("b"), actor_name="tester")
    ids = [repo.runs.request("a" if i % 2 else "b").run.id for i in range(7)]
    seen, cursor = [], None
    while True:
        page = repo.runs.list(limit=3, cursor=cursor)
        seen.extend(r.id for r in page.runs)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == list(reversed(ids))
    assert [r.id for r in repo.runs.list(task="a").runs] == [i for i in reversed(ids) if i in ids[1::2]]
    repo.runs.cancel(ids[0])
    assert [r.id for r in repo.runs.list(state="cancelled").runs] == [ids[0]]
    with pytest.raises(BadInput):
        repo.runs.list(limit=0)
    with pytest.raises(BadInput):
        repo.runs.list(cursor="garbage")


# -- removal -----------------------------------------------------------------------------------

def test_remove_refuses_with_active_runs_unless_forced(repo):
    repo.tasks.add(spec(), actor_name="tester")
    queued = repo.runs.request("job").run.id
    running = repo.runs.request("job").run.id
    make_running(repo, running)
    with pytest.raises(BadInput, match="active run"):
        repo.remove_task("job", actor_name="tester")
    assert repo.tasks.get("job")
    removal = repo.remove_task("job", force=True, actor_name="tester")
    assert removal.cancelled == (queued,) and removal.requested == (running,)
    assert repo.tasks.list() == []
    assert repo.runs.get(queued).state == "cancelled"
    assert repo.runs.get(running).task == "job"  # history stays readable
    with pytest.raises(NotFound):
        repo.runs.request("job")
    repo.tasks.add(spec(), actor_name="tester")  # the name is free again
    with repo.store.read() as conn:
        assert conn.execute(select(func.count()).select_from(tasks)).scalar_one() == 2
