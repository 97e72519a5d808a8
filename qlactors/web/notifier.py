"""Web: delivering the notification outbox. `qlactors web` runs one Notifier thread: every
second it claims the rows whose time has come (store/admin/notifications.py), delivers each on a
small pool of its own (a slow or dead endpoint holds one delivery, never the others, never a
run), and records every try. Delivery is at least once: a row claimed by a process that died is
claimed again after its claim runs out.

A webhook is an HTTP POST of the run's facts as JSON (domain/notify.py `RunFacts.document`); an
apprise URL goes through the `apprise` package (the chat and push services: Telegram, DingTalk,
WeCom, Bark, Slack, Discord, e-mail...) when it is installed (`pip install apprise`); a command
runs with the facts in its environment (QLACTORS_NOTIFY_*, beside PATH and HOME: never the web
process's own, which may hold the database URL), stdin /dev/null, its output dropped, in a
session of its own, whose whole process group is killed at its timeout.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from ..store.admin.notifications import Due, Notifications

log = logging.getLogger("qlactors.notify")
POLL_S = 1.0
SEND_TIMEOUT_S = 10.0
COMMAND_TIMEOUT_S = 30.0
CLAIM_BATCH = 16


class Notifier:
    def __init__(self, notifications: Notifications, *, page_url: str | None, workers: int = 4) -> None:
        self.notifications, self.page_url = notifications, page_url
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="qlactors-notify")
        self.stopping = threading.Event()
        self.busy = threading.Semaphore(workers * 2)  # claimed and not yet recorded: bounded
        self.thread = threading.Thread(target=self._loop, name="qlactors-notifier", daemon=True)

    def start(self) -> "Notifier":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                self.tick()
            except Exception as err:  # the database is down, say: try again next tick
                log.warning("notifications: %s", type(err).__name__)
            self.stopping.wait(POLL_S)

    def tick(self) -> int:
        """Claim what is due (as many as free delivery slots) and hand it to the pool."""
        free = 0
        while free < CLAIM_BATCH and self.busy.acquire(blocking=False):
            free += 1
        if free == 0:
            return 0
        try:
            due = self.notifications.claim_due(limit=free, page_url=self.page_url)
        except BaseException:
            due = []
            raise
        finally:
            for _ in range(free - len(due)):  # the slots no claimed row took (all, when it failed)
                self.busy.release()
        for item in due:
            self.pool.submit(self._deliver, item)
        return len(due)

    def _deliver(self, due: Due) -> None:
        try:
            try:
                ok, detail = deliver(due)
            except Exception as err:  # a target the sender chokes on is a failed try, recorded
                ok, detail = False, f"not delivered: {type(err).__name__}"
            status = self.notifications.record_try(due, ok=ok, detail=detail)
            log.info("notification of run %s by rule %s: %s", due.run_id, due.rule_id,
                     status or "claim lost meanwhile, not recorded")
        except Exception as err:  # the database: not recorded; the claim runs out and it is tried again
            log.warning("notification of run %s: %s", due.run_id, type(err).__name__)
        finally:
            self.busy.release()


def deliver(due: Due) -> tuple[bool, str]:
    """One try; (delivered, what happened in a few words)."""
    if due.kind == "webhook":
        return _webhook(due)
    if due.kind == "apprise":
        return _apprise(due)
    return _command(due)


def _webhook(due: Due) -> tuple[bool, str]:
    body = json.dumps(due.facts.document()).encode()
    request = urllib.request.Request(due.target, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "qlactors"})
    try:
        with urllib.request.urlopen(request, timeout=SEND_TIMEOUT_S) as answer:
            return 200 <= answer.status < 300, f"HTTP {answer.status}"
    except urllib.error.HTTPError as err:
        return False, f"HTTP {err.code}"
    except (urllib.error.URLError, OSError) as err:
        return False, f"not delivered: {getattr(err, 'reason', err)}"


def _apprise(due: Due) -> tuple[bool, str]:
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
