"""The evidence probes: the pure decision for every combination, then a real process."""

from __future__ import annotations

import itertools
import secrets
import subprocess

import pytest

from qlactors.domain.receipt import Receipt, encode_receipt, token_hash
from qlactors.ids import new_id
from qlactors.process.identity import read_boot_id, read_identity
from qlactors.process.receipts import ReceiptStore
from qlactors.store.records import Identity
from qlactors.executor import evidence
from qlactors.executor.evidence import Alive, fact_of, liveness_of, probe_journal, probe_rows
from qlactors.executor.journal.journal import Journal
from qlactors.executor.journal.file import open_journal_file
from qlactors.executor.local_receipts import LocalReceipts

STATES = ("accepted", "launching", "started")
LIVENESS = (None, *Alive)


def expected(state, identity_known, liveness, receipt, marker):
    """The contract, written as a table rather than as the code's branches."""
    has_identity = identity_known or marker
    if receipt:
        return evidence.ENDED_WITH_RECEIPT
    if has_identity != (liveness is not None):
        return ValueError  # an identity is probed exactly when there is one
    if not has_identity:
        return {"accepted": evidence.NEVER_LAUNCHED, "launching": evidence.LAUNCH_UNKNOWN,
                "started": evidence.LAUNCH_UNKNOWN}[state]
    return {Alive.RUNNING: "running", Alive.GONE: "ended", Alive.REBOOTED: "rebooted",
            Alive.UNREADABLE: "unreadable"}[liveness]


@pytest.mark.parametrize("state,identity_known,liveness,receipt,marker",
                         list(itertools.product(STATES, (False, True), LIVENESS, (False, True), (False, True))))
def test_fact_of_every_combination(state, identity_known, liveness, receipt, marker):
    want = expected(state, identity_known, liveness, receipt, marker)
    if want is ValueError:
        with pytest.raises(ValueError):
            fact_of(state, identity_known, liveness, receipt, marker)
    else:
        assert fact_of(state, identity_known, liveness, receipt, marker) == want
        assert want in evidence.FACTS


@pytest.mark.parametrize("state", ["completed", "quarantined", "bogus"])
def test_only_in_flight_rows_are_judged(state):
    with pytest.raises(ValueError, match="in-flight"):
        fact_of(state, True, Alive.RUNNING, False, False)


# -- the reads, with a real process ---------------------------------------------------------------

@pytest.fixture
def worker(tmp_path):
    store = open_journal_file(tmp_path)
    journal = Journal(store)
    receipts = ReceiptStore(tmp_path / "receipts")
    receipts.ensure()
    yield journal, LocalReceipts(receipts, journal, retention_ms=1000)
    store.close()


def _row(journal, state, identity=None):
    attempt_id, run_id = new_id(), new_id()
    token = secrets.token_urlsafe(32)
    journal.accept(attempt_id, run_id, "/l", "/r", token_hash(token))
    if state != "accepted":
        journal.set_state(attempt_id, state, identity=identity)
    return journal.get(attempt_id), token


def _publish(files, entry, token):
    receipt = Receipt(schema_version=2, run_id=entry.run_id, attempt_id=entry.attempt_id, callback_sequence=1,
                      token=token, started_at_ms=1, finished_at_ms=2, exit_code=0, output_open=0)
    files.receipts.shard_dir(entry.attempt_id)
    files.receipts.final_path(entry.attempt_id).write_bytes(encode_receipt(receipt))


class _Sleeps:
    def __init__(self):
        self.calls = []

    def __call__(self, seconds):
        self.calls.append(seconds)


def test_probes_of_a_real_process_from_start_to_end(worker):
    journal, files = worker
    boot_id = read_boot_id()
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        identity = read_identity(proc.pid, boot_id=boot_id)
        started, _ = _row(journal, "started", identity)
        by_marker, _ = _row(journal, "launching")
        files.receipts.shard_dir(by_marker.attempt_id)
        files.receipts.marker_path(by_marker.attempt_id).write_text(
            f"pid={identity.pid} pgid={identity.pgid} start_ticks={identity.start_ticks} boot_id={boot_id}\n")
        unknown, _ = _row(journal, "launching")
        accepted, _ = _row(journal, "accepted")
        with_receipt, token = _row(journal, "started", identity)
        _publish(files, with_receipt, token)
        sleeps = _Sleeps()
        facts = {e.entry.attempt_id: e for e in probe_rows(
            [started, by_marker, unknown, accepted, with_receipt], receipts=files,
            current_boot_id=boot_id, grace_s=0.01, sleep=sleeps)}
        assert facts[started.attempt_id].fact == "running"
        assert Identity.of(facts[started.attempt_id].identity) == Identity.of(identity)
        assert facts[by_marker.attempt_id].fact == "running"  # the identity from the start marker
        assert facts[unknown.attempt_id].fact == "launch_unknown"  # never relaunched
        assert facts[accepted.attempt_id].fact == "never_launched"
        assert facts[with_receipt.attempt_id].fact == "ended_with_receipt"
        assert facts[with_receipt.attempt_id].found.receipt.attempt_id == with_receipt.attempt_id
        assert sleeps.calls == [0.01]  # one grace for the batch (for the launch outcome unknown)
        assert liveness_of(identity, "00000000-0000-0000-0000-000000000000") is Alive.REBOOTED
        rebooted = probe_rows([started], receipts=files, current_boot_id="00000000-0000-0000-0000-000000000000",
                              grace_s=0.01, sleep=sleeps)
        assert [e.fact for e in rebooted] == ["rebooted"]
    finally:
        proc.kill()
        proc.wait()
    sleeps = _Sleeps()
    ended = probe_rows([started, by_marker], receipts=files, current_boot_id=boot_id, grace_s=0.01,
                       sleep=sleeps)
    assert [e.fact for e in ended] == ["ended", "ended"]  # gone, no receipt after the grace
    assert sleeps.calls == [0.01]


def test_a_receipt_published_during_the_grace_is_found(worker):
    journal, files = worker
    proc = subprocess.Popen(["true"], start_new_session=True)
    identity = read_identity(proc.pid, boot_id=read_boot_id())
    proc.wait()
    entry, token = _row(journal, "started", identity)
    [evidence_] = probe_rows([entry], receipts=files, current_boot_id=identity.boot_id, grace_s=0.5,
                             sleep=lambda _s: _publish(files, entry, token))
    assert evidence_.fact == "ended_with_receipt"


def test_probe_journal_walks_every_in_flight_row_with_one_grace_per_page(worker):
    journal, files = worker
    ids = {_row(journal, "accepted")[0].attempt_id for _ in range(3)}
    done, _ = _row(journal, "completed")
    launching = {_row(journal, "launching")[0].attempt_id for _ in range(2)}
    sleeps = _Sleeps()
    facts = {e.entry.attempt_id: e.fact for e in probe_journal(
        journal, receipts=files, current_boot_id=read_boot_id(), grace_s=0.01, page=2, sleep=sleeps)}
    assert done.attempt_id not in facts
    assert facts == {**dict.fromkeys(ids, "never_launched"), **dict.fromkeys(launching, "launch_unknown")}
    assert 1 <= len(sleeps.calls) <= 2  # only pages holding a launching row wait
