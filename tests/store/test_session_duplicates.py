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
from qlactors.store.dispatch.session_rules import DUPLICATE, DUPLICATE_WORKER, duplicate_verdict
from qlactors.store.admin.workers import Workers
from store_helpers import new_hash

LEASE = 45_000


def row(generation: int, created: int, *, ended: int | None = None, expires: int | None = None,
        status: str | None = None, note: str | None = None, drained: int | None = None, ended_by=None):
    return SimpleNamespace(generation=generation, created_at_ms=created, ended_at_ms=ended,
                           lease_expires_at_ms=created + LEASE if expires is None else expires,
                           status=status or ("online" if ended is None else "offline"), note=note,
                           drained_at_ms=drained, ended_by=ended_by)


def test_a_register_that_names_no_lost_session_is_never_a_duplicate():
    """A fresh process (a first start, a restart with a new state_dir, a crash loop) names none."""
    assert duplicate_verdict(None, None, 1_000, LEASE) is None
    assert duplicate_verdict(None, row(2, 90_000), 100_000, LEASE) is None
    taken = row(1, 0, ended=90_000, expires=120_000)
    assert duplicate_verdict(taken, row(2, 90_000), 100_000, None) is None  # edge: no lease
    assert duplicate_verdict(taken, None, 100_000, LEASE) is None  # it is no longer the newest's


def test_a_process_whose_live_session_was_taken_from_it_coming_back_is_a_duplicate():
    taken = row(1, 0, ended=90_000, expires=120_000)  # live when it was ended at 90 s
    newest = row(2, 90_000)
    assert duplicate_verdict(taken, newest, 100_000, LEASE) == DUPLICATE
    assert duplicate_verdict(taken, newest, 90_000 + LEASE, LEASE) is None  # older than a lease
    assert duplicate_verdict(taken, row(2, 90_000, ended=95_000), 100_000, LEASE) is None  # the other gone
    expired = row(1, 0, ended=90_000, expires=80_000)
    assert duplicate_verdict(expired, newest, 100_000, LEASE) is None  # it had expired: nobody held it
    drained = row(1, 0, ended=90_000, expires=120_000, drained=85_000)
    assert duplicate_verdict(drained, newest, 100_000, LEASE) is None  # a planned stop
    revoked = row(1, 0, ended=90_000, expires=120_000, ended_by="revoked")
    assert duplicate_verdict(revoked, newest, 100_000, LEASE) is None


def test_the_other_process_coming_back_to_a_noted_session_is_refused_within_a_lease():
    taken = row(2, 90_000, ended=100_000, expires=135_000)
    noted = row(3, 100_000, note=DUPLICATE)
    assert duplicate_verdict(taken, noted, 110_000, LEASE) == DUPLICATE_WORKER
    assert duplicate_verdict(taken, noted, 100_000 + LEASE, LEASE) is None


# -- the store ----------------------------------------------------------------------------------


def _register(dispatch, boot: str, lost=None, *, register_id=None):
    return dispatch.sessions.register("w1", 2, boot_id=boot, session_lease_ms=LEASE,
                                     resume_secret_hash=new_hash(), require_key=False,
                                     lost_session_id=None if lost is None else lost.session_id,
                                     register_id=register_id)


def test_two_processes_alternating_are_caught_when_each_names_its_lost_session(dispatch, repo):
    a1 = _register(dispatch, "host-a")
    b = _register(dispatch, "host-b")  # the newcomer takes the session (as a restart would)
    assert (b.generation, b.note) == (2, None)
    a2 = _register(dispatch, "host-a", a1)  # the first comes back naming the session taken from it
    assert (a2.generation, a2.note) == (3, DUPLICATE)
    with pytest.raises(Fenced, match=f"^{DUPLICATE_WORKER}: another live process"):
        _register(dispatch, "host-b", b)
    [shown] = Workers(repo.store).list().workers
    assert (shown.generation, shown.state, shown.to_json()["note"]) == (3, "online (duplicate key)", DUPLICATE)


def test_a_crash_loop_of_fresh_processes_is_never_a_duplicate(dispatch, repo):
    """Restarts that register afresh (a new state_dir each time), many within one session lease."""
    sessions = [_register(dispatch, "host-a") for _ in range(5)]
    assert [(s.generation, s.note) for s in sessions] == [(g, None) for g in range(1, 6)]
    rebooted = _register(dispatch, "host-b", sessions[-1])  # names its own session: a reboot, refused resume
    assert (rebooted.generation, rebooted.note) == (6, None)


def test_a_repeat_of_the_register_that_found_the_duplicate_is_not_reported_again(dispatch, repo):
    a1 = _register(dispatch, "host-a")
    _register(dispatch, "host-b")
    first = _register(dispatch, "host-a", a1, register_id="r-1")
    again = _register(dispatch, "host-a", a1, register_id="r-1")
    assert (first.note, again.note, again.session_id) == (DUPLICATE, None, first.session_id)


def test_a_restart_after_a_session_expired_takes_over_at_once(dispatch, repo):
    first = _register(dispatch, "host-a")
    with repo.store.write() as conn:
        conn.execute(update(worker_sessions).values(lease_expires_at_ms=1))
    again = _register(dispatch, "host-a", first)
    assert (again.generation, again.note) == (2, None)
    assert _register(dispatch, "host-b").note is None  # a takeover by a fresh process
