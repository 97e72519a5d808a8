"""The worker journal: lease facts, activation clock, offsets, pulls and the session row — on the
edge store (SQLite and PostgreSQL) and on a worker's own journal file."""

from __future__ import annotations

import os
import secrets
import sqlite3
import stat

import pytest

from qlactors.domain.receipt import token_hash
from qlactors.errors import BadInput, Conflict, SchemaError
from qlactors.ids import new_id
from qlactors.executor.journal.journal import Journal
from qlactors.executor.journal.file import JOURNAL_FILE, JOURNAL_VERSION, open_journal_file
from qlactors.executor.journal.records import LeaseFacts


def lease(generation=1, session_generation=1):
    return LeaseFacts(new_id(), generation, secrets.token_urlsafe(32), new_id(), session_generation)


def accept(journal, facts=None):
    attempt_id = new_id()
    assert journal.accept(attempt_id, new_id(), f"/logs/{attempt_id}.log", f"/r/{attempt_id}.json",
                          token_hash(secrets.token_urlsafe(32)), facts)
    return attempt_id


def test_accept_records_the_lease_facts_and_a_re_offer_replaces_them(journal):
    first, second = lease(), lease(generation=2)
    attempt_id = new_id()
    run_id = new_id()
    assert journal.accept(attempt_id, run_id, "/l", "/r", token_hash("a" * 43), first)
    assert journal.get(attempt_id).lease == first
    assert journal.accept(attempt_id, run_id, "/l", "/r", token_hash("b" * 43), second)  # still accepted
    assert journal.get(attempt_id).lease == second
    journal.set_state(attempt_id, "launching")
    assert not journal.accept(attempt_id, run_id, "/l", "/r", token_hash("c" * 43), lease(generation=3))
    assert journal.get(attempt_id).lease == second
    assert journal.get(accept(journal)).lease is None  # edge: no lease facts recorded


def test_lease_facts_are_checked():
    with pytest.raises(BadInput):
        LeaseFacts(new_id(), 0, "token", new_id(), 1)
    with pytest.raises(BadInput):
        LeaseFacts(new_id(), 1, "x" * 65, new_id(), 1)
    with pytest.raises(BadInput):
        LeaseFacts(new_id(), 1, "token", new_id(), True)


def test_rebind_records_the_new_lease(journal):
    attempt_id = accept(journal, lease())
    offer_id, token, session_id = new_id(), secrets.token_urlsafe(32), new_id()
    entry = journal.rebind(attempt_id, 4, offer_id, token, session_id, 2)
    assert entry.lease == LeaseFacts(offer_id, 4, token, session_id, 2)
    assert journal.get(attempt_id).lease == entry.lease
    with pytest.raises(Conflict):
        journal.rebind(new_id(), 4, offer_id, token, session_id, 2)


def test_activation_clock_and_timeout_intent(journal):
    attempt_id = accept(journal, lease())
    entry = journal.activated(attempt_id, 1_000, 31_000)
    assert (entry.activated_at_ms, entry.local_deadline_ms) == (1_000, 31_000)
    assert journal.activated(attempt_id, 2_000, None).local_deadline_ms is None  # no timeout
    with pytest.raises(BadInput):
        journal.activated(attempt_id, 5_000, 4_999)
    assert journal.get(attempt_id).timeout_intent_at_ms is None
    assert journal.timeout_intent(attempt_id, 40_000).timeout_intent_at_ms == 40_000
    assert journal.timeout_intent(attempt_id, 50_000).timeout_intent_at_ms == 40_000  # the first sticks
    with pytest.raises(Conflict):
        journal.timeout_intent(new_id(), 1)


def test_shipped_offset_moves_forward_only_and_never_past_the_final_offset(journal):
    attempt_id = accept(journal, lease())
    assert journal.get(attempt_id).shipped_offset == 0
    assert journal.shipped(attempt_id, 131072).shipped_offset == 131072
    assert journal.shipped(attempt_id, 100).shipped_offset == 131072  # an older ack
    assert journal.final_offset(attempt_id, 200000).final_offset == 200000
    assert journal.final_offset(attempt_id, 200000).final_offset == 200000  # the same again
    with pytest.raises(Conflict):
        journal.final_offset(attempt_id, 200001)
    with pytest.raises(Conflict):
        journal.shipped(attempt_id, 200001)
    assert journal.shipped(attempt_id, 200000).shipped_offset == 200000
    with pytest.raises(BadInput):
        journal.shipped(attempt_id, -1)
    other = accept(journal)
    journal.shipped(other, 10)
    with pytest.raises(Conflict):
        journal.final_offset(other, 9)  # before what was already acknowledged


def test_complete_and_due_logs(journal):
    shipped_all, behind, not_final, young = (accept(journal, lease()) for _ in range(4))
    for attempt_id, final, acked, purge in ((shipped_all, 10, 10, 100), (behind, 10, 5, 100),
                                            (not_final, None, 0, 100), (young, 0, 0, 10_000)):
        if final is not None:
            journal.final_offset(attempt_id, final)
        journal.shipped(attempt_id, acked)
        entry = journal.complete(attempt_id, purge)
        assert (entry.state, entry.purge_after_ms) == ("completed", purge)
    assert [e.attempt_id for e in journal.due_logs(1_000)] == [shipped_all]
    assert {e.attempt_id for e in journal.due_logs(10_000)} == {shipped_all, young}
    assert len(journal.due_logs(10_000, limit=1)) == 1


def test_walk_reads_every_in_flight_row_page_by_page(journal):
    ids = sorted(accept(journal) for _ in range(5))
    journal.set_state(ids[1], "launching")
    journal.set_state(ids[2], "completed")
    journal.quarantine(ids[3], 0)
    walked = [e.attempt_id for e in journal.walk(page=2)]
    assert walked == [ids[0], ids[1], ids[4]]
    assert [e.attempt_id for e in journal.walk(("completed",), page=1)] == [ids[2]]


def test_pull_journal_repeats_and_clears(journal):
    pull_id = new_id()
    pairs = [(new_id(), secrets.token_urlsafe(32)) for _ in range(3)]
    journal.journal_pull(pull_id, pairs)
    journal.journal_pull(pull_id, pairs)  # repeated before a resend: no change
    later = new_id()
    journal.journal_pull(later, [(new_id(), secrets.token_urlsafe(32))])
    pulls = journal.open_pulls()
    assert [p.pull_id for p in pulls] in ([pull_id, later], [later, pull_id])  # same millisecond
    first = next(p for p in pulls if p.pull_id == pull_id)
    assert sorted(first.pairs) == sorted(pairs)
    with pytest.raises(Conflict):
        journal.journal_pull(new_id(), [pairs[0]])  # an offer id of another pull
    with pytest.raises(BadInput):
        journal.journal_pull(new_id(), [])
    assert journal.clear_offer(pairs[0][0]) is True
    assert journal.clear_offer(pairs[0][0]) is False
    assert sorted(next(p for p in journal.open_pulls() if p.pull_id == pull_id).pairs) == sorted(pairs[1:])
    assert journal.clear_pull(pull_id) == 2
    assert [p.pull_id for p in journal.open_pulls()] == [later]


def test_session_row_is_saved_and_replaced(journal):
    assert journal.saved_session() is None
    journal.save_session("w1", "s-1", 1, "secret-one", "boot-a")
    saved = journal.saved_session()
    assert (saved.worker_id, saved.session_id, saved.generation, saved.resume_secret, saved.boot_id) == (
        "w1", "s-1", 1, "secret-one", "boot-a")
    journal.save_session("w1", "s-2", 2, "secret-two", "boot-b")
    saved = journal.saved_session()
    assert (saved.session_id, saved.generation, saved.resume_secret, saved.boot_id) == (
        "s-2", 2, "secret-two", "boot-b")
    journal.save_session("w2", "s-9", 1, "secret-nine", "boot-b")  # the allow-list renamed it
    assert journal.saved_session().worker_id == "w2"
    with pytest.raises(BadInput):
        journal.save_session("w1", "s-3", 0, "secret", "boot")


# -- the journal file ---------------------------------------------------------------------------

def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_journal_file_is_private_and_holds_only_the_journal_tables(tmp_path):
    old = os.umask(0o022)
    try:
        store = open_journal_file(tmp_path)
        Journal(store).accept(new_id(), new_id(), "/l", "/r", token_hash("t" * 43))
    finally:
        os.umask(old)
    path = tmp_path / JOURNAL_FILE
    companions = [p for p in (path, tmp_path / (JOURNAL_FILE + "-wal"), tmp_path / (JOURNAL_FILE + "-shm"))
                  if p.exists()]
    assert len(companions) == 3  # WAL mode: the -wal and -shm exist while it is open
    assert {_mode(p) for p in companions} == {0o600}
    store.close()
    with sqlite3.connect(path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert tables == {"executor_journal", "executor_pulls", "executor_session", "executor_owed"}
        assert conn.execute("PRAGMA user_version").fetchone()[0] == JOURNAL_VERSION
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_journal_file_reopens_with_its_rows(tmp_path):
    store = open_journal_file(tmp_path)
    attempt_id = new_id()
    Journal(store).accept(attempt_id, new_id(), "/l", "/r", token_hash("t" * 43), lease())
    store.close()
    store = open_journal_file(tmp_path)
    try:
        assert Journal(store).get(attempt_id).lease is not None
    finally:
        store.close()


def test_a_newer_journal_file_is_refused_untouched(tmp_path):
    open_journal_file(tmp_path).close()
    path = tmp_path / JOURNAL_FILE
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {JOURNAL_VERSION + 1}")
    before = path.read_bytes()
    with pytest.raises(SchemaError, match="newer"):
        open_journal_file(tmp_path)
    assert path.read_bytes() == before


def test_a_foreign_database_is_refused(tmp_path):
    with sqlite3.connect(tmp_path / JOURNAL_FILE) as conn:
        conn.execute("CREATE TABLE runs (id TEXT)")
    with pytest.raises(SchemaError, match="not a qlactors worker journal"):
        open_journal_file(tmp_path)


def test_an_owed_report_is_kept_until_settled_and_its_rows_row_waits_for_it(journal):
    attempt_id = accept(journal, lease())
    journal.owe("req-1", "started", attempt_id, b"\x81\xa4kind\xa7started")
    journal.owe("req-1", "started", attempt_id, b"\x81\xa4kind\xa7started")  # the same again: a no-op
    journal.owe("req-2", "attest", attempt_id, b"\x81\xa4kind\xa6attest")
    assert [(r.request_id, r.kind, r.attempt_id) for r in journal.owed()] == [
        ("req-1", "started", attempt_id), ("req-2", "attest", attempt_id)]
    assert not journal.clear(attempt_id)  # owed: hidden, not deleted
    assert journal.get(attempt_id) is None and journal.list() == [] and list(journal.walk()) == []
    assert journal.settle("req-1").request_id == "req-1"
    assert journal.settle("req-1") is None  # a second answer finds nothing owed
    assert journal.owes("req-2") is not None
    assert journal.settle("req-2").kind == "attest"
    assert journal.owed() == []
    # The last answer took the hidden row with it: the attempt can be journalled afresh.
    assert journal.accept(attempt_id, new_id(), "/l", "/r", token_hash("d" * 43), lease())
    assert journal.get(attempt_id).state == "accepted"


def test_a_re_offer_takes_back_a_row_waiting_for_its_give_back(journal):
    attempt_id = accept(journal, lease())
    journal.owe("give-back", "attest", attempt_id, b"\x80")
    journal.clear(attempt_id)
    assert journal.get(attempt_id) is None
    again = lease(generation=2)
    assert journal.accept(attempt_id, new_id(), "/l", "/r", token_hash("e" * 43), again)
    assert journal.get(attempt_id).lease == again
    journal.settle("give-back")  # the old lease's give-back answered: the re-offered row stays
    assert journal.get(attempt_id).lease == again


def test_a_version_1_journal_file_is_upgraded_in_place_keeping_its_rows(tmp_path):
    path = tmp_path / JOURNAL_FILE
    store = open_journal_file(tmp_path)
    attempt_id = accept(Journal(store), lease())
    store.close()
    with sqlite3.connect(path) as conn:  # as version 1 left it: no owed reports, no clear_pending
        conn.execute("DROP TABLE executor_owed")
        conn.execute("ALTER TABLE executor_journal DROP COLUMN clear_pending")
        conn.execute("PRAGMA user_version = 1")
    store = open_journal_file(tmp_path)
    try:
        journal = Journal(store)
        assert journal.get(attempt_id).state == "accepted"
        journal.owe("r", "attest", attempt_id, b"\x80")
        assert [r.request_id for r in journal.owed()] == ["r"]
    finally:
        store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == JOURNAL_VERSION == 2
