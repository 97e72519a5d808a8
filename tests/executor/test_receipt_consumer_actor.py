"""The ReceiptConsumer actor alone: receipts reported, acknowledged, sent again, quarantined or
missed, with the real store and a test peer playing the control side (SEMANTICS.md §5, §6, §9).

The harness (tests/harness/actor_harness.py) builds the EdgeContext on a SQLite file in a temp
home and starts one actor; the other names in the Directory are recording stubs. The rigs are
tests/harness/actor_rigs.py's.
"""

from __future__ import annotations

import stat
import time

import pytest

from qlactors.runtime.signals import Consume, NoReceipt
from qlactors.wire import messages as m

from actor_harness import ack_message, db_state, wait_until
from actor_rigs import new_token, now_ms, rc  # noqa: F401 - fixtures


@pytest.mark.parametrize(("exit_code", "state"), [(0, "succeeded"), (7, "failed")])
def test_receipts_a_planted_receipt_is_reported_and_removed_after_an_applied_ack(rc, exit_code, state):
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    path = rc.plant(run_id, attempt_id, token, exit_code)
    rc.ref.tell(Consume(run_id, attempt_id))
    completed = rc.peer.expect(m.Completed)
    s = rc.ctx.executor_side.session
    assert (completed.worker_id, completed.session_id, completed.session_generation) == (
        s.worker_id, s.session_id, s.generation)
    assert (completed.run_id, completed.attempt_id, completed.token, completed.exit_code) == (
        run_id, attempt_id, token, exit_code)
    assert (completed.schema_version, completed.callback_sequence, completed.log_dropped_bytes) == (1, 1, None)
    # Nothing is removed before the answer; the row is marked `completed` only if the answer is
    # fenced (the fast path spends no write on it).
    assert rc.ctx.executor_side.journal.get(attempt_id).state == "started"
    assert path.exists()

    assert rc.answer(completed) == "applied"
    wait_until(lambda: rc.ctx.executor_side.journal.get(attempt_id) is None, what="journal row cleared")
    assert not path.exists()
    assert rc.h.repo.runs.get(run_id).state == state
    assert rc.h.inbox.items("executor") == []


def test_receipts_an_already_terminal_ack_removes_the_receipt_too(rc):
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    path = rc.plant(run_id, attempt_id, token)
    rc.ref.tell(Consume(run_id, attempt_id))
    rc.answer(rc.peer.expect(m.Completed), "already_terminal")
    wait_until(lambda: rc.ctx.executor_side.journal.get(attempt_id) is None, what="journal row cleared")
    assert not path.exists()


def test_receipts_a_duplicate_ack_keeps_a_row_handed_to_log_retention(rc):
    """A link that failed over re-sends its unanswered Completed, so a second Ack can come after
    the first was handled: a cluster worker's row then waits `completed` for its log to ship, and
    that Ack must not clear it (the LogSender's next acknowledgement found no row and failed).
    The Ack to a receipt an instance that died sent still clears its row."""
    retained_run, retained = rc.journalled_attempt(new_token())
    rc.ctx.executor_side.journal.final_offset(retained, 6)
    rc.ctx.executor_side.journal.complete(retained, now_ms() + 60_000)  # as the first Ack left it
    died_run, died = rc.journalled_attempt(new_token())
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    rc.plant(run_id, attempt_id, token)
    rc.ref.tell(Consume(run_id, attempt_id))
    completed = rc.peer.expect(m.Completed)  # the worker side has spoken: the peer can answer
    rc.peer.send(ack_message("completed", retained_run, retained, "applied"))
    rc.peer.send(ack_message("completed", died_run, died, "applied"))
    assert rc.answer(completed) == "applied"
    wait_until(lambda: rc.ctx.executor_side.journal.get(died) is None and rc.ctx.executor_side.journal.get(attempt_id) is None,
               what="the dead instance's row and the answered one cleared")
    entry = rc.ctx.executor_side.journal.get(retained)  # the Acks are handled in order: the duplicate was too
    assert entry is not None and entry.state == "completed" and entry.final_offset == 6


def test_receipts_a_cluster_completed_left_unanswered_is_sent_again_until_answered(rc, monkeypatch):
    """A replica killed after it answered an earlier frame, before it committed this completion:
    the link counts the Completed answered and never re-sends it, so the ReceiptConsumer does,
    after RESEND_COMPLETED_S, until an Ack comes (edge's, in-process, is never re-sent)."""
    from qlactors.executor import receipt_consumer as receipts

    monkeypatch.setattr(receipts, "RESEND_COMPLETED_S", 0.5)
    monkeypatch.setattr(rc.ctx.executor_side, "completion_facts", lambda _a, _r: (0, True))  # as a cluster worker's
    rc.h.stub("logs")
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    rc.plant(run_id, attempt_id, token)
    rc.ref.tell(Consume(run_id, attempt_id))
    first = rc.peer.expect(m.Completed)
    t0 = time.monotonic()
    assert first.final_log_offset == 0
    again = rc.peer.expect(m.Completed)  # no answer: sent again, the same
    assert again == first and time.monotonic() - t0 >= 0.4
    assert rc.peer.expect(m.Completed) == first  # and again, while unanswered
    assert rc.answer(again) == "applied"
    wait_until(lambda: rc.ctx.executor_side.journal.get(attempt_id).state == "completed", what="the row kept for its log")
    assert rc.h.repo.runs.get(run_id).state == "succeeded"
    rc.peer.quiet(1.5)  # answered: never sent again


def test_receipts_an_edge_completed_is_not_sent_again(rc, monkeypatch):
    from qlactors.executor import receipt_consumer as receipts

    monkeypatch.setattr(receipts, "RESEND_COMPLETED_S", 0.3)
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    rc.plant(run_id, attempt_id, token)
    rc.ref.tell(Consume(run_id, attempt_id))
    rc.peer.expect(m.Completed)
    rc.peer.quiet(1.0)  # unanswered, and not sent again
    assert not rc.ref.proxy().waiting.get()[attempt_id].crosses_a_link


def test_receipts_a_refused_ack_quarantines_the_receipt(rc):
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    forged = new_token()
    path = rc.plant(run_id, attempt_id, forged)  # a token the attempt was not activated with
    before = db_state(rc.h.repo, run_id)
    rc.ref.tell(Consume(run_id, attempt_id))
    completed = rc.peer.expect(m.Completed)
    t0 = now_ms()
    assert rc.answer(completed) == "refused"

    [no_receipt] = rc.h.inbox.wait("executor", NoReceipt)
    assert no_receipt == NoReceipt(run_id, attempt_id, quarantined=True)
    entry = rc.ctx.executor_side.journal.get(attempt_id)
    retention = rc.h.config.runtime.quarantine_retention_ms
    assert entry.state == "quarantined"
    assert t0 + retention <= entry.purge_after_ms <= now_ms() + retention
    assert not path.exists()
    qroot = rc.h.config.receipts_dir / ".quarantine"
    moved = qroot / path.parent.name / path.name
    assert moved.is_file()
    assert stat.S_IMODE(qroot.stat().st_mode) == 0o700
    assert stat.S_IMODE(moved.parent.stat().st_mode) == 0o700
    assert db_state(rc.h.repo, run_id) == before  # run and attempt untouched


def test_receipts_a_fenced_ack_leaves_the_receipt_for_the_next_try(rc):
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    path = rc.plant(run_id, attempt_id, token)
    rc.ref.tell(Consume(run_id, attempt_id))
    completed = rc.peer.expect(m.Completed)
    rc.answer(completed, "fenced")
    wait_until(lambda: rc.ref.proxy().waiting.get() == {}, what="the fenced answer handled")
    # Consume again: it reports the same receipt, so the fenced answer left the file in place.
    rc.ref.tell(Consume(run_id, attempt_id))
    assert rc.peer.expect(m.Completed) == completed
    assert path.exists()
    assert rc.ctx.executor_side.journal.get(attempt_id).state == "completed"
    assert rc.h.inbox.items("executor") == []
    assert rc.answer(completed) == "applied"
    wait_until(lambda: not path.exists(), what="receipt removed")


def test_receipts_a_missing_receipt_is_reported_to_the_executor_after_the_publish_grace(rc):
    t0 = time.monotonic()
    rc.ref.tell(Consume("run-x", "att-x"))
    [no_receipt] = rc.h.inbox.wait("executor", NoReceipt)
    assert time.monotonic() - t0 >= rc.h.config.runtime.publish_grace_ms / 1000
    assert no_receipt == NoReceipt("run-x", "att-x", quarantined=False)
    rc.peer.quiet()  # nothing is reported to the control side


def test_receipts_a_receipt_published_during_the_grace_is_still_consumed(rc):
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    rc.ref.tell(Consume(run_id, attempt_id))
    rc.plant(run_id, attempt_id, token)  # lands before the one re-check, 50 ms later
    completed = rc.peer.expect(m.Completed)
    assert completed.attempt_id == attempt_id
    assert rc.h.inbox.items("executor") == []


def test_receipts_an_unreadable_receipt_is_quarantined_without_asking(rc):
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    path = rc.plant(run_id, attempt_id, token, data=b'{"schemaVersion": 1, "runId": ')
    rc.ref.tell(Consume(run_id, attempt_id))
    [no_receipt] = rc.h.inbox.wait("executor", NoReceipt)
    assert no_receipt.quarantined
    assert not path.exists()
    assert rc.ctx.executor_side.journal.get(attempt_id).state == "quarantined"
    rc.peer.quiet()


def test_receipts_an_ack_for_nothing_pending_is_ignored(rc):
    token = new_token()
    first = rc.journalled_attempt(token)
    rc.plant(*first, token)
    rc.ref.tell(Consume(*first))
    rc.answer(rc.peer.expect(m.Completed), "applied")
    second = rc.journalled_attempt(token)
    second_path = rc.plant(*second, token)
    rc.ref.tell(Consume(*second))
    completed = rc.peer.expect(m.Completed)
    # Acks nobody waits for: an unknown attempt, and a late second answer about the first one.
    for run_id, attempt_id in (("run-z", "att-z"), first):
        rc.peer.send(ack_message("completed", run_id, attempt_id, "refused"))
    rc.answer(completed)  # same connection, so handled after the two above
    wait_until(lambda: not second_path.exists(), what="the second receipt removed")
    assert rc.ref.is_alive()
    assert rc.ctx.executor_side.journal.get(first[1]) is None  # the late refusal neither resurrected nor moved anything
    assert not (rc.h.config.receipts_dir / ".quarantine").exists()
    assert rc.h.inbox.items("executor") == []
