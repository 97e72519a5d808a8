"""Two live processes presenting one worker's key (issue 18 item 5): the rule alone, then the
store on SQLite and PostgreSQL. A restart takes a session over once; the flip-flop of two live
processes is the duplicate: the process that held the key before takes it back (noted), the
other is refused at its next Register."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from sqlalchemy import update

from qlactors.store.records import Fenced
from qlactors.store.schema import worker_sessions
from qlactors.store.session_rules import DUPLICATE, DUPLICATE_WORKER, duplicate_verdict
from qlactors.store.workers import Workers
from store_helpers import new_hash

LEASE = 45_000


def row(generation: int, created: int, *, ended: int | None = None, expires: int | None = None,
        status: str | None = None, note: str | None = None, drained: int | None = None, ended_by=None):
    return SimpleNamespace(generation=generation, created_at_ms=created, ended_at_ms=ended,
                           lease_expires_at_ms=created + LEASE if expires is None else expires,
                           status=status or ("online" if ended is None else "offline"), note=note,
                           drained_at_ms=drained, ended_by=ended_by)


def test_a_first_register_and_a_restart_taking_a_session_over_once_are_no_duplicate():
    assert duplicate_verdict(None, None, 1_000, LEASE) is None
    old = row(1, 0, expires=200_000)  # held for long, still live: its process was killed
    assert duplicate_verdict(old, None, 100_000, LEASE) is None  # a restart (or the newcomer) takes it over
    young = row(1, 90_000)  # young, but it took nothing over (the worker's first session)
    assert duplicate_verdict(young, None, 100_000, LEASE) is None
    assert duplicate_verdict(row(2, 0, expires=10), row(1, 0), 100_000, LEASE) is None  # expired
    assert duplicate_verdict(row(2, 90_000), row(1, 0), 100_000, None) is None  # edge: no lease


def test_a_register_that_finds_a_young_live_session_taken_from_a_live_one_is_a_duplicate():
    taken = row(1, 0, ended=90_000, expires=120_000)  # live when it was ended at 90 s
    newest = row(2, 90_000)
    assert duplicate_verdict(newest, taken, 100_000, LEASE) == DUPLICATE
    assert duplicate_verdict(newest, taken, 90_000 + LEASE, LEASE) is None  # older than a lease: a takeover
    expired = row(1, 0, ended=90_000, expires=80_000)
    assert duplicate_verdict(newest, expired, 100_000, LEASE) is None  # it had expired: a restart
    drained = row(1, 0, ended=90_000, expires=120_000, drained=85_000)
    assert duplicate_verdict(newest, drained, 100_000, LEASE) is None  # a planned stop
    revoked = row(1, 0, ended=90_000, expires=120_000, ended_by="revoked")
    assert duplicate_verdict(newest, revoked, 100_000, LEASE) is None


def test_the_other_process_coming_back_to_a_noted_session_is_refused_within_a_lease():
    noted = row(3, 100_000, note=DUPLICATE)
    assert duplicate_verdict(noted, None, 110_000, LEASE) == DUPLICATE_WORKER
    assert duplicate_verdict(noted, None, 100_000 + LEASE, LEASE) is None


# -- the store ----------------------------------------------------------------------------------


def _register(dispatch, boot: str):
    return dispatch.register_session("w1", 2, boot_id=boot, session_lease_ms=LEASE,
                                     resume_secret_hash=new_hash(), require_key=False)


def test_two_processes_alternating_are_caught_at_the_second_takeover_and_the_newcomer_refused(dispatch, repo):
    a1 = _register(dispatch, "host-a")
    b = _register(dispatch, "host-b")  # the newcomer takes the session (as a restart would)
    assert (b.generation, b.note) == (2, None)
    a2 = _register(dispatch, "host-a")  # the first comes back: two live processes
    assert (a2.generation, a2.note) == (3, DUPLICATE)
    with pytest.raises(Fenced, match=f"^{DUPLICATE_WORKER}: another live process"):
        _register(dispatch, "host-b")
    [shown] = Workers(repo.store).list().workers
    assert (shown.generation, shown.state, shown.to_json()["note"]) == (3, "online (duplicate key)", DUPLICATE)
    assert a1.generation == 1


def test_a_restart_after_a_session_expired_takes_over_at_once(dispatch, repo):
    _register(dispatch, "host-a")
    with repo.store.write() as conn:
        conn.execute(update(worker_sessions).values(lease_expires_at_ms=1))
    again = _register(dispatch, "host-a")
    assert (again.generation, again.note) == (2, None)
    assert _register(dispatch, "host-b").note is None  # a takeover of a session that took nothing over
