"""Retention of the rows beside runs (store/cadence/retention_sweep.py): settled notifications whose
run is gone, with their tries (a pending one never), revoked API tokens some time after their
revocation (a live one never), and each task's history beyond its newest entries; in bounded
batches. On a SQLite file and on PostgreSQL (see conftest)."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select, update

from qlactors.domain.retention import SWEEP_EVERY_MS
from qlactors.errors import BadInput
from qlactors.store.admin.api_tokens import ApiTokens
from qlactors.store.admin.notifications import Notifications
from qlactors.store.cadence.retention import Retention
from qlactors.store.schema import api_tokens, notification_deliveries, notification_outbox, runs, task_events
from store_helpers import spec

DAY = 86_400_000
T0 = 1_700_000_000_000


@pytest.fixture
def retention(repo):
    return Retention(repo.store, None)  # no local files: these rows are the database's alone


def ended_at(repo, task: str, finished_at_ms: int) -> str:
    """A run of `task` cancelled while queued (it ends at once), finished at `finished_at_ms`."""
    run_id = repo.runs.request(task, actor_name="tester").run.id
    repo.runs.cancel(run_id, actor_name="tester")
    with repo.store.write() as conn:
        conn.execute(update(runs).where(runs.c.id == run_id).values(finished_at_ms=finished_at_ms))
    return run_id


def outbox(repo) -> dict[str, str]:
    """run id -> its notification's status."""
    with repo.store.read() as conn:
        return {r.run_id: r.status for r in conn.execute(select(notification_outbox))}


def tries(repo) -> dict[str, int]:
    """run id -> how many tries are recorded for it."""
    with repo.store.read() as conn:
        return dict(conn.execute(select(notification_deliveries.c.run_id, func.count())
                                 .group_by(notification_deliveries.c.run_id)).all())


def deliver(notes: Notifications, repo, *, ok: bool) -> None:
    """One try of every pending notification, whatever its backoff says (a claim takes one row
    per target host: claim until none is left)."""
    with repo.store.write() as conn:
        conn.execute(update(notification_outbox).values(next_try_at_ms=0))
    notes.heartbeat("sweep-test", host="here", pid=1)
    while due := notes.claim_due(owner="sweep-test", limit=16, page_url=None):
        for one in due:
            notes.record_try(one, ok=ok, detail="HTTP 204" if ok else "HTTP 500")


def test_a_notification_pending_when_its_run_was_retired_goes_with_its_tries_once_settled_never_before(
        repo, retention):
    repo.tasks.add(spec("a"), actor_name="tester")
    notes = Notifications(repo.store)
    notes.add_rule(task="a", on="cancelled", kind="webhook", target="http://127.0.0.1:9/x", actor_name="t")
    old, young = ended_at(repo, "a", T0), ended_at(repo, "a", T0 + 9 * DAY)
    deliver(notes, repo, ok=False)  # both pending, one failed try each
    now = T0 + 10 * DAY

    report = retention.retire_page(now, max_age_ms=7 * DAY, max_runs=100, page=16)
    assert report.retired == 1  # `old`; its notification is pending: it stays, with its try
    assert outbox(repo) == {old: "pending", young: "pending"} and tries(repo) == {old: 1, young: 1}

    deliver(notes, repo, ok=False)  # still pending, its run gone: kept however long it waits
    now += SWEEP_EVERY_MS
    assert retention.retire_page(now, max_age_ms=7 * DAY, max_runs=100, page=16).swept.notifications == 0
    assert outbox(repo) == {old: "pending", young: "pending"} and tries(repo) == {old: 2, young: 2}

    deliver(notes, repo, ok=True)  # both settled now; only the one whose run is gone goes
    now += SWEEP_EVERY_MS
    report = retention.retire_page(now, max_age_ms=7 * DAY, max_runs=100, page=16)
    assert report.swept.notifications == 1
    assert outbox(repo) == {young: "delivered"} and tries(repo) == {young: 3}
    assert notes.of_run(young)[0]["status"] == "delivered"


def test_given_up_notifications_of_gone_runs_go_in_bounded_batches(repo, retention):
    repo.tasks.add(spec("a"), actor_name="tester")
    notes = Notifications(repo.store)
    notes.add_rule(task="a", on="cancelled", kind="command", target="false", actor_name="t")
    ended = [ended_at(repo, "a", T0 + i) for i in range(5)]
    retention.retire_page(T0 + 10 * DAY, max_age_ms=7 * DAY, max_runs=100, page=16)
    with repo.store.write() as conn:  # as a last failed try leaves them, after their runs went
        conn.execute(update(notification_outbox).values(status="gave_up"))

    sweeper = Retention(repo.store, None)
    first = sweeper.retire_page(T0 + 10 * DAY, max_age_ms=7 * DAY, max_runs=100, page=2)
    assert first.swept.notifications == 2 and first.more
    # a full batch: the next call sweeps again at once, without waiting for the minute
    second = sweeper.retire_page(T0 + 10 * DAY, max_age_ms=7 * DAY, max_runs=100, page=2)
    assert second.swept.notifications == 2
    third = sweeper.retire_page(T0 + 10 * DAY, max_age_ms=7 * DAY, max_runs=100, page=2)
    assert third.swept.notifications == 1 and not third.more
    assert outbox(repo) == {} and len(ended) == 5


def test_a_revoked_token_goes_its_bound_after_revocation_and_a_live_one_never(repo, retention):
    tokens = ApiTokens(repo.store)
    for name in ("old", "recent", "live"):
        tokens.new(name)
    tokens.revoke("old")
    tokens.revoke("recent")
    with repo.store.write() as conn:
        for name, revoked in (("old", T0 - 30 * DAY), ("recent", T0 - 29 * DAY)):
            conn.execute(update(api_tokens).where(api_tokens.c.name == name).values(revoked_at_ms=revoked))
        conn.execute(update(api_tokens).where(api_tokens.c.name == "live").values(created_at_ms=0))

    report = retention.retire_page(T0, max_age_ms=7 * DAY, max_runs=100, page=16, revoked_tokens_ms=30 * DAY)
    assert report.swept.tokens == 1
    assert sorted((t.name, t.revoked_at_ms is None) for t in tokens.list()) == [("live", True), ("recent", False)]
    retention.retire_page(T0 + 2 * DAY, max_age_ms=7 * DAY, max_runs=100, page=16, revoked_tokens_ms=30 * DAY)
    assert [t.name for t in tokens.list()] == ["live"]


def test_each_task_keeps_its_newest_history_entries_in_bounded_batches(repo):
    repo.tasks.add(spec("a"), actor_name="tester")
    repo.tasks.add(spec("b"), actor_name="tester")
    for enabled in (False, True, False, True, False):  # a: 6 entries; b: its one
        repo.tasks.set_enabled("a", enabled, actor_name="tester")
    with repo.store.write() as conn:  # one time each, oldest first (they may share a millisecond)
        ids = list(conn.execute(select(task_events.c.id).order_by(task_events.c.created_at_ms, task_events.c.id))
                   .scalars())
        for i, event_id in enumerate(ids):
            conn.execute(update(task_events).where(task_events.c.id == event_id).values(created_at_ms=T0 + i))
    newest_of_a = [(e.type, e.revision) for e in repo.tasks.history("a", limit=2)]

    sweeper = Retention(repo.store, None)
    first = sweeper.retire_page(T0 + DAY, max_age_ms=7 * DAY, max_runs=100, page=3, task_events=2)
    assert first.swept.task_events == 3 and first.more
    second = sweeper.retire_page(T0 + DAY, max_age_ms=7 * DAY, max_runs=100, page=3, task_events=2)
    assert second.swept.task_events == 1 and not second.more
    assert [(e.type, e.revision) for e in repo.tasks.history("a", limit=50)] == newest_of_a
    assert [e.type for e in repo.tasks.history("b", limit=50)] == ["added"]


def test_the_sweep_runs_once_a_minute_unless_a_batch_was_full(repo, retention):
    tokens = ApiTokens(repo.store)
    tokens.new("gone")
    retention.retire_page(T0, max_age_ms=7 * DAY, max_runs=100, page=16)  # swept: nothing due
    tokens.revoke("gone")
    with repo.store.write() as conn:
        conn.execute(update(api_tokens).values(revoked_at_ms=T0 - 31 * DAY))
    assert retention.retire_page(T0 + SWEEP_EVERY_MS - 1, max_age_ms=7 * DAY, max_runs=100,
                                 page=16).swept.tokens == 0
    assert retention.retire_page(T0 + SWEEP_EVERY_MS, max_age_ms=7 * DAY, max_runs=100, page=16).swept.tokens == 1


def test_bad_bounds_for_the_other_rows_are_refused(retention):
    for kw in ({"revoked_tokens_ms": 0}, {"task_events": 0}, {"task_events": True}):
        with pytest.raises(BadInput):
            retention.retire_page(T0, max_age_ms=DAY, max_runs=1, page=1, **kw)
