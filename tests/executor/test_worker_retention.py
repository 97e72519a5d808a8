"""A worker's local logs: deleted only once acknowledged to their final offset and past retention."""

from __future__ import annotations

import secrets

import pytest

from qlactors.domain.receipt import token_hash
from qlactors.ids import new_id
from qlactors.process.logs import LogStore
from qlactors.process.receipts import ReceiptStore
from qlactors.executor.journal.journal import Journal
from qlactors.executor.local_receipts import LocalReceipts
from qlactors.executor.log_retention import LocalLogRetention
from qlactors.executor.state_dir import StateDir

PAST = 1  # a purge time long gone on any clock
FUTURE = 2**62


@pytest.fixture
def worker(tmp_path):
    state = StateDir(tmp_path / "state")
    journal = Journal(state.journal)
    logs = LogStore(state.logs)
    receipts = ReceiptStore(state.receipts)
    receipts.ensure()
    files = LocalReceipts(receipts, journal, retention_ms=1000)
    yield journal, logs, files, LocalLogRetention(journal, logs, files)
    state.close()


def _attempt(journal, logs, files, *, state="completed", final=5, acked=5, purge=PAST):
    """A journalled attempt with a 5-byte log and a dropped-byte sidecar."""
    attempt_id, run_id = new_id(), new_id()
    path = logs.create(run_id, attempt_id)
    path.write_bytes(b"12345")
    files.dropped_path(attempt_id).write_text("0\n")
    journal.accept(attempt_id, run_id, str(path), str(files.receipts.final_path(attempt_id)),
                   token_hash(secrets.token_urlsafe(32)))
    if final is not None:
        journal.final_offset(attempt_id, final)
    journal.shipped(attempt_id, acked)
    if state == "completed":
        journal.complete(attempt_id, purge)
    elif state == "quarantined":
        journal.quarantine(attempt_id, purge)
    else:
        journal.set_state(attempt_id, state)
    return attempt_id, path


def test_only_acknowledged_completed_logs_past_retention_are_deleted(worker):
    journal, logs, files, retention = worker
    due, due_path = _attempt(journal, logs, files)
    kept = [_attempt(journal, logs, files, acked=4),             # the tail is not acknowledged yet
            _attempt(journal, logs, files, final=None, acked=5),  # no final offset: still running
            _attempt(journal, logs, files, purge=FUTURE),        # retention not over
            _attempt(journal, logs, files, state="started"),
            _attempt(journal, logs, files, state="quarantined")]
    purged = retention.step()
    assert (purged.rows, purged.logs) == (1, 1)
    assert not due_path.exists() and not files.dropped_path(due).exists()
    assert journal.get(due) is None
    for attempt_id, path in kept:
        assert path.read_bytes() == b"12345" and files.dropped_path(attempt_id).exists()
        assert journal.get(attempt_id) is not None
    assert (retention.step().rows, retention.step().logs) == (0, 0)


def test_a_step_is_bounded_and_the_next_one_goes_on(worker):
    journal, logs, files, retention = worker
    paths = [_attempt(journal, logs, files)[1] for _ in range(5)]
    assert retention.step(limit=2).rows == 2
    assert sum(p.exists() for p in paths) == 3
    assert retention.step(limit=10).rows == 3
    assert not any(p.exists() for p in paths)


def test_a_log_already_gone_still_clears_its_row(worker):
    journal, logs, files, retention = worker
    attempt_id, path = _attempt(journal, logs, files)
    path.unlink()  # a crash after the delete, before the row was cleared
    purged = retention.step()
    assert (purged.rows, purged.logs) == (1, 0)
    assert journal.get(attempt_id) is None
