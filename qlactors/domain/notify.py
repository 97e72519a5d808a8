"""Notifications, pure: which states a rule may name, the document a webhook receives (never a
command, an environment value or output) and its signature, the environment a notification
command gets, and the backoff between tries of one delivery."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..errors import BadInput
from .states import RunStatus

KINDS = ("webhook", "apprise", "command")
# What a rule may ask about: a run reaching a terminal state; becoming `lost` (its attempt can no
# longer be vouched for; the run is then retried or ends failed, SEMANTICS.md §2); or `recovered`,
# a success after a failed or timed-out run of the same task (the first good news after bad).
RULE_STATES = (*(s.value for s in RunStatus if s.terminal), RunStatus.LOST.value, "recovered")
DEFAULT_ON = ("failed", "timed_out", "lost")
FIRST_RETRY_MS = 5_000
MAX_RETRY_MS = 15 * 60_000
MAX_TRIES = 20  # about 4 hours of tries in all, then the row is given up (and says so)
MAX_SECRET_CHARS = 1024
SIGNATURE_HEADER = "X-Qlactors-Signature"
TIMESTAMP_HEADER = "X-Qlactors-Timestamp"


def check_on_states(text: str) -> tuple[str, ...]:
    """`failed,timed_out` -> ('failed', 'timed_out'); each a terminal state or `recovered`, none twice."""
    states = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [s for s in states if s not in RULE_STATES]
    if not states or unknown:
        raise BadInput(f"--on {text!r}: give states separated by commas, from "
                       f"{', '.join(RULE_STATES)}; nothing was written")
    return states


def check_target(kind: str, target: str) -> str:
    """A webhook is an http(s) URL; an apprise target is an apprise URL (`tgram://...`,
    `mailto://...`: docs/web.md); a command is a shell string."""
    if kind not in KINDS:
        raise BadInput(f"unknown notification kind {kind!r}: one of {', '.join(KINDS)}")
    if not isinstance(target, str) or not target.strip() or len(target) > 4096 or "\0" in target:
        raise BadInput(f"--{kind}: give a non-empty value of at most 4096 characters; nothing was written")
    if kind == "webhook":
        parts = urlsplit(target)
        try:
            parts.port  # noqa: B018 (raises ValueError for a port that is no number)
        except ValueError:
            parts = parts._replace(netloc="")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BadInput(f"--webhook {redacted(target)}: give an http:// or https:// URL; nothing was written")
    if kind == "apprise" and "://" not in target:
        raise BadInput("--apprise: give an apprise URL such as tgram://BOT_TOKEN/CHAT_ID; nothing was written")
    return target


def check_secret(kind: str, secret: str) -> str:
    """A webhook's signing secret: 1..1024 characters, no NUL and no line break (it is read from a
    file or stdin: one trailing newline is the caller's to strip); only a webhook is signed."""
    if kind != "webhook":
        raise BadInput(f"--secret-file signs a webhook only, not a {kind} rule; nothing was written")
    if not secret or len(secret) > MAX_SECRET_CHARS or any(c in secret for c in "\0\r\n"):
        raise BadInput(f"the signing secret must be 1 to {MAX_SECRET_CHARS} characters on one line "
                       "(no NUL); nothing was written")
    return secret


def signature(secret: str, timestamp_s: int, body: bytes) -> str:
    """The `X-Qlactors-Signature` value of a webhook POST sent at `timestamp_s` (its
    `X-Qlactors-Timestamp`, whole Unix seconds): `sha256=` and the hex HMAC-SHA256, keyed by the
    rule's secret (UTF-8), of the timestamp's decimal digits, a dot, and the exact body bytes. The
    timestamp is signed so that a receiver can refuse an old POST replayed to it."""
    mac = hmac.new(secret.encode("utf-8"), str(timestamp_s).encode("ascii") + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What a notification tells about a run: nothing else ever leaves."""

    task: str
    run_id: str
    state: str
    exit_code: int | None
    error_code: str | None
    created_at_ms: int | None
    started_at_ms: int | None
    finished_at_ms: int | None
    url: str | None
    attempt: int | None = None  # the number of the attempt that ended (or became lost); None: none ran

    def document(self) -> dict[str, Any]:
        """The webhook's JSON body (docs/web.md "Notifications"): the facts as the transition left
        them (copied into the outbox row with it), whatever became of the run since."""
        return {"event": "run.finished", "task": self.task, "run_id": self.run_id, "state": self.state,
                "attempt": self.attempt, "exit_code": self.exit_code, "error_code": self.error_code,
                "created_at_ms": self.created_at_ms, "started_at_ms": self.started_at_ms,
                "finished_at_ms": self.finished_at_ms, "url": self.url}

    def environment(self) -> dict[str, str]:
        """A notification command's environment additions (QLACTORS_NOTIFY_*)."""
        return {f"QLACTORS_NOTIFY_{k.upper()}": "" if v is None else str(v)
                for k, v in self.document().items() if k != "event"}

    def title(self) -> str:
        code = f" (exit {self.exit_code})" if self.exit_code is not None else (
            f" ({self.error_code})" if self.error_code else "")
        return f"qlactors: {self.task} {self.state}{code}"


def next_try_delay_ms(tries: int) -> int | None:
    """After `tries` failed tries, how long until the next; None: give up."""
    if tries >= MAX_TRIES:
        return None
    return min(FIRST_RETRY_MS * 2 ** max(tries - 1, 0), MAX_RETRY_MS)


def redacted(target: str) -> str:
    """A target URL as logs and messages show it: `scheme://host[:port]/…`, never its userinfo,
    path, query or fragment (where a password, a token or a signed key lives). A URL that cannot be
    parsed shows its scheme only."""
    scheme, sep, _rest = target.partition("://")
    scheme = scheme.lower() if sep and scheme.isascii() and scheme.replace("+", "").replace("-", "").replace(
        ".", "").isalnum() else "?"
    try:
        parts = urlsplit(target)
        host = parts.hostname or ""
    except ValueError:  # an unbalanced IPv6 bracket, say
        return f"{scheme}://…"
    try:
        port = parts.port
    except ValueError:  # a port that is no number (often a secret: tgram://BOT_ID:SECRET/...)
        port = None
    if not host or not all(c.isalnum() or c in ".-_:" for c in host):
        return f"{scheme}://…"
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}{'' if port is None else f':{port}'}/…"


def shown_target(kind: str, target: str) -> str:
    """What anything but `notify list` shows of a rule's target (logs, `show`, error messages): a
    command is `command` (its words may hold a secret); a webhook its `redacted` URL; an apprise
    URL its scheme only, since many services keep the secret where the host goes
    (`tgram://BOT_TOKEN/CHAT_ID`, `discord://ID/TOKEN`)."""
    if kind == "command":
        return "command"
    if kind == "apprise":
        return redacted(target).partition("://")[0] + "://…"
    return redacted(target)


def lane(kind: str, target: str) -> str:
    """What one delivery occupies while it runs: a webhook's or an apprise URL's host (one dead
    endpoint holds its own lane, never another's), a command's own text."""
    if kind == "command":
        return "command:" + target
    from urllib.parse import urlsplit

    parts = urlsplit(target)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{parts.port or ''}"
