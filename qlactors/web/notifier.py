"""Web: delivering the notification outbox. `qlactors web` runs one Notifier thread: every
second it claims the rows whose time has come (store/admin/notifications.py), delivers each on a
small pool of its own (a slow or dead endpoint holds one delivery, never the others, never a
run), and records every try. Its claims name it (a deliverer id, its host and pid); it refreshes
its row every REFRESH_S and releases its claims when it stops. Delivery is at least once: a row
claimed by a process that died is claimed again once that process has not been seen for 30 s
(store/admin/notifications.py ALIVE_MS); a try still in flight when its claim was released or
taken is not recorded, and the row is sent again (with the same Idempotency-Key).

A webhook is an HTTP POST of the run's facts as JSON (domain/notify.py `RunFacts.document`); an
apprise URL goes through the `apprise` package (the chat and push services: Telegram, DingTalk,
WeCom, Bark, Slack, Discord, e-mail...) when it is installed (`pip install apprise`); a command
runs with the facts in its environment (QLACTORS_NOTIFY_*, beside PATH and HOME: never the web
process's own, which may hold the database URL), stdin /dev/null, its output dropped, in a
session of its own, whose whole process group is killed at its timeout.

A target is a secret (a password, a token in its path or query): logs and recorded tries show
it as `domain.notify.shown_target` does (`https://host:port/…`), never an exception's text that
may quote it, and the libraries apprise sends through are kept from logging at all (apprise and
urllib3 log the whole URL at DEBUG, and its path in their warnings).
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import unquote, urlsplit

from ..domain.notify import SIGNATURE_HEADER, TIMESTAMP_HEADER, lane, shown_target, signature
from ..ids import new_id
from ..store.admin.notifications import Due, Notifications

log = logging.getLogger("qlactors.notify")
POLL_S = 1.0
SEND_TIMEOUT_S = 10.0  # one socket operation
TRY_DEADLINE_S = 10.0  # a whole webhook try: connect, send, the answer read
MAX_ANSWER_BYTES = 64 * 1024  # what is read of a receiver's answer body
COMMAND_TIMEOUT_S = 30.0
CLAIM_BATCH = 16
# Loggers of the libraries apprise sends through, which quote a target's URL (its path and query,
# where a bot token lives) at DEBUG and in some warnings: never a record, at any level.
QUIET_LOGGERS = ("apprise", "urllib3", "requests")
REFRESH_S = 5.0  # how often a deliverer says it is alive (its claims hold 30 s past the last time)
STOP_WAIT_S = 2.0  # at stop, how long the tries in flight may take to be recorded before the release


class Notifier:
    def __init__(self, notifications: Notifications, *, page_url: str | None, workers: int = 4,
                 refresh_s: float = REFRESH_S) -> None:
        self.notifications, self.page_url = notifications, page_url
        self.owner, self.host, self.pid = new_id(), socket.gethostname(), os.getpid()
        self.refresh_s, self.next_refresh = refresh_s, 0.0
        self.registered = False  # its deliverer row was written at least once
        self.inflight = 0
        self.idle = threading.Condition()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="qlactors-notify")
        self.stopping = threading.Event()
        self.busy = threading.Semaphore(workers * 2)  # claimed and not yet recorded: bounded
        self.thread = threading.Thread(target=self._loop, name="qlactors-notifier", daemon=True)
        self.lanes: set[str] = set()  # the delivery lanes (targets' hosts) with a try in flight
        self.lock = threading.Lock()
        self.wake = threading.Event()  # a slot was freed after a claim that took all it asked for
        self.more_due = False

    def start(self) -> "Notifier":
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop claiming, let the tries in flight finish for up to STOP_WAIT_S (each is recorded),
        then release every claim this deliverer still holds: another takes them at once."""
        self.stopping.set()
        self.wake.set()
        self.thread.join(5)
        self.pool.shutdown(wait=False, cancel_futures=True)
        with self.idle:
            self.idle.wait_for(lambda: self.inflight == 0, STOP_WAIT_S)
        try:
            released = self.notifications.release(self.owner)
        except Exception as err:  # the database is down: they pass to another 30 s after the last refresh
            log.warning("event=notify_release_failed deliverer=%s error=%s", self.owner, type(err).__name__)
        else:
            log.info("event=notify_stopped deliverer=%s released=%d", self.owner, released)

    def refresh(self) -> None:
        """Say this deliverer is alive (its claims hold while it does), every `refresh_s`."""
        if time.monotonic() < self.next_refresh:
            return
        seen = self.notifications.heartbeat(self.owner, host=self.host, pid=self.pid)
        if not seen and self.registered:
            log.warning("event=notify_deliverer_presumed_dead deliverer=%s: registered again; a claim it "
                        "held may have passed to another deliverer (its try is then not recorded)", self.owner)
        self.registered = True
        self.next_refresh = time.monotonic() + self.refresh_s

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                self.refresh()
                claimed, asked = self.tick()
            except Exception as err:  # the database is down, say: try again next tick
                log.warning("notifications: %s", type(err).__name__)
                claimed, asked = 0, 1
            # A claim that took every slot it asked for leaves more due: claim again at once, and
            # again as each slot frees (a burst is delivered at the pool's pace, not one claim a
            # second); else the next second.
            self.more_due = asked > 0 and claimed == asked
            if self.more_due and claimed > 0:
                continue
            self.wake.wait(POLL_S)
            self.wake.clear()

    def tick(self) -> tuple[int, int]:
        """Claim what is due (as many as free delivery slots, none in a lane with a try in flight)
        and hand it to the pool; (claimed, asked)."""
        free = 0
        while free < CLAIM_BATCH and self.busy.acquire(blocking=False):
            free += 1
        if free == 0:
            return 0, 0
        try:
            with self.lock:
                busy = frozenset(self.lanes)
            due = self.notifications.claim_due(owner=self.owner, limit=free, page_url=self.page_url, busy=busy)
        except BaseException:
            due = []
            raise
        finally:
            for _ in range(free - len(due)):  # the slots no claimed row took (all, when it failed)
                self.busy.release()
        for item in due:
            with self.lock:
                self.lanes.add(lane(item.kind, item.target))
            self.pool.submit(self._deliver, item)
        return len(due), free

    def _deliver(self, due: Due) -> None:
        with self.idle:
            self.inflight += 1
        try:
            try:
                ok, detail = deliver(due)
            except Exception as err:  # a target the sender chokes on is a failed try, recorded
                ok, detail = False, f"not delivered: {type(err).__name__}"
            status = self.notifications.record_try(due, ok=ok, detail=detail)
            log.info("notification of run %s by rule %s to %s: %s (%s)", due.run_id, due.rule_id,
                     shown_target(due.kind, due.target), status or "claim released or taken meanwhile, not recorded",
                     detail)
        except Exception as err:  # the database: not recorded; it is tried again once the claim is free
            log.warning("notification of run %s: %s", due.run_id, type(err).__name__)
        finally:
            with self.lock:
                self.lanes.discard(lane(due.kind, due.target))
            self.busy.release()
            self.wake.set()  # its lane and its slot are free: what waits for either is claimed now
            with self.idle:
                self.inflight -= 1
                self.idle.notify_all()


def deliver(due: Due) -> tuple[bool, str]:
    """One try; (delivered, what happened in a few words)."""
    if due.kind == "webhook":
        return _webhook(due)
    if due.kind == "apprise":
        return _apprise(due)
    return _command(due)


def _webhook(due: Due) -> tuple[bool, str]:
    """One POST, the whole try within TRY_DEADLINE_S (a receiver that drips its answer a byte at a
    time holds nothing longer: the connection is shut at the deadline), no redirect followed (a
    3xx is a failed try: following it would turn the POST into an empty GET). The body and the
    `Idempotency-Key` header carry the outbox row's id, so a receiver can drop the duplicate a
    crash between a delivery and its record may cause. A rule with a secret signs the exact body
    bytes with the try's time (`domain.notify.signature`)."""
    body = json.dumps({**due.facts.document(), "notification_id": due.id}).encode()
    target = urlsplit(due.target)
    conn_class = http.client.HTTPSConnection if target.scheme == "https" else http.client.HTTPConnection
    conn = conn_class(target.hostname or "", target.port, timeout=SEND_TIMEOUT_S)
    path = (target.path or "/") + (f"?{target.query}" if target.query else "")
    headers = {"Content-Type": "application/json", "User-Agent": "qlactors", "Idempotency-Key": due.id}
    if due.secret is not None:
        timestamp = int(time.time())
        headers[TIMESTAMP_HEADER] = str(timestamp)
        headers[SIGNATURE_HEADER] = signature(due.secret, timestamp, body)
    if target.username is not None:
        token = base64.b64encode(f"{unquote(target.username)}:{unquote(target.password or '')}".encode())
        headers["Authorization"] = "Basic " + token.decode("ascii")
    expired = threading.Event()
    watchdog = threading.Timer(TRY_DEADLINE_S, _shut, (conn, expired))
    watchdog.start()
    status, failure = 0, ""
    try:
        conn.request("POST", path, body=body, headers=headers)
        answer = conn.getresponse()
        answer.read(MAX_ANSWER_BYTES)
        status = answer.status
    except (OSError, http.client.HTTPException) as err:
        failure = f"not delivered: {getattr(err, 'strerror', None) or type(err).__name__}"
    finally:
        watchdog.cancel()
        conn.close()
    if expired.is_set():  # cut at the deadline: whatever was read of the answer is no answer
        return False, f"not delivered within {TRY_DEADLINE_S:g} s"
    if failure:
        return False, failure
    if 300 <= status < 400:
        return False, f"HTTP {status} (a redirect is not followed: give the final URL)"
    return 200 <= status < 300, f"HTTP {status}"


def _shut(conn: http.client.HTTPConnection, expired: threading.Event) -> None:
    """The try's deadline: end its connection, so whatever it waits on returns at once."""
    expired.set()
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _apprise(due: Due) -> tuple[bool, str]:
    quiet_senders()
    try:
        import apprise
    except ImportError:
        return False, "apprise is not installed here (pip install apprise)"
    sender = apprise.Apprise()
    if not sender.add(due.target):
        return False, "apprise does not know this URL"
    facts = due.facts
    lines = [f"run {facts.run_id}: {facts.state}"] + ([facts.url] if facts.url else [])
    return (True, "sent") if sender.notify(title=facts.title(), body="\n".join(lines)) else (False, "apprise: not sent")


def quiet_senders() -> None:
    """Keep apprise and the HTTP library under it from logging (QUIET_LOGGERS): above CRITICAL,
    so not even a DEBUG root logger sees their records. Idempotent."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)


COMMAND_ENV = ("PATH", "HOME")  # what a command takes from the web process's environment


def _command(due: Due) -> tuple[bool, str]:
    env = {k: os.environ[k] for k in COMMAND_ENV if k in os.environ} | due.facts.environment()
    try:
        proc = subprocess.Popen(["/bin/sh", "-c", due.target], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError as err:
        return False, f"the command did not start: {err.strerror}"
    try:
        code = proc.wait(timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return False, f"the command ran past {COMMAND_TIMEOUT_S:g} s (its process group was killed)"
    return code == 0, f"exit {code}"


def _kill_group(proc: subprocess.Popen) -> None:
    """KILL the command's process group (its session's: the group id is its pid), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
