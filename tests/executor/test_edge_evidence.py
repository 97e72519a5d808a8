"""Edge's executor-side evidence for Recovery (executor/edge_evidence.py, the runtime/ports.py
LocalEvidence port): real journal file, real receipt files, a real process."""

from __future__ import annotations

import os
import secrets
import subprocess
import uuid

import pytest

from qlactors.domain.receipt import Receipt, encode_receipt, token_hash
from qlactors.executor.edge_evidence import EdgeEvidence
from qlactors.executor.journal.file import open_journal_file
from qlactors.executor.journal.journal import Journal
from qlactors.executor.local_receipts import LocalReceipts
from qlactors.ids import new_id
from qlactors.process.identity import read_boot_id, read_identity
from qlactors.process.receipts import ReceiptStore
from qlactors.store.records import Session

SESSION = Session(session_id=new_id(), worker_id="local", generation=1, capacity=4)


@pytest.fixture
def edge(tmp_path):
    store = open_journal_file(tmp_path)
    journal = Journal(store)
    receipts = ReceiptStore(tmp_path / "receipts")
    receipts.ensure()
    files = LocalReceipts(receipts, journal, retention_ms=1000)
    yield EdgeEvidence(journal, receipts, files, read_boot_id, SESSION), journal, receipts
    store.close()


def _accepted(journal: Journal) -> tuple[str, str, str]:
    attempt_id, run_id, token = new_id(), new_id(), secrets.token_urlsafe(32)
    journal.accept(attempt_id, run_id, "/l", "/r", token_hash(token))
    return attempt_id, run_id, token


def test_journal_entries_and_record_started(edge):
    evidence, journal, _ = edge
    attempt_id, _, _ = _accepted(journal)
    other, _, _ = _accepted(journal)
    unknown = new_id()
    found = evidence.journal_entries([attempt_id, unknown, other])
    assert set(found) == {attempt_id, other} and found[attempt_id].state == "accepted"
    assert evidence.journal_entries([]) == {}
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        identity = read_identity(proc.pid, boot_id=read_boot_id())
        evidence.record_started(attempt_id, identity)
        entry = evidence.journal_entries([attempt_id])[attempt_id]
        assert (entry.state, entry.identity.pid, entry.identity.start_ticks) == ("started", proc.pid,
                                                                                 identity.start_ticks)
        assert evidence.liveness(entry.identity, evidence.boot_id()) == "running"
    finally:
        proc.kill()
        proc.wait(10)
    assert evidence.liveness(entry.identity, evidence.boot_id()) == "gone"
    other_boot = read_identity(os.getpid(), boot_id=str(uuid.uuid4()))
    assert evidence.liveness(other_boot, evidence.boot_id()) == "gone"  # another boot: it cannot be running


def test_released_clears_only_an_accepted_row(edge):
    evidence, journal, _ = edge
    accepted, _, _ = _accepted(journal)
    activated, _, _ = _accepted(journal)
    journal.set_state(activated, "launching")
    evidence.released(accepted)
    evidence.released(activated)
    evidence.released(new_id())  # no row: nothing to do
    assert journal.get(accepted) is None
    assert journal.get(activated).state == "launching"  # it may launch: kept


def test_receipt_marker_and_ended(edge):
    evidence, journal, receipts = edge
    attempt_id, run_id, token = _accepted(journal)
    assert evidence.receipt(attempt_id).kind == "missing"
    assert evidence.marker_identity(attempt_id) is None
    receipts.shard_dir(attempt_id)
    receipts.marker_path(attempt_id).write_text(f"pid=7 pgid=7 start_ticks=9 boot_id={read_boot_id()}\n")
    assert evidence.marker_identity(attempt_id).pid == 7
    receipt = Receipt(schema_version=2, run_id=run_id, attempt_id=attempt_id, callback_sequence=1, token=token,
                      started_at_ms=1, finished_at_ms=2, exit_code=3, output_open=0)
    receipts.final_path(attempt_id).write_bytes(encode_receipt(receipt))
    found = evidence.receipt(attempt_id)
    assert (found.kind, found.receipt.exit_code) == ("valid", 3)
    evidence.ended(attempt_id)
    assert not receipts.final_path(attempt_id).exists() and journal.get(attempt_id) is None
    assert evidence.receipt(attempt_id).kind == "missing"


def test_a_bad_receipt_is_quarantined_and_an_applied_one_finished(edge):
    evidence, journal, receipts = edge
    bad, _, _ = _accepted(journal)
    receipts.shard_dir(bad)
    receipts.final_path(bad).write_bytes(b"not a receipt")
    assert evidence.receipt(bad).kind == "bad"
    evidence.quarantine(bad)
    assert not receipts.final_path(bad).exists() and journal.get(bad).state == "quarantined"
    good, run_id, token = _accepted(journal)
    receipts.shard_dir(good)
    receipts.final_path(good).write_bytes(encode_receipt(Receipt(
        schema_version=2, run_id=run_id, attempt_id=good, callback_sequence=1, token=token, started_at_ms=1,
        finished_at_ms=2, exit_code=0, output_open=0)))
    evidence.receipt_applied(good)
    assert not receipts.final_path(good).exists() and journal.get(good) is None
