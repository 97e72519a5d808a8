"""What a run's end writes beside it, in its terminal transition (store/run_endings.py): the kept
`/metrics` counters of its task and state, and one notification outbox row per rule that asks
about it; then claiming, trying again with backoff, and delivering that row
(store/admin/notifications.py). On a SQLite file and on PostgreSQL (see conftest)."""

from __future__ import annotations

import pytest
from sqlalchemy import select, update

from qlactors.domain.notify import FIRST_RETRY_MS, MAX_TRIES
from qlactors.errors import BadInput, NotFound
from qlactors.store.admin.notifications import Notifications
from qlactors.store.metrics_reads import read_figures
from qlactors.store.schema import notification_outbox, run_outcome_counts, runs
from store_helpers import spec


def _ended_by_cancel(repo, task: str = "job") -> str:
    """A run that ends at once: a queued run cancelled (no process to stop)."""
    run_id = repo.runs.request(task, actor_name="tester").run.id
    assert repo.runs.cancel(run_id, actor_name="tester").result.value == "cancelled"
    return run_id


def test_a_runs_end_counts_it_once_and_the_count_outlives_the_run(repo):
    repo.tasks.add(spec("job"), actor_name="tester")
    first, second = _ended_by_cancel(repo), _ended_by_cancel(repo)
    with repo.store.read() as conn:
        row = conn.execute(select(run_outcome_counts)).one()
    assert (row.state, row.finished, row.timed, row.duration_ms_sum) == ("cancelled", 2, 0, 0)
    with repo.store.write() as conn:  # as retention would: the runs go, the counters stay
        from qlactors.store.schema import run_attempts, run_events, run_retry_policies

        for table in (run_events, run_retry_policies, run_attempts):
            conn.execute(table.delete().where(table.c.run_id.in_([first, second])))
        conn.execute(runs.delete().where(runs.c.id.in_([first, second])))
    figures = read_figures(repo.store)
    assert [(f.task, f.state, f.count) for f in figures.finished] == [("job", "cancelled", 2)]


def test_a_rule_queues_exactly_the_runs_it_asks_about_in_the_terminal_transaction(repo):
    repo.tasks.add(spec("job"), actor_name="tester")
    repo.tasks.add(spec("other"), actor_name="tester")
    notes = Notifications(repo.store)
    mine = notes.add_rule(task="job", on="cancelled", kind="webhook", target="http://127.0.0.1:9/x",
                          actor_name="tester")
    notes.add_rule(task=None, on=None, kind="command", target="true", actor_name="tester")  # failed,...
    ended = _ended_by_cancel(repo)
    _ended_by_cancel(repo, "other")
    live = repo.runs.request("job", actor_name="tester").run.id  # not ended: nothing queued
    with repo.store.read() as conn:
        rows = conn.execute(select(notification_outbox)).all()
    assert [(r.run_id, r.rule_id, r.state, r.status, r.tries) for r in rows] == [
        (ended, mine.id, "cancelled", "pending", 0)]
    assert live != ended


def test_claim_try_again_and_deliver(repo):
    repo.tasks.add(spec("job"), actor_name="tester")
    notes = Notifications(repo.store)
    notes.add_rule(task="job", on="cancelled", kind="webhook", target="http://127.0.0.1:9/x", actor_name="t")
    run_id = _ended_by_cancel(repo)
    assert notes.heartbeat("d1", host="here", pid=1) is False  # first seen
    due = notes.claim_due(owner="d1", limit=10, page_url="https://tasks.example.org/")
    assert [d.run_id for d in due] == [run_id]
    assert due[0].facts.url == f"https://tasks.example.org/#run={run_id}" and due[0].facts.task == "job"
    assert notes.claim_due(owner="d2", limit=10, page_url=None) == []  # claimed: nobody else takes it meanwhile
    assert notes.record_try(due[0], ok=False, detail="connection refused") == "pending"
    assert notes.claim_due(owner="d1", limit=10, page_url=None) == []  # not before its backoff
    with repo.store.read() as conn:
        row = conn.execute(select(notification_outbox)).one()
    assert row.tries == 1 and row.claimed_by is None
    assert row.next_try_at_ms >= row.created_at_ms + FIRST_RETRY_MS
    with repo.store.write() as conn:  # its time has come
        conn.execute(update(notification_outbox).values(next_try_at_ms=0))
    again = notes.claim_due(owner="d1", limit=10, page_url=None)
    assert [d.tries for d in again] == [1]
    assert notes.record_try(again[0], ok=True, detail="HTTP 204") == "delivered"
    shown = notes.of_run(run_id)
    assert shown[0]["status"] == "delivered" and shown[0]["target"] == "http://127.0.0.1:9/…"
    assert [(t["number"], t["ok"]) for t in shown[0]["tries"]] == [(1, False), (2, True)]


def test_the_last_failed_try_gives_the_row_up(repo):
    repo.tasks.add(spec("job"), actor_name="tester")
    notes = Notifications(repo.store)
    notes.add_rule(task="job", on="cancelled", kind="command", target="false", actor_name="t")
    _ended_by_cancel(repo)
    with repo.store.write() as conn:
        conn.execute(update(notification_outbox).values(tries=MAX_TRIES - 1))
    due = notes.claim_due(owner="d1", limit=1, page_url=None)
    assert notes.record_try(due[0], ok=False, detail="exit 1") == "gave_up"
    assert notes.claim_due(owner="d1", limit=1, page_url=None) == []


def test_bad_rules_are_refused(repo):
    repo.tasks.add(spec("job"), actor_name="tester")
    notes = Notifications(repo.store)
    with pytest.raises(BadInput):
        notes.add_rule(task="job", on="sleeping", kind="webhook", target="http://x/", actor_name="t")
    with pytest.raises(BadInput):
        notes.add_rule(task="job", on=None, kind="webhook", target="file:///etc/passwd", actor_name="t")
    with pytest.raises(NotFound):
        notes.add_rule(task="nobody", on=None, kind="webhook", target="http://x/", actor_name="t")
    with pytest.raises(NotFound):
        notes.remove_rule("no-such-rule")
    assert notes.rules() == []


def test_a_run_that_becomes_lost_is_counted_and_told_of_each_time(repo):
    """`lost` is no terminal state (the run is then retried or ends failed): a rule on it is told
    of each time the run becomes lost, and the counter of lost runs goes up, with no duration."""
    from qlactors.store.run_endings import record_run_end

    repo.tasks.add(spec("job"), actor_name="tester")
    notes = Notifications(repo.store)
    rule = notes.add_rule(task="job", on="lost", kind="command", target="true", actor_name="t")
    run_id = repo.runs.request("job", actor_name="tester").run.id
    for version in (50, 60):  # as two losses of the run would leave it (its version after each)
        with repo.store.write() as conn:
            conn.execute(update(runs).where(runs.c.id == run_id).values(status="lost", version=version))
            record_run_end(conn, run_id, repo.store.now_ms(conn))
    with repo.store.read() as conn:
        told = conn.execute(select(notification_outbox.c.id, notification_outbox.c.state)
                            .order_by(notification_outbox.c.id)).all()
        counted = conn.execute(select(run_outcome_counts)).one()
    assert [t.id for t in told] == [f"{run_id}:{rule.id}:50", f"{run_id}:{rule.id}:60"]
    assert {t.state for t in told} == {"lost"}
    assert (counted.state, counted.finished, counted.timed, counted.duration_ms_sum) == ("lost", 2, 0, 0)


def test_the_counters_of_a_failed_transaction_are_not_written_by_the_next(repo):
    """The counts wait for the end of their transaction: a transaction that fails after a run
    ended leaves nothing behind, not even for the next transaction on the same connection."""
    from qlactors.store.run_endings import record_run_end

    repo.tasks.add(spec("job"), actor_name="tester")
    run_id = repo.runs.request("job", actor_name="tester").run.id
    with pytest.raises(RuntimeError):
        with repo.store.write() as conn:
            conn.execute(update(runs).where(runs.c.id == run_id).values(status="lost"))
            record_run_end(conn, run_id, repo.store.now_ms(conn))
            raise RuntimeError("the transaction fails after the run's end was recorded")
    _ended_by_cancel(repo)
    with repo.store.read() as conn:
        assert [(r.state, r.finished) for r in conn.execute(select(run_outcome_counts))] == [("cancelled", 1)]


def test_a_late_lost_notification_names_its_own_attempt_not_the_retry_that_followed(repo):
    """A run lost at attempt 1, then retried and succeeded by attempt 2 before the `lost`
    notification went out: it still tells of attempt 1 and its exit (none), not attempt 2's 0."""
    from qlactors.store.run_endings import record_run_end
    from qlactors.store.schema import run_attempts

    repo.tasks.add(spec("job"), actor_name="tester")
    notes = Notifications(repo.store)
    notes.add_rule(task="job", on="lost", kind="command", target="true", actor_name="t")
    run_id = repo.runs.request("job", actor_name="tester").run.id

    def attempt(number: int, status: str, exit_code: int | None) -> dict:
        return dict(id=f"{run_id[:30]}-a{number}", run_id=run_id, number=number, status=status,
                    executor_type="local", callback_sequence=0, callback_token_hash="0" * 64, exit_code=exit_code,
                    created_at_ms=1, updated_at_ms=1)

    with repo.store.write() as conn:  # the run's first attempt (made when it was admitted, if it was) is lost
        if conn.execute(select(run_attempts.c.id).where(run_attempts.c.run_id == run_id)).first() is None:
            conn.execute(run_attempts.insert().values(**attempt(1, "lost", None)))
        conn.execute(update(run_attempts).where(run_attempts.c.run_id == run_id).values(status="lost"))
        conn.execute(update(runs).where(runs.c.id == run_id).values(status="lost", version=50, error_code="LOST"))
        record_run_end(conn, run_id, repo.store.now_ms(conn))
    with repo.store.write() as conn:  # the retry: a second attempt that exits 0
        conn.execute(run_attempts.insert().values(**attempt(2, "succeeded", 0)))
        conn.execute(update(runs).where(runs.c.id == run_id).values(status="succeeded", version=60, error_code=None,
                                                                         finished_at_ms=repo.store.now_ms(conn)))
    [due] = notes.claim_due(owner="d1", limit=1, page_url=None)
    assert (due.facts.state, due.facts.attempt, due.facts.exit_code, due.facts.error_code) == ("lost", 1, None, "LOST")
