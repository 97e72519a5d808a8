"""Notifications end to end: a rule made with `qlactors notify add`, a run's end queuing its outbox
row in the same transaction, and `qlactors web` delivering it to a local HTTP receiver: exactly the
documented JSON for a failed run; with the receiver down, tries are recorded and it lands when the
receiver comes back, after a runtime `kill -9` too; a slow receiver does not delay the next run; a
command rule gets the facts in its environment."""

from __future__ import annotations

import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from edge_harness import Home, wait_until
from web_rigs import WebServer, new_token, wait_state
from wire_harness import free_port


class Receiver:
    """A webhook receiver on 127.0.0.1: records each POST's JSON body; `delay` s before answering."""

    def __init__(self, port: int | None = None, delay: float = 0.0) -> None:
        self.port = port or free_port()
        self.bodies: list[dict] = []
        self.keys: list[str | None] = []  # each POST's Idempotency-Key
        self.raw: list[tuple[bytes, dict[str, str]]] = []  # each POST's exact body and its headers
        self.delay = delay
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                length = int(self.headers["Content-Length"])
                raw = self.rfile.read(length)
                body = json.loads(raw)
                receiver.raw.append((raw, dict(self.headers.items())))
                time.sleep(receiver.delay)
                receiver.keys.append(self.headers.get("Idempotency-Key"))
                receiver.bodies.append(body)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def notified(tmp_path):
    home = Home(tmp_path, config="[runtime]\nslots = 2\n")
    server = None
    try:
        home.main("task", "add", "flaky", "--", "echo secret-output; exit 7")
        home.main("task", "add", "fine", "--", "true")
        edge = home.start_edge()
        admin = new_token(home, "admin")
        yield home, edge, admin, lambda: WebServer(tmp_path, ["--home", str(home.path)])
    finally:
        home.close()


def _notifications(home: Home, run_id: str) -> list[dict]:
    return json.loads(home.ok("show", run_id, "--json").stdout)["notifications"]


def test_a_failed_run_posts_exactly_the_documented_json(notified):
    home, _, admin, start_web = notified
    receiver = Receiver()
    server = None
    try:
        home.main("notify", "add", "--task", "flaky", "--webhook", receiver.url)
        server = start_web()
        run = server.request("POST", "/api/v1/tasks/flaky/runs", token=admin).json()
        ended = wait_state(server, admin, run["id"], {"failed"})
        wait_until(lambda: receiver.bodies, 30, "the webhook")
        attempt = ended["attempts"][-1]
        [outbox] = _notifications(home, run["id"])
        assert receiver.bodies == [{
            "event": "run.finished", "task": "flaky", "run_id": run["id"], "state": "failed", "attempt": 1,
            "exit_code": 7,
            "error_code": ended["error_code"], "created_at_ms": ended["created_at_ms"],
            "started_at_ms": ended["started_at_ms"], "finished_at_ms": ended["finished_at_ms"],
            "url": f"http://127.0.0.1:{server.port}/#run={run['id']}", "notification_id": outbox["id"]}]
        assert receiver.keys == [outbox["id"]]  # the Idempotency-Key a receiver drops a duplicate by
        assert attempt["exit_code"] == 7
        wait_until(lambda: _notifications(home, run["id"])[0]["status"] == "delivered", 10, "delivered recorded")
        shown = home.ok("show", run["id"]).stdout
        assert f"webhook http://127.0.0.1:{receiver.port}/… (rule" in shown and "delivered" in shown
        assert "/hook" not in shown
        # A run that succeeds is not what the rule asks about: nothing more arrives.
        ok = server.request("POST", "/api/v1/tasks/fine/runs", token=admin).json()
        wait_state(server, admin, ok["id"], {"succeeded"})
        time.sleep(1.5)
        assert len(receiver.bodies) == 1
        assert "secret-output" not in json.dumps(receiver.bodies) and "secret-output" not in server.log()
    finally:
        receiver.close()
        if server is not None:
            server.stop()


def test_a_receiver_that_is_down_gets_it_when_it_comes_back_even_after_a_runtime_kill_9(notified):
    home, edge, admin, start_web = notified
    port = free_port()
    home.main("notify", "add", "--on", "failed", "--webhook", f"http://127.0.0.1:{port}/hook")
    run_id = home.main("run", "flaky").strip()
    home.wait_terminal(run_id)
    edge.kill9()  # the outbox row was committed with the run's end: nothing is owed by the runtime
    server = start_web()
    receiver = None
    try:
        wait_until(lambda: any(n["tries"] for n in _notifications(home, run_id)), 30, "a failed try")
        first = _notifications(home, run_id)[0]
        assert first["status"] == "pending" and first["tries"][0]["ok"] is False and first["next_try_at_ms"]
        receiver = Receiver(port)
        wait_until(lambda: receiver.bodies, 30, "the try after the receiver came back")
        assert receiver.bodies[0]["run_id"] == run_id and receiver.bodies[0]["state"] == "failed"
        wait_until(lambda: _notifications(home, run_id)[0]["status"] == "delivered", 10, "delivered recorded")
        tries = _notifications(home, run_id)[0]["tries"]
        assert [t["ok"] for t in tries][-1] is True and len(tries) >= 2
    finally:
        if receiver is not None:
            receiver.close()
        server.stop()


def test_a_slow_receiver_does_not_delay_the_next_run(notified):
    home, _, admin, start_web = notified
    receiver = Receiver(delay=8.0)
    server = start_web()
    try:
        home.main("notify", "add", "--on", "failed,succeeded", "--webhook", receiver.url)
        first = server.request("POST", "/api/v1/tasks/flaky/runs", token=admin).json()
        wait_state(server, admin, first["id"], {"failed"})
        started = time.monotonic()
        second = server.request("POST", "/api/v1/tasks/fine/runs", token=admin).json()
        wait_state(server, admin, second["id"], {"succeeded"}, timeout=30)
        assert time.monotonic() - started < 6.0  # well before the receiver answers the first
        wait_until(lambda: len(receiver.bodies) == 2, 40, "both notifications")
    finally:
        receiver.close()
        server.stop()


def test_a_command_rule_gets_the_facts_in_its_environment(notified, tmp_path):
    home, _, admin, start_web = notified
    out = tmp_path / "told.txt"
    home.main("notify", "add", "--task", "flaky",
              "--command", f'echo "$QLACTORS_NOTIFY_TASK $QLACTORS_NOTIFY_STATE $QLACTORS_NOTIFY_EXIT_CODE" > {out}')
    server = start_web()
    try:
        run = server.request("POST", "/api/v1/tasks/flaky/runs", token=admin).json()
        wait_until(lambda: out.exists() and out.read_text().strip(), 30, "the command")
        assert out.read_text() == "flaky failed 7\n"
        rules = json.loads(home.ok("notify", "list", "--json").stdout)
        assert [r["kind"] for r in rules] == ["command"] and rules[0]["task"] == "flaky"
        home.ok("notify", "rm", rules[0]["id"])
        assert json.loads(home.ok("notify", "list", "--json").stdout) == []
        assert run["id"]
    finally:
        server.stop()


def test_bad_rules_are_refused_and_write_nothing(notified):
    home, _, _, _ = notified
    for args, fragment in ((("--on", "sleeping", "--webhook", "http://x/"), "--on"),
                           (("--webhook", "ftp://x/"), "http:// or https://"),
                           (("--apprise", "nonsense"), "apprise URL"),
                           (("--task", "nobody", "--webhook", "http://x/"), "no task named")):
        done = home.ql("notify", "add", *args)
        assert done.returncode == 2 and fragment in done.stderr, (args, done.stderr)
    assert json.loads(home.ok("notify", "list", "--json").stdout) == []


def test_a_recovered_rule_tells_only_of_the_first_success_after_a_failure(notified, tmp_path):
    home, _, admin, start_web = notified
    flag, out = tmp_path / "healthy", tmp_path / "told.txt"
    home.main("task", "add", "heal", "--", f"test -f {flag}")
    home.main("notify", "add", "--task", "heal", "--on", "recovered",
              "--command", f'echo "$QLACTORS_NOTIFY_RUN_ID $QLACTORS_NOTIFY_STATE" >> {out}')
    server = start_web()
    try:
        states = []
        for healthy in (False, True, True):
            if healthy:
                flag.touch()
            run = server.request("POST", "/api/v1/tasks/heal/runs", token=admin).json()
            states.append((run["id"], wait_state(server, admin, run["id"], {"failed", "succeeded"})["state"]))
        assert [s for _, s in states] == ["failed", "succeeded", "succeeded"]
        wait_until(lambda: out.exists(), 30, "the recovered notification")
        time.sleep(2.5)  # a second one would have been delivered by now
        assert out.read_text() == f"{states[1][0]} succeeded\n"
    finally:
        server.stop()


def test_one_hanging_endpoint_with_20_due_holds_up_no_other_rule(notified):
    """Head-of-line blocking (issue 28): 20 notifications due to a receiver that never answers hold
    one delivery lane (its host), not every slot: a healthy rule's notification arrives within 2 s
    of its run's end."""
    home, _, admin, start_web = notified
    hanging, healthy = Receiver(delay=60.0), Receiver()
    server = None
    try:
        home.main("notify", "add", "--task", "flaky", "--on", "failed", "--webhook", hanging.url)
        home.main("notify", "add", "--task", "fine", "--on", "succeeded", "--webhook", healthy.url)
        failed = [home.main("run", "flaky").strip() for _ in range(20)]
        for run_id in failed:
            home.wait_terminal(run_id)
        server = start_web()
        time.sleep(1.5)  # the notifier has claimed what it will of the 20
        run = server.request("POST", "/api/v1/tasks/fine/runs", token=admin).json()
        ended = wait_state(server, admin, run["id"], {"succeeded"}, timeout=30)
        wait_until(lambda: healthy.bodies, 30, "the healthy rule's notification")
        arrived_ms = time.time() * 1000
        assert arrived_ms - ended["finished_at_ms"] < 2_000, arrived_ms - ended["finished_at_ms"]
        assert len(hanging.bodies) <= 1  # one try in its lane at a time (the first still hangs)
    finally:
        hanging.close()
        healthy.close()
        if server is not None:
            server.stop()


def test_stopping_qlactors_web_releases_its_claims_at_once(notified):
    """SIGTERM to `qlactors web` while a try hangs: its claim is released as it stops (another web
    process takes the row at once, not after any claim's time), and its deliverer row is gone."""
    home, _, admin, start_web = notified
    hanging = Receiver(delay=60.0)
    server = None
    try:
        home.main("notify", "add", "--task", "flaky", "--on", "failed", "--webhook", hanging.url)
        run_id = home.main("run", "flaky").strip()
        home.wait_terminal(run_id)
        server = start_web()
        claimed = wait_until(lambda: [r["claimed_by"] for r in home.query(
            "SELECT claimed_by FROM notification_outbox WHERE claimed_by IS NOT NULL")], 30, "the web's claim")
        assert home.query("SELECT id FROM notification_deliverers")[0]["id"] == claimed[0]
        server.stop()
        assert server.proc.returncode == -signal.SIGTERM, server.log()  # stopped by it, as before
        assert [r["claimed_by"] for r in home.query("SELECT claimed_by FROM notification_outbox")] == [None]
        assert home.query("SELECT id FROM notification_deliverers") == []
        assert _notifications(home, run_id)[0]["status"] == "pending"
    finally:
        hanging.close()
        if server is not None:
            server.stop()


def test_a_signed_webhook_is_verified_by_its_receiver_and_its_secret_never_shown(notified, tmp_path):
    """`notify add --webhook URL --secret-file FILE`: each POST carries X-Qlactors-Timestamp and
    X-Qlactors-Signature, `sha256=` + HMAC-SHA256(secret, timestamp + "." + body) as docs/web.md
    says, which a receiver holding the secret verifies; the secret appears in no output, log or
    API body (`notify list --json` says only `signed`)."""
    import hashlib
    import hmac

    home, _, admin, start_web = notified
    secret = "whsec-planted-7d1e0c93b5"
    secret_file = tmp_path / "hook.secret"
    secret_file.write_text(secret + "\n")
    receiver = Receiver()
    server = None
    seen: list[str] = []
    try:
        refused = home.ql("notify", "add", "--command", "true", "--secret-file", str(secret_file))
        assert refused.returncode == 2 and "webhook only" in refused.stderr, refused
        added = home.ok("notify", "add", "--task", "flaky", "--webhook", receiver.url, "--secret-file", str(secret_file))
        seen += [added.stdout, added.stderr, refused.stdout, refused.stderr]
        server = start_web()
        run = server.request("POST", "/api/v1/tasks/flaky/runs", token=admin).json()
        wait_until(lambda: receiver.raw, 30, "the signed webhook")
        raw, headers = receiver.raw[0]
        timestamp = headers["X-Qlactors-Timestamp"]
        expected = hmac.new(secret.encode(), timestamp.encode() + b"." + raw, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers["X-Qlactors-Signature"], "sha256=" + expected), headers
        forged = hmac.new(b"another secret", timestamp.encode() + b"." + raw, hashlib.sha256).hexdigest()
        assert headers["X-Qlactors-Signature"] != "sha256=" + forged
        assert abs(int(timestamp) - time.time()) < 3600 and json.loads(raw)["run_id"] == run["id"]
        rules = json.loads(home.ok("notify", "list", "--json").stdout)
        assert [(r["kind"], r["signed"]) for r in rules] == [("webhook", True)] and "secret" not in rules[0]
        assert "webhook (signed)" in home.ok("notify", "list").stdout
        wait_until(lambda: _notifications(home, run["id"])[0]["status"] == "delivered", 10, "delivered recorded")
        for args in (("notify", "list"), ("notify", "list", "--json"), ("show", run["id"]), ("show", run["id"], "--json")):
            seen.append(home.ok(*args).stdout)
        seen.append(server.request("GET", f"/api/v1/runs/{run['id']}", token=admin).body.decode())
    finally:
        receiver.close()
        if server is not None:
            server.stop()
            seen.append(server.log())
    assert not [text for text in seen if secret in text]
