"""Register once on a replica (SEMANTICS.md §9 Register once, Revoked and retired): the control
side's `ClusterSessions` on a real store, both dialects. A Register or resume repeated with the
same `register_id` — re-sent, or reaching a second replica — gets the same Welcome (session,
generation, secret) and ends nothing; a resume of a worker whose key is no longer allowed, or of a
session revoked or retired after its drain, is not resumed."""

from __future__ import annotations

import functools
import secrets

import pytest
from sqlalchemy import select

from qlactors.control.session_policy import ClusterSessions
from qlactors.domain.resume_secret import resume_secret
from qlactors.store.dispatch.dispatch import Dispatch
from qlactors.store.engine import Store
from qlactors.store.schema import worker_sessions
from qlactors.store.admin.worker_keys import WorkerKeys
from qlactors.store.admin.worker_retirement import WorkerRetirement
from qlactors.wire import codec
from qlactors.wire import messages as m

KEY = b"s" * 40  # the replicas' shared secret key
BOOT = "boot-1"


def replica(dispatch) -> ClusterSessions:
    return ClusterSessions(dispatch, None, None, heartbeat_ms=10_000, session_lease_ms=60_000,
                           run_lease_ms=30_000, resume_secret=functools.partial(resume_secret, KEY))


def register_msg(register_id: str, resume: m.Welcome | None = None) -> m.Register:
    return m.Register(
        request_id=secrets.token_hex(8), register_id=register_id, worker_id="", capacity=2, boot_id=BOOT,
        labels=[], protocol_min=codec.VERSION, protocol_max=codec.VERSION, worker_clock_ms=1,
        resume_session_id=resume.session_id if resume else None,
        resume_generation=resume.session_generation if resume else None,
        resume_secret=resume.resume_secret if resume else None)


def rows(repo):
    with repo.store.read() as conn:
        return conn.execute(select(worker_sessions).order_by(worker_sessions.c.generation)).all()


@pytest.fixture
def allowed(repo):
    WorkerKeys(repo.store).allow("w1", "k" * 40)


@pytest.mark.usefixtures("allowed")
def test_a_repeated_register_gets_the_same_welcome_and_opens_no_second_session(repo, dispatch):
    control = replica(dispatch)
    msg = register_msg("reg-1")
    first = control.register(msg, "w1")
    before = rows(repo)
    again = control.register(msg, "w1")
    assert isinstance(first, m.Welcome) and again == first
    assert (first.session_generation, first.resumed) == (1, False)
    assert rows(repo) == before and [r.status for r in before] == ["online"]


@pytest.mark.usefixtures("allowed")
def test_the_same_register_on_a_second_replica_gets_the_same_welcome(repo, dispatch, store_url):
    other = Store(store_url)
    try:
        msg = register_msg("reg-1")
        first = replica(dispatch).register(msg, "w1")
        second = replica(Dispatch.open(other)).register(msg, "w1")
        assert second == first
        assert len(rows(repo)) == 1
    finally:
        other.close()


@pytest.mark.usefixtures("allowed")
def test_a_repeated_resume_gets_the_same_welcome_and_does_not_end_the_resumed_session(repo, dispatch):
    control = replica(dispatch)
    opened = control.register(register_msg("reg-1"), "w1")
    resume = register_msg("reg-2", resume=opened)  # the worker restarted within its lease
    resumed = control.register(resume, "w1")
    assert (resumed.session_id, resumed.session_generation, resumed.resumed) == (opened.session_id, 1, True)
    assert resumed.resume_secret != opened.resume_secret  # rotated, once
    before = rows(repo)
    again = control.register(resume, "w1")  # a re-sent copy quotes the secret the first rotated away
    assert again == resumed
    assert rows(repo) == before  # no generation 2, the resumed session still online
    assert [(r.generation, r.status) for r in before] == [(1, "online")]


@pytest.mark.usefixtures("allowed")
def test_a_new_register_id_after_a_session_exists_opens_the_next_generation(repo, dispatch):
    control = replica(dispatch)
    first = control.register(register_msg("reg-1"), "w1")
    second = control.register(register_msg("reg-2"), "w1")
    assert (second.session_generation, second.resumed) == (2, False)
    assert second.resume_secret != first.resume_secret
    assert [r.status for r in rows(repo)] == ["offline", "online"]


def test_a_resume_after_revoke_is_refused(repo, dispatch):
    keys = WorkerKeys(repo.store)
    keys.allow("w1", "k" * 40)
    control = replica(dispatch)
    opened = control.register(register_msg("reg-1"), "w1")
    assert dispatch.sessions.end("w1", opened.session_id, 1).result == "applied"  # drained (SIGTERM)
    keys.revoke("w1")  # this replica's allow-list cache still lets the worker in
    answer = control.register(register_msg("reg-2", resume=opened), "w1")
    assert isinstance(answer, str) and "not on the allow-list" in answer
    assert [(r.status, r.ended_by) for r in rows(repo)] == [("offline", "revoked")]


@pytest.mark.usefixtures("allowed")
def test_a_session_retired_after_its_drain_is_not_resumed(repo, dispatch):
    control = replica(dispatch)
    opened = control.register(register_msg("reg-1"), "w1")
    assert dispatch.sessions.end("w1", opened.session_id, 1).result == "applied"
    WorkerRetirement(repo.store).retire("w1")
    answer = control.register(register_msg("reg-2", resume=opened), "w1")
    assert (answer.session_generation, answer.resumed) == (2, False)  # a new session, never the old one
    assert [(r.status, r.ended_by) for r in rows(repo)] == [("offline", "retired"), ("online", None)]
