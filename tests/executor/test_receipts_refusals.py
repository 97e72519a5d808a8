"""Only a receipt that is itself bad is quarantined (SEMANTICS.md §5): one that fails the codec or
the token (or names a sequence that is not the next). Any other refusal of a `Completed` — an
attempt the database does not know or that is not running, another worker's, a value the store
refused — leaves the receipt and its journal row where they are, logged, for the cleanup pass
to send again, as a `fenced` answer does. The real ReceiptConsumer; the real store where it
decides (the quarantining refusal itself: tests/executor/test_receipt_consumer_actor.py::
test_receipts_a_refused_ack_quarantines_the_receipt)."""

from __future__ import annotations

import pytest

from qlactors.executor.receipt_consumer import quarantines
from qlactors.runtime.signals import Cleanup, Consume, NoReceipt
from qlactors.domain.receipt import Receipt
from qlactors.wire import messages as m

from actor_harness import wait_until
from actor_rigs import SupervisorRig, new_token, rc, sup  # noqa: F401 - the fixtures

NOT_THE_RECEIPTS_FAULT = ("unknown_run", "unknown_attempt", "wrong_run", "wrong_executor", "wrong_worker",
                          "attempt_claimed", "log_dropped_bytes must be a non-negative integer or None (unknown)",
                          "")
THE_RECEIPTS_FAULT = ("invalid_receipt: exitCode out of range", "receipt_mismatch", "no_token", "bad_token",
                      "wrong_sequence")


@pytest.mark.parametrize("detail", THE_RECEIPTS_FAULT)
def test_a_codec_or_token_refusal_quarantines(detail):
    assert quarantines(detail)


@pytest.mark.parametrize("detail", NOT_THE_RECEIPTS_FAULT)
def test_no_other_refusal_quarantines(detail):
    assert not quarantines(detail)


def _refused_and_kept(rc, run_id: str, attempt_id: str, path) -> None:  # noqa: F811
    wait_until(lambda: rc.ref.proxy().waiting.get() == {}, what="the refusal handled")
    assert path.exists()  # left where it is, not quarantined
    assert not (rc.h.config.receipts_dir / ".quarantine").exists()
    assert rc.ctx.executor_side.journal.get(attempt_id).state == "completed"  # the cleanup pass lists it
    assert rc.h.inbox.items("executor") == []  # nobody is told there is no receipt


@pytest.mark.parametrize("detail", NOT_THE_RECEIPTS_FAULT)
def test_a_refusal_that_is_not_the_receipts_fault_leaves_it_for_the_next_try(rc, detail):  # noqa: F811
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    path = rc.plant(run_id, attempt_id, token)
    rc.ref.tell(Consume(run_id, attempt_id))
    completed = rc.peer.expect(m.Completed)
    rc.answer(completed, "refused", detail)
    _refused_and_kept(rc, run_id, attempt_id, path)
    rc.ref.tell(Cleanup())  # the next try: the same receipt is sent again, and now it lands
    again = rc.peer.expect(m.Completed)
    assert (again.attempt_id, again.token) == (attempt_id, token)
    assert rc.answer(again) == "applied"
    wait_until(lambda: not path.exists() and rc.ctx.executor_side.journal.get(attempt_id) is None, what="receipt removed")
    assert rc.h.repo.runs.get(run_id).state == "succeeded"


def test_the_stores_wrong_worker_refusal_leaves_the_receipt(rc):  # noqa: F811
    """The real CompletionService refusing a Completed another worker forwarded (`wrong_worker`)."""
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    path = rc.plant(run_id, attempt_id, token)
    rc.ref.tell(Consume(run_id, attempt_id))
    completed = rc.peer.expect(m.Completed)
    receipt = Receipt(schema_version=completed.schema_version, run_id=run_id, attempt_id=attempt_id,
                      callback_sequence=1, token=token, started_at_ms=completed.started_at_ms,
                      finished_at_ms=completed.finished_at_ms, exit_code=0)
    outcome = rc.ctx.control_side.completion.complete(run_id, attempt_id, receipt, worker_id="another-worker")
    assert (outcome.result, outcome.detail) == ("refused", "wrong_worker")
    rc.answer(completed, outcome.result, outcome.detail)
    _refused_and_kept(rc, run_id, attempt_id, path)


@pytest.mark.parametrize("detail", THE_RECEIPTS_FAULT)
def test_a_refusal_for_the_receipts_own_fault_quarantines_it(rc, detail):  # noqa: F811
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    path = rc.plant(run_id, attempt_id, token)
    rc.ref.tell(Consume(run_id, attempt_id))
    rc.answer(rc.peer.expect(m.Completed), "refused", detail)
    [no_receipt] = rc.h.inbox.wait("executor", NoReceipt)
    assert no_receipt == NoReceipt(run_id, attempt_id, quarantined=True)
    assert not path.exists()
    assert rc.ctx.executor_side.journal.get(attempt_id).state == "quarantined"


def test_the_gateway_names_a_receipt_that_fails_the_codec_invalid_receipt(sup: SupervisorRig):  # noqa: F811
    sup.register()
    offer, _, token, _ = sup.activated()
    ack = sup.completed(offer, token, schema_version=9)  # no receipt schema 9
    assert ack.result == "refused" and ack.detail.startswith("invalid_receipt: "), ack
    assert quarantines(ack.detail)
    ack = sup.completed(offer, new_token())  # a token the attempt was not activated with
    assert (ack.result, ack.detail) == ("refused", "bad_token")
