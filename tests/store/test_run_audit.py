"""Who asked, on run events (schema 16 `run_events.actor_name`), and the run list's time filter;
on a SQLite file and on PostgreSQL (see conftest).

A person's request, cancel, retry and a forced task removal's cancels carry the name given; what
the runtime does on its own (offers, cron admission, a shutdown cancel) carries none. The event
payloads stay what they were."""

from __future__ import annotations

import secrets

import pytest
from sqlalchemy import select

from qlactors.domain.states import CancelReason, RunStatus
from qlactors.domain.transitions import plan_cancel
from qlactors.errors import BadInput
from qlactors.store.cadence.cron_admission import CronAdmission
from qlactors.store.plans import apply_plan, attempt_snapshot, current_attempt, events_together, load_run, run_snapshot
from qlactors.store.schema import run_events, runs
from cron_helpers import MINUTE, T0, add_trigger, cron_runs
from store_helpers import new_hash, spec


def actors(repo, run_id) -> list[tuple[str, str, str | None]]:
    """(type, actor_type, actor_name) of each of the run's events, in order, as stored."""
    with repo.store.read() as conn:
        return [tuple(r) for r in conn.execute(
            select(run_events.c.type, run_events.c.actor_type, run_events.c.actor_name)
            .where(run_events.c.run_id == run_id).order_by(run_events.c.sequence))]


def names(repo, run_id) -> set[str | None]:
    return {name for _, _, name in actors(repo, run_id)}


def test_a_request_records_who_asked_on_its_events_and_the_view_and_json_carry_it(repo):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job", actor_name="alice").run.id
    stored = actors(repo, run_id)
    # the attempt it claims is the runtime's own step, not alice's (issue 28)
    assert stored == [("run.created", "user", "alice"), ("run.queued", "user", "alice"),
                      ("attempt.claimed", "system", None)]
    view = repo.runs.get(run_id)
    assert [e.actor_name for e in view.events] == ["alice", "alice", None]
    first = view.to_json()["events"][0]
    assert (first["type"], first["actor_type"], first["actor_name"]) == ("run.created", "user", "alice")
    assert first["payload"] == {"trigger_type": "manual"}  # the payload is unchanged


def test_a_cancel_and_a_retry_record_their_own_asker(repo):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job", actor_name="alice").run.id
    admitted = len(actors(repo, run_id))
    outcome = repo.runs.cancel(run_id, actor_name="bob")
    assert outcome.value.state == RunStatus.CANCELLED.value
    cancel = actors(repo, run_id)[admitted:]
    assert cancel and {n for _, _, n in cancel} == {"bob"}
    retried = repo.runs.retry(run_id, actor_name="carol").run.id
    assert names(repo, retried) == {"carol", None}  # None: its `attempt.claimed`, the runtime's
    assert names(repo, run_id) == {"alice", "bob", None}  # the old run is untouched


def test_without_a_name_the_events_carry_none_as_before(repo):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    repo.runs.cancel(run_id)
    assert names(repo, run_id) == {None}
    assert all(e["actor_name"] is None for e in repo.runs.get(run_id).to_json()["events"])


def test_what_the_runtime_does_on_its_own_carries_no_name(repo, dispatch):
    repo.tasks.add(spec(), actor_name="tester")
    asked = repo.runs.request("job", actor_name="alice").run.id
    admitted = len(actors(repo, asked))
    session = dispatch.sessions.register("w", 4)
    [offer] = dispatch.offers.batch(session.worker_id, session.session_id, session.generation,
                                    [(secrets.token_hex(8), new_hash())], log_cap_bytes=0)
    assert offer.run_id == asked
    repo.runs.cancel(asked, CancelReason.SHUTDOWN, actor_type="system")  # edge's shutdown cancel
    admission, runtime = actors(repo, asked)[:admitted], actors(repo, asked)[admitted:]
    assert [n for _, _, n in admission] == ["alice", "alice", None]  # the claim: the runtime's own step
    assert {a for _, a, _ in runtime} >= {"system"} and len({a for _, a, _ in runtime}) > 1, runtime
    assert all(name is None for _, _, name in runtime), runtime

    tid = add_trigger(repo, "cron5", since_ms=T0)
    cron = CronAdmission(repo.store)
    for due in cron.due(T0 + 5 * MINUTE, 16):
        cron.fire(due, T0 + 5 * MINUTE, tick_ms=1000)
    [cron_run] = cron_runs(repo, tid)
    assert names(repo, cron_run.id) == {None}


def test_events_written_together_keep_each_plan_s_name(repo):
    """A batch of plans (`events_together`: one multi-row INSERT) writes every column, the name
    included, into the right row."""
    repo.tasks.add(spec(max_concurrent=3), actor_name="tester")
    ids = [repo.runs.request("job").run.id for _ in range(3)]
    admitted = len(actors(repo, ids[0]))  # every admission writes as many
    with repo.store.write() as conn, events_together(conn):
        for run_id, name in zip(ids, ("alice", None, "bob")):
            row = load_run(conn, run_id)
            attempt = current_attempt(conn, run_id)
            plan = plan_cancel(run_snapshot(row), attempt_snapshot(attempt), CancelReason.USER)
            apply_plan(conn, plan, repo.store.now_ms(conn), actor_type="user", actor_name=name,
                       expected_callback_sequence=attempt.callback_sequence)
    for run_id, name in zip(ids, ("alice", None, "bob")):
        cancel = actors(repo, run_id)[admitted:]
        assert cancel and {n for _, _, n in cancel} == {name}
        assert repo.runs.get(run_id).state == RunStatus.CANCELLED.value


def test_a_forced_removal_cancels_in_the_remover_s_name(repo):
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job", actor_name="alice").run.id
    admitted = len(actors(repo, run_id))
    removal = repo.remove_task("job", force=True, actor_name="dave")
    assert removal.cancelled == (run_id,)
    cancel = actors(repo, run_id)[admitted:]
    assert cancel and {n for _, _, n in cancel} == {"dave"}


@pytest.mark.parametrize("bad", ["", "x" * 129, "a\nb"])
def test_a_bad_name_is_refused_and_nothing_is_written(repo, bad):
    repo.tasks.add(spec(), actor_name="tester")
    with pytest.raises(BadInput, match="printable characters"):
        repo.runs.request("job", actor_name=bad)
    assert repo.runs.list().runs == ()
    run_id = repo.runs.request("job").run.id
    with pytest.raises(BadInput, match="printable characters"):
        repo.runs.cancel(run_id, actor_name=bad)
    assert repo.runs.get(run_id).state == RunStatus.QUEUED.value


# -- the run list's time filter ----------------------------------------------------------------

def runs_at(repo, *created_ms: int) -> list[str]:
    """One run per time, its `created_at_ms` set to that time (test scaffolding); ids in order."""
    ids = []
    for at in created_ms:
        run_id = repo.runs.request("job").run.id
        with repo.store.write() as conn:
            conn.execute(runs.update().where(runs.c.id == run_id).values(created_at_ms=at))
        ids.append(run_id)
    return ids


def listed(repo, **kw) -> list[str]:
    return [r.id for r in repo.runs.list(**kw).runs]


def test_since_is_inclusive_and_before_is_exclusive(repo):
    repo.tasks.add(spec(max_concurrent=8), actor_name="tester")
    a, b, c, d = runs_at(repo, 1_000, 2_000, 3_000, 4_000)
    assert listed(repo) == [d, c, b, a]
    assert listed(repo, created_since_ms=2_000) == [d, c, b]
    assert listed(repo, created_before_ms=3_000) == [b, a]
    assert listed(repo, created_since_ms=2_000, created_before_ms=4_000) == [c, b]
    assert listed(repo, created_since_ms=2_001, created_before_ms=3_000) == []
    assert listed(repo, created_since_ms=0, created_before_ms=0) == []
    assert listed(repo, state="queued", task="job", created_since_ms=3_000) == [d, c]


def test_the_cursor_pages_through_a_time_window(repo):
    repo.tasks.add(spec(max_concurrent=8), actor_name="tester")
    ids = runs_at(repo, 1_000, 2_000, 2_000, 2_000, 3_000, 4_000, 5_000)
    window = dict(created_since_ms=2_000, created_before_ms=5_000)
    expected = listed(repo, limit=100, **window)
    assert len(expected) == 5 and set(expected) == set(ids[1:6])
    seen, cursor = [], None
    while True:
        page = repo.runs.list(limit=2, cursor=cursor, **window)
        seen += [r.id for r in page.runs]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == expected  # every run of the window once, in order, across equal times


@pytest.mark.parametrize("bad", [-1, True, 1.5, "1000"])
def test_a_bad_bound_is_refused(repo, bad):
    repo.tasks.add(spec(), actor_name="tester")
    with pytest.raises(BadInput, match="--since"):
        repo.runs.list(created_since_ms=bad)
    with pytest.raises(BadInput, match="--until"):
        repo.runs.list(created_before_ms=bad)
