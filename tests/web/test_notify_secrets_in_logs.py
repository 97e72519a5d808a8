"""A notification target's credentials never reach a log (issue 28): rules whose URLs hold a user,
a password, a secret path and a secret query, by webhook (https) and by apprise, delivered by the
web process's Notifier through failed and then good tries and to a dead port, with every log
record of the process captured at DEBUG; and `domain.notify.redacted`/`shown_target`, pure."""

from __future__ import annotations

import logging
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import select, update

from edge_harness import wait_until
from qlactors.domain.notify import check_target, redacted, shown_target
from qlactors.errors import BadInput
from qlactors.store.admin.notifications import Notifications
from qlactors.store.repository import Repository
from qlactors.store.schema import notification_deliveries, notification_outbox
from qlactors.web.notifier import QUIET_LOGGERS, Notifier
from store_helpers import spec
from wire_harness import free_port

SECRETS = ("hookuser", "SECRETPASS", "SECRETPATH", "SECRETQ")
CREDENTIALS = "hookuser:SECRETPASS@"
SECRET_TAIL = "/hook/SECRETPATH?token=SECRETQ"


class Receiver:
    """An HTTP(S) receiver on 127.0.0.1 answering each POST with `status` (settable)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.port, self.status, self.posts = free_port(), 500, 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers["Content-Length"]))
                receiver.posts += 1
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def tls(tmp_path, monkeypatch):
    """A self-signed certificate for 127.0.0.1, trusted by this process's default TLS context."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


@pytest.fixture
def quiet_loggers_restored():
    yield
    for name in QUIET_LOGGERS:  # the Notifier quiets them for the process: give other tests theirs back
        logging.getLogger(name).setLevel(logging.NOTSET)


def _statuses(repo: Repository) -> dict[str, tuple[str, int]]:
    with repo.store.read() as conn:
        return {r.rule_id: (r.status, r.tries) for r in conn.execute(select(notification_outbox))}


# apprise imports the stdlib's `imghdr` (deprecated since 3.11) for its e-mail plugin: not ours to fix
@pytest.mark.filterwarnings("ignore:'imghdr' is deprecated:DeprecationWarning")
def test_no_log_record_at_any_level_holds_a_target_s_credentials_path_or_query(
        tmp_path, tls, caplog, quiet_loggers_restored):
    caplog.set_level(logging.DEBUG)  # the root logger: every record of the whole process
    import apprise  # noqa: F401 (no skip: without it the apprise path would go untested)

    secure, plain, dead = Receiver(tls), Receiver(), free_port()
    repo = Repository.open(f"sqlite:///{tmp_path / 'qlactors.db'}")
    notifier = None
    try:
        repo.tasks.add(spec("job"), actor_name="tester")
        notes = Notifications(repo.store)
        rules = {name: notes.add_rule(task="job", on="cancelled", kind=kind, target=target, actor_name="t").id
                 for name, kind, target in (
                     ("webhook", "webhook", f"https://{CREDENTIALS}127.0.0.1:{secure.port}{SECRET_TAIL}"),
                     ("apprise", "apprise", f"json://{CREDENTIALS}127.0.0.1:{plain.port}{SECRET_TAIL}"),
                     ("dead_webhook", "webhook", f"https://{CREDENTIALS}127.0.0.1:{dead}{SECRET_TAIL}"),
                     ("dead_apprise", "apprise", f"json://{CREDENTIALS}127.0.0.1:{dead}{SECRET_TAIL}"))}
        run_id = repo.runs.request("job", actor_name="tester").run.id
        repo.runs.cancel(run_id, actor_name="tester")
        notifier = Notifier(notes, page_url=None).start()

        # Every rule fails once (HTTP 500, or nothing listening)...
        wait_until(lambda: all(tries >= 1 for _, tries in _statuses(repo).values()) and len(_statuses(repo)) == 4,
                   30, lambda: f"a failed try of each rule: {_statuses(repo)}")
        assert secure.posts >= 1 and plain.posts >= 1
        # ...then the live receivers answer 204, and the next tries (brought forward) deliver.
        secure.status = plain.status = 204
        with repo.store.write() as conn:
            conn.execute(update(notification_outbox).values(next_try_at_ms=0))
        wait_until(lambda: {_statuses(repo)[rules[k]][0] for k in ("webhook", "apprise")} == {"delivered"}, 30,
                   lambda: f"the live rules delivered: {_statuses(repo)}")
        wait_until(lambda: all(_statuses(repo)[rules[k]][1] >= 2 for k in ("dead_webhook", "dead_apprise")), 30,
                   lambda: f"a second try of the dead rules: {_statuses(repo)}")
    finally:
        if notifier is not None:
            notifier.stop()
        secure.close()
        plain.close()

    with repo.store.read() as conn:
        details = [d.detail for d in conn.execute(select(notification_deliveries))]
    shown = [n["target"] for n in notes.of_run(run_id)]
    repo.close()
    records = [f"{r.name} {r.levelname} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records]
    # The one line per try names the target as redacted: the log sites were exercised.
    assert any(f"https://127.0.0.1:{secure.port}/…: delivered" in line for line in records), records
    assert any("HTTP 500" in d for d in details) and "HTTP 204" in details, details
    leaked = [text for text in records + details + shown if any(s in text for s in SECRETS)]
    assert not leaked, leaked


def test_a_target_is_redacted_to_its_scheme_host_and_port():
    url = "https://hookuser:SECRETPASS@Hooks.Example.org:8443/hook/SECRETPATH?token=SECRETQ#frag"
    assert redacted(url) == "https://hooks.example.org:8443/…"
    assert redacted("http://127.0.0.1/x") == "http://127.0.0.1/…"
    assert redacted("http://hooks.example.org") == "http://hooks.example.org/…"
    assert redacted("http://[::1]:8080/SECRETPATH") == "http://[::1]:8080/…"
    # a port that is no number is dropped (tgram://BOT_ID:SECRET/...), so is what cannot be parsed
    assert redacted("tgram://123456:SECRETPASS/CHAT") == "tgram://123456/…"
    assert redacted("http://[::1/SECRETPATH") == "http://…"
    assert redacted("https://SECRET PATH/x") == "https://…"
    assert redacted("SECRETQ") == "?://…"


def test_what_is_shown_of_a_rule_s_target_outside_notify_list():
    assert shown_target("webhook", "https://u:SECRETPASS@h.example:1/p?q=SECRETQ") == "https://h.example:1/…"
    assert shown_target("apprise", "tgram://SECRETPASS/CHAT") == "tgram://…"  # the host is the token
    assert shown_target("apprise", "mailto://u:SECRETPASS@mail.example") == "mailto://…"
    assert shown_target("command", "curl -H 'X-Token: SECRETQ' https://h/") == "command"


@pytest.mark.parametrize("kind, target", [("webhook", "ftp://hookuser:SECRETPASS@h/SECRETPATH?t=SECRETQ"),
                                          ("webhook", "https://hookuser:SECRETPASS@h:SECRETQ/SECRETPATH"),
                                          ("apprise", "SECRETPASS-SECRETQ")])
def test_a_refused_target_is_not_quoted_in_the_error(kind, target):
    with pytest.raises(BadInput) as caught:
        check_target(kind, target)
    assert not any(s in str(caught.value) for s in SECRETS), caught.value
    assert "give" in str(caught.value)  # still says what to give
