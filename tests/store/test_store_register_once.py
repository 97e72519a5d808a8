"""Register once (SEMANTICS.md §9), in the store, on SQLite and PostgreSQL: a Register repeated
with the same `register_id` — a re-sent copy, or the same Register reaching a second replica —
gets the same session, generation and secret and changes nothing; a repeated resume does not
rotate the secret again; a different register id behaves as a new Register."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select

from qlactors.store.dispatch.dispatch import Dispatch
from qlactors.store.engine import Store
from qlactors.store.records import Fenced
from qlactors.store.schema import worker_sessions
from store_helpers import new_hash
from session_steps import BOOT, LEASE_MS, beat, session_row

_WS = worker_sessions


def sessions_of(repo, worker_id="w1"):
    with repo.store.read() as conn:
        return conn.execute(select(_WS).where(_WS.c.worker_id == worker_id).order_by(_WS.c.generation)).all()


def register(dispatch, register_id, secret_hash, worker_id="w1", capacity=4):
    return dispatch.sessions.register(worker_id, capacity, boot_id=BOOT, labels=("gpu",),
                                     session_lease_ms=LEASE_MS, resume_secret_hash=secret_hash,
                                     register_id=register_id)


def resume(dispatch, session, quoted_hash, new_secret_hash, register_id, capacity=4):
    return dispatch.sessions.resume(session.worker_id, session.session_id, session.generation, quoted_hash,
                                   new_secret_hash, BOOT, capacity=capacity, labels=("gpu",),
                                   session_lease_ms=LEASE_MS, register_id=register_id)


def test_a_repeated_register_gets_the_same_session_and_changes_nothing(repo, dispatch):
    secret = new_hash()
    first = register(dispatch, "reg-1", secret)
    before = sessions_of(repo)
    again = register(dispatch, "reg-1", secret)
    assert (again.session_id, again.generation) == (first.session_id, 1)
    assert again.labels == first.labels and again.capacity == first.capacity
    assert sessions_of(repo) == before  # no generation 2, no version bump, the same secret hash
    (row,) = before
    assert (row.status, row.ended_at_ms, row.register_id, row.resume_secret_hash) == (
        "online", None, "reg-1", secret)
    assert not beat(dispatch, first, 1).session_ended


def test_a_late_copy_after_a_newer_register_gets_its_first_answer_and_ends_nothing(repo, dispatch):
    first = register(dispatch, "reg-1", new_hash())
    second = register(dispatch, "reg-2", new_hash())  # a different register id: generation + 1
    assert second.generation == 2
    before = sessions_of(repo)
    late = register(dispatch, "reg-1", new_hash())
    assert (late.session_id, late.generation) == (first.session_id, 1)
    assert sessions_of(repo) == before
    assert [r.status for r in before] == ["offline", "online"]
    assert not beat(dispatch, second, 1).session_ended  # the current session lives on


def test_two_replicas_racing_with_one_register_give_one_answer(repo, store_url):
    other = Store(store_url)  # the second replica's engine, on the same database
    try:
        dispatchers = [Dispatch.open(repo.store), Dispatch.open(other)]
        barrier, got, errors = threading.Barrier(2), [None, None], []
        secret = new_hash()

        def replica(i):
            barrier.wait()
            try:
                got[i] = register(dispatchers[i], "reg-1", secret)
            except Exception as err:  # reported below
                errors.append(err)

        threads = [threading.Thread(target=replica, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert got[0] == got[1] and got[0].generation == 1
        assert [(r.generation, r.status) for r in sessions_of(repo)] == [(1, "online")]
    finally:
        other.close()


def test_a_repeated_resume_gets_the_same_answer_and_rotates_the_secret_once(repo, dispatch):
    secret, rotated = new_hash(), new_hash()
    session = register(dispatch, "reg-1", secret)
    assert beat(dispatch, session, 2).renewed == ()
    resumed = resume(dispatch, session, secret, rotated, "reg-2", capacity=3)
    after_first = session_row(repo, session.session_id)
    assert (after_first.resume_secret_hash, after_first.resume_register_id) == (rotated, "reg-2")
    # The re-sent copy quotes the secret the first copy rotated away.
    again = resume(dispatch, session, secret, rotated, "reg-2", capacity=3)
    assert again == resumed and again.heartbeat_seq == 2
    assert session_row(repo, session.session_id) == after_first  # no second rotation, no change
    assert not beat(dispatch, session, 3).session_ended
    # The fallback a refused resume takes (a Register with the same id) ends nothing either.
    assert register(dispatch, "reg-1", new_hash()).session_id == session.session_id
    assert [r.status for r in sessions_of(repo)] == ["online"]


def test_a_resume_with_another_register_id_is_judged_as_a_new_resume(repo, dispatch):
    secret, rotated = new_hash(), new_hash()
    session = register(dispatch, "reg-1", secret)
    resume(dispatch, session, secret, rotated, "reg-2")
    before = session_row(repo, session.session_id)
    with pytest.raises(Fenced, match="^wrong_secret"):  # a new restart quoting the old secret
        resume(dispatch, session, secret, new_hash(), "reg-3")
    assert session_row(repo, session.session_id) == before
    third = new_hash()
    resume(dispatch, session, rotated, third, "reg-3")
    row = session_row(repo, session.session_id)
    assert (row.resume_secret_hash, row.resume_register_id, row.version) == (third, "reg-3", before.version + 1)


def test_a_repeat_of_a_refused_resume_is_refused_again(repo, dispatch):
    session = register(dispatch, "reg-1", new_hash())
    before = session_row(repo, session.session_id)
    for _ in range(2):
        with pytest.raises(Fenced, match="^wrong_secret"):
            resume(dispatch, session, new_hash(), new_hash(), "reg-2")
    assert session_row(repo, session.session_id) == before


def test_register_without_a_register_id_opens_a_new_generation_each_time(repo, dispatch):
    register(dispatch, None, new_hash())
    register(dispatch, None, new_hash())
    assert [(r.generation, r.register_id) for r in sessions_of(repo)] == [(1, None), (2, None)]


def test_a_register_id_is_checked(dispatch):
    from qlactors.errors import BadInput

    with pytest.raises(BadInput, match="register id"):
        register(dispatch, "x" * 65, new_hash())
