"""A `command` notification rule (web/notifier.py): its environment is the run's facts
(QLACTORS_NOTIFY_*) beside PATH and HOME, never the web process's own (which may hold the
database URL or a token), and at its timeout its whole process group is killed, not just the
shell (issue 28)."""

from __future__ import annotations

import json
import os
import time

from qlactors.domain.notify import RunFacts
from qlactors.store.admin.notifications import Due
from qlactors.web import notifier


def _due(target: str) -> Due:
    facts = RunFacts(task="nightly", run_id="r1", state="failed", exit_code=7, error_code="EXIT_NONZERO",
                     created_at_ms=1, started_at_ms=2, finished_at_ms=3, url=None)
    return Due(id="o1", owner="d1", run_id="r1", rule_id="n1", kind="command", target=target, tries=0,
               facts=facts)


def test_a_command_gets_the_facts_path_and_home_and_nothing_else_of_the_web_process(tmp_path, monkeypatch):
    monkeypatch.setenv("QLACTORS_DATABASE_URL", "postgresql://qlactors:planted-pw@db/qlactors")
    out = tmp_path / "env.txt"
    assert notifier._command(_due(f"env > {out}")) == (True, "exit 0")
    env = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    assert env["QLACTORS_NOTIFY_TASK"] == "nightly" and env["QLACTORS_NOTIFY_EXIT_CODE"] == "7"
    assert env["PATH"] == os.environ["PATH"]
    assert "QLACTORS_DATABASE_URL" not in env and "planted-pw" not in out.read_text()


def test_a_command_past_its_timeout_has_its_whole_process_group_killed(tmp_path, monkeypatch):
    monkeypatch.setattr(notifier, "COMMAND_TIMEOUT_S", 0.5)
    pid_file = tmp_path / "child.pid"
    started = time.monotonic()
    ok, detail = notifier._command(_due(f"sleep 60 & echo $! > {pid_file}; wait"))
    assert not ok and "ran past" in detail and time.monotonic() - started < 10
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child), "the command's background child outlived its timeout"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


# -- webhooks ---------------------------------------------------------------------------------------

def _serve(handler_body) -> tuple[str, object]:
    """A receiver on 127.0.0.1 whose POST handler is `handler_body(handler)`; (url, server)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.body = self.rfile.read(int(self.headers["Content-Length"]))
            handler_body(self)

        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/hook", server


def test_a_redirect_is_a_failed_try_never_followed():
    def redirect(h):
        h.send_response(302)
        h.send_header("Location", "/elsewhere")
        h.send_header("Content-Length", "0")
        h.end_headers()

    url, server = _serve(redirect)
    try:
        ok, detail = notifier._webhook(_due(url))
    finally:
        server.shutdown()
        server.server_close()
    assert not ok and "HTTP 302" in detail and "redirect" in detail


def test_a_receiver_that_drips_its_answer_holds_a_try_no_longer_than_its_deadline(monkeypatch):
    monkeypatch.setattr(notifier, "TRY_DEADLINE_S", 1.0)

    def drip(h):
        h.wfile.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(20):  # one byte every half second: never a socket timeout, never an end
            h.wfile.write(b"X")
            h.wfile.flush()
            time.sleep(0.5)

    url, server = _serve(drip)
    try:
        started = time.monotonic()
        ok, detail = notifier._webhook(_due(url))
        took = time.monotonic() - started
    finally:
        server.shutdown()
        server.server_close()
    assert not ok and "within 1 s" in detail, detail
    assert took < 5, took


# -- the facts a notification carries ----------------------------------------------------------------

def _failed_by_exit_3(repo, dispatch) -> str:
    """A run of a fresh task `job` that ends failed by exit 3 the way a worker reports it."""
    import secrets as random

    from qlactors.domain.receipt import Receipt, token_hash
    from qlactors.store.dispatch.completion import CompletionService

    session = dispatch.sessions.register("edge", 8)
    run_id = repo.runs.request("job").run.id
    lease_hash = token_hash(random.token_urlsafe(32))
    offer = dispatch.offers.one(session.worker_id, session.session_id, session.generation, random.token_hex(8),
                                lease_hash, log_cap_bytes=0)
    fence, token = offer.fence(lease_hash), random.token_urlsafe(32)
    assert dispatch.reports.activate(fence, token_hash(token), "log").result == "applied"
    assert dispatch.reports.started(fence, "boot", 100, 100, 5).result == "applied"
    receipt = Receipt(schema_version=1, run_id=run_id, attempt_id=offer.attempt_id, callback_sequence=1,
                      token=token, started_at_ms=1, finished_at_ms=2, exit_code=3, output_open=0)
    assert CompletionService(repo.store).complete(run_id, offer.attempt_id, receipt, None).run_state == "failed"
    return run_id


def test_a_notification_delivered_after_its_run_was_deleted_still_says_what_happened(repo, dispatch):
    """The run's facts are copied into the outbox row when the run ends (issue 28): retention
    deleting the run before delivery leaves the webhook's body whole, not nulls."""
    from sqlalchemy import select

    from qlactors.store.admin.notifications import Notifications
    from qlactors.store.cadence.retention import Retention
    from qlactors.store.schema import runs
    from store_helpers import spec

    bodies: list[dict] = []

    def record(h):
        bodies.append(json.loads(h.body))
        h.send_response(204)
        h.end_headers()

    url, server = _serve(record)
    try:
        repo.tasks.add(spec("job"), actor_name="tester")
        notes = Notifications(repo.store)
        notes.add_rule(task="job", on="failed", kind="webhook", target=url, actor_name="tester")
        run_id = _failed_by_exit_3(repo, dispatch)
        with repo.store.read() as conn:
            ended = conn.execute(select(runs).where(runs.c.id == run_id)).one()
        # Retention retires the run (older than 1 ms): its rows go, its pending notification stays.
        report = Retention(repo.store, None).retire_page(ended.finished_at_ms + 60_000, max_age_ms=1, max_runs=1,
                                                         page=10)
        assert report.retired == 1, report
        with repo.store.read() as conn:
            assert conn.execute(select(runs).where(runs.c.id == run_id)).first() is None
        [due] = notes.claim_due(owner="d1", limit=4, page_url=None)
        assert notifier.deliver(due) == (True, "HTTP 204")
    finally:
        server.shutdown()
        server.server_close()
    assert ended.error_code is not None and ended.finished_at_ms is not None
    assert bodies == [{"event": "run.finished", "task": "job", "run_id": run_id, "state": "failed", "attempt": 1,
                       "exit_code": 3, "error_code": ended.error_code, "created_at_ms": ended.created_at_ms,
                       "started_at_ms": ended.started_at_ms, "finished_at_ms": ended.finished_at_ms, "url": None,
                       "notification_id": due.id}]
