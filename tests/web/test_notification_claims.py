"""Who holds a notification claim (issue 28): each `qlactors web` deliverer claims outbox rows in
its own name and refreshes its row while it runs; a clean stop releases its claims at once, and the
claims of one that died (no longer refreshed) pass to another once the bound (30 s, database time)
has gone by, not 10 minutes later. On a SQLite file and on PostgreSQL (see conftest)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sqlalchemy import select, update

from edge_harness import wait_until
from qlactors.store.admin.notifications import ALIVE_MS, Notifications
from qlactors.store.schema import notification_deliverers, notification_outbox
from qlactors.web import notifier
from store_helpers import spec


def _queued(repo, target: str, count: int = 2) -> list[str]:
    """`count` runs of task `job` ended (cancelled while queued), each with a notification queued for
    a webhook rule on `target`'s host."""
    repo.tasks.add(spec("job", max_queued=count), actor_name="tester")
    Notifications(repo.store).add_rule(task="job", on="cancelled", kind="webhook", target=target,
                                       actor_name="tester")
    ended = []
    for _ in range(count):
        run_id = repo.runs.request("job", actor_name="tester").run.id
        assert repo.runs.cancel(run_id, actor_name="tester").result.value == "cancelled"
        ended.append(run_id)
    return ended


def _claimed_by(repo) -> list[str | None]:
    with repo.store.read() as conn:
        return [r.claimed_by for r in conn.execute(select(notification_outbox.c.claimed_by))]


def test_a_claim_holds_while_its_deliverer_refreshes_and_a_clean_stop_frees_it_at_once(repo):
    _queued(repo, "http://127.0.0.1:9/hook", count=1)
    a, b = Notifications(repo.store), Notifications(repo.store)
    a.heartbeat("A", host="here", pid=1)
    b.heartbeat("B", host="there", pid=2)
    [held] = a.claim_due(owner="A", limit=4, page_url=None)
    assert b.claim_due(owner="B", limit=4, page_url=None) == []  # A is alive: its claim holds
    assert a.heartbeat("A", host="here", pid=1) is True
    assert b.claim_due(owner="B", limit=4, page_url=None) == []
    assert a.release("A") == 1  # A stops cleanly
    [taken] = b.claim_due(owner="B", limit=4, page_url=None)  # at once: no waiting for anything
    assert taken.id == held.id and _claimed_by(repo) == ["B"]
    assert a.record_try(held, ok=True, detail="HTTP 204") is None  # A's late try: not recorded
    assert b.record_try(taken, ok=True, detail="HTTP 204") == "delivered"
    with repo.store.read() as conn:
        assert [r.id for r in conn.execute(select(notification_deliverers.c.id))] == ["B"]


def test_a_dead_deliverers_claims_pass_to_another_once_it_has_not_been_seen_for_the_bound(repo):
    _queued(repo, "http://127.0.0.1:9/hook", count=1)
    a, b = Notifications(repo.store), Notifications(repo.store)
    a.heartbeat("A", host="here", pid=1)
    [held] = a.claim_due(owner="A", limit=4, page_url=None)
    with repo.store.write() as conn:  # A crashed a little less than the bound ago
        now = repo.store.now_ms(conn)
        conn.execute(update(notification_deliverers).values(seen_at_ms=now - ALIVE_MS + 5_000))
    b.heartbeat("B", host="there", pid=2)
    assert b.claim_due(owner="B", limit=4, page_url=None) == []
    with repo.store.write() as conn:  # ...and now a little more
        now = repo.store.now_ms(conn)
        conn.execute(update(notification_deliverers).where(notification_deliverers.c.id == "A")
                     .values(seen_at_ms=now - ALIVE_MS - 1))
    [taken] = b.claim_due(owner="B", limit=4, page_url=None)
    assert taken.id == held.id
    assert a.record_try(held, ok=False, detail="connection refused") is None  # A's stale claim is fenced off
    # A comes back: B's claim still holds against it.
    a.heartbeat("A", host="here", pid=1)
    assert a.claim_due(owner="A", limit=4, page_url=None) == []
    assert b.record_try(taken, ok=True, detail="HTTP 204") == "delivered"


def test_the_bound_is_the_claimers_to_set_and_an_unrefreshed_claim_passes_after_it(repo):
    _queued(repo, "http://127.0.0.1:9/hook", count=1)
    a, b = Notifications(repo.store, alive_ms=300), Notifications(repo.store, alive_ms=300)
    a.heartbeat("A", host="here", pid=1)
    [held] = a.claim_due(owner="A", limit=4, page_url=None)
    # A never refreshes again (as if killed): B takes the row once 300 ms of database time passed.
    [taken] = wait_until(lambda: b.claim_due(owner="B", limit=4, page_url=None), 20, "B to take A's claim")
    assert taken.id == held.id and _claimed_by(repo) == ["B"]


class _Hanging:
    """A webhook receiver that holds each POST until closed."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.posts = 0
        hanging = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                hanging.posts += 1
                hanging.release.wait(30)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_a_notifier_refreshes_its_row_and_its_stop_releases_every_claim(repo, monkeypatch):
    """The Notifier thread: it registers and refreshes its deliverer row; at stop, a try still in
    flight (a receiver that does not answer) is given STOP_WAIT_S, then its claims are released."""
    monkeypatch.setattr(notifier, "STOP_WAIT_S", 0.2)
    monkeypatch.setattr(notifier, "TRY_DEADLINE_S", 2.0)
    receiver = _Hanging()
    running = None
    try:
        _queued(repo, receiver.url, count=2)  # one lane: one row in flight, the other claimable later
        running = notifier.Notifier(Notifications(repo.store), page_url=None, workers=1, refresh_s=0.05).start()
        wait_until(lambda: receiver.posts == 1, 20, "the first try to reach the receiver")
        assert _claimed_by(repo).count(running.owner) == 1

        def seen() -> int:
            with repo.store.read() as conn:
                return conn.execute(select(notification_deliverers.c.seen_at_ms)
                                    .where(notification_deliverers.c.id == running.owner)).scalar_one()

        first = seen()
        wait_until(lambda: seen() > first, 20, "the deliverer's row to be refreshed")
        running.stop()
        assert _claimed_by(repo) == [None, None]  # released at once, the try in flight included
        with repo.store.read() as conn:
            assert conn.execute(select(notification_deliverers)).all() == []
        other = Notifications(repo.store)
        other.heartbeat("B", host="there", pid=2)
        assert len(other.claim_due(owner="B", limit=4, page_url=None)) == 1  # one per lane: at once
    finally:
        receiver.close()
        if running is not None:
            running.stop()
