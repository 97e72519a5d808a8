"""Notifications, pure (domain/notify.py): the states a rule names, its targets, the document and
environment a run's facts become (nothing but the facts), and the backoff between tries."""

from __future__ import annotations

import pytest

from qlactors.domain.notify import (FIRST_RETRY_MS, MAX_RETRY_MS, MAX_TRIES, RunFacts, check_on_states,
                                    check_target, next_try_delay_ms)
from qlactors.errors import BadInput


def test_states_are_terminal_ones_each_once():
    assert check_on_states("failed, timed_out,failed") == ("failed", "timed_out")
    for bad in ("", ",", "running", "failed,queued"):
        with pytest.raises(BadInput):
            check_on_states(bad)


def test_targets():
    assert check_target("webhook", "https://h.example/x") == "https://h.example/x"
    assert check_target("apprise", "tgram://a/b") == "tgram://a/b"
    assert check_target("command", "logger hi") == "logger hi"
    for kind, target in (("webhook", "ftp://x"), ("webhook", "http://"), ("apprise", "plain"),
                         ("command", " "), ("command", "x\0y"), ("pager", "x"), ("command", "x" * 5000)):
        with pytest.raises(BadInput):
            check_target(kind, target)


def test_the_document_and_environment_carry_the_facts_only():
    facts = RunFacts("backup", "r1", "failed", 7, None, 1, 2, 3, "http://h/#run=r1", attempt=2)
    assert facts.document() == {"event": "run.finished", "task": "backup", "run_id": "r1", "state": "failed",
                                "attempt": 2, "exit_code": 7, "error_code": None, "created_at_ms": 1, "started_at_ms": 2,
                                "finished_at_ms": 3, "url": "http://h/#run=r1"}
    env = facts.environment()
    assert env["QLACTORS_NOTIFY_TASK"] == "backup" and env["QLACTORS_NOTIFY_EXIT_CODE"] == "7"
    assert env["QLACTORS_NOTIFY_ERROR_CODE"] == "" and "QLACTORS_NOTIFY_EVENT" not in env
    assert env["QLACTORS_NOTIFY_ATTEMPT"] == "2"
    assert facts.title() == "qlactors: backup failed (exit 7)"


def test_backoff_doubles_to_its_ceiling_and_ends():
    delays = [next_try_delay_ms(n) for n in range(1, MAX_TRIES + 1)]
    assert delays[0] == FIRST_RETRY_MS and delays[1] == 2 * FIRST_RETRY_MS
    assert max(d for d in delays if d is not None) == MAX_RETRY_MS
    assert delays[-1] is None and all(d is not None for d in delays[:-1])


def test_a_webhook_secret_is_one_line_and_signs_the_timestamp_with_the_exact_body():
    from qlactors.domain.notify import check_secret, signature

    assert check_secret("webhook", "s3cret") == "s3cret"
    for kind, secret in (("command", "s3cret"), ("apprise", "s3cret"), ("webhook", ""), ("webhook", "a\nb"),
                         ("webhook", "x" * 1025), ("webhook", "a\0b")):
        with pytest.raises(BadInput):
            check_secret(kind, secret)
    # The timestamp is part of what is signed: the same body at another time has another signature.
    assert signature("Jefe", 0, b"what do ya want for nothing?") != signature("Jefe", 1, b"what do ya want for nothing?")
    assert signature("Jefe", 0, b"") == "sha256=" + __import__("hmac").new(b"Jefe", b"0.", "sha256").hexdigest()
