"""The executor journal contract, where the journal lives: an edge file (beside the runs) and a
worker's own journal file. A PostgreSQL database never holds it (migration 0015)."""

from __future__ import annotations

import secrets

import pytest

from qlactors.domain.receipt import token_hash
from qlactors.errors import BadInput, Conflict
from qlactors.ids import new_id
from qlactors.store.records import Identity

IDENTITY = Identity("boot", 100, 100, 5)


def accept(journal, attempt_id=None, run_id=None):
    attempt_id = attempt_id or new_id()
    assert journal.accept(attempt_id, run_id or new_id(), f"/logs/{attempt_id}", f"/receipts/{attempt_id}.json",
                          token_hash(secrets.token_urlsafe(32)))
    return attempt_id


def test_accept_journals_once(journal):
    attempt_id, run_id = new_id(), new_id()
    digest = token_hash(secrets.token_urlsafe(32))
    assert journal.accept(attempt_id, run_id, "/l", "/r", digest) is True
    entry = journal.get(attempt_id)
    assert (entry.run_id, entry.state, entry.log_path, entry.receipt_path) == (run_id, "accepted", "/l", "/r")
    assert entry.callback_token_hash == digest and entry.identity is None and entry.purge_after_ms is None
    journal.set_state(attempt_id, "launching")
    assert journal.accept(attempt_id, run_id, "/other", "/other", digest) is False  # launched: never twice
    assert journal.get(attempt_id).state == "launching"


def test_accept_of_a_re_offered_attempt_still_accepted_takes_the_new_token_hash(journal):
    attempt_id, run_id = new_id(), new_id()
    first, second = (token_hash(secrets.token_urlsafe(32)) for _ in range(2))
    assert journal.accept(attempt_id, run_id, "/l", "/r", first) is True
    assert journal.accept(attempt_id, run_id, "/l", "/r", second) is True
    entry = journal.get(attempt_id)
    assert (entry.state, entry.callback_token_hash, entry.log_path) == ("accepted", second, "/l")
    assert journal.get(new_id()) is None
    with pytest.raises(BadInput):
        journal.accept(new_id(), run_id, "/l", "/r", "raw-token-is-never-stored")


def test_set_state_is_guarded_by_the_expected_state(journal):
    attempt_id = accept(journal)
    launching = journal.set_state(attempt_id, "launching", expected="accepted")
    assert launching.state == "launching"
    with pytest.raises(Conflict):
        journal.set_state(attempt_id, "launching", expected="accepted")
    started = journal.set_state(attempt_id, "started", identity=IDENTITY, expected="launching")
    assert started.identity == IDENTITY
    assert journal.set_state(attempt_id, "completed").state == "completed"  # unguarded
    assert journal.get(attempt_id).identity == IDENTITY  # kept when not given
    with pytest.raises(Conflict):
        journal.set_state(new_id(), "started")
    with pytest.raises(BadInput):
        journal.set_state(attempt_id, "exploded")


def test_quarantine_and_due_purge(journal):
    early, late, other = accept(journal), accept(journal), accept(journal)
    assert journal.quarantine(late, 2_000).state == "quarantined"
    assert journal.quarantine(early, 1_000).purge_after_ms == 1_000
    assert [e.attempt_id for e in journal.due_purge(999, 10)] == []
    assert [e.attempt_id for e in journal.due_purge(1_500, 10)] == [early]
    assert [e.attempt_id for e in journal.due_purge(5_000, 10)] == [early, late]
    assert [e.attempt_id for e in journal.due_purge(5_000, 1)] == [early]
    assert other not in [e.attempt_id for e in journal.due_purge(10**12, 10)]
    with pytest.raises(Conflict):
        journal.quarantine(new_id(), 1)


def test_list_is_bounded_and_keyset_paged(journal):
    ids = sorted(accept(journal) for _ in range(5))
    journal.set_state(ids[1], "started", identity=IDENTITY)
    assert [e.attempt_id for e in journal.list(limit=2)] == ids[:2]
    assert [e.attempt_id for e in journal.list(limit=2, after=ids[1])] == ids[2:4]
    assert [e.attempt_id for e in journal.list(["accepted"], limit=10)] == ids[:1] + ids[2:]
    assert [e.attempt_id for e in journal.list(["started", "quarantined"], limit=10)] == [ids[1]]
    with pytest.raises(BadInput):
        journal.list(limit=0)
    with pytest.raises(BadInput):
        journal.list(["nope"])


def test_each_pages_through_every_row_while_the_caller_clears_them(journal):
    ids = sorted(accept(journal) for _ in range(7))
    journal.set_state(ids[3], "started", identity=IDENTITY)
    seen = []
    for entry in journal.walk(["accepted"], page=2):
        seen.append(entry.attempt_id)
        journal.clear(entry.attempt_id)  # as the Executor does with a dead instance's offers
    assert seen == ids[:3] + ids[4:]
    assert [e.attempt_id for e in journal.list(limit=10)] == [ids[3]]


def test_clear_removes_the_row(journal):
    attempt_id = accept(journal)
    assert journal.clear(attempt_id) is True
    assert journal.clear(attempt_id) is False
    assert journal.get(attempt_id) is None
