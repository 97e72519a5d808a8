"""A `Completed` is sent until it is answered (SEMANTICS.md §9 Completion): a new session sends
the unanswered ones again, naming it (the timer's resend of a cluster worker's Completed is
tests/executor/test_receipt_consumer_actor.py::test_receipts_a_cluster_completed_left_unanswered_is_sent_again_until_answered).
The real ReceiptConsumer, the real store deciding."""

from __future__ import annotations

from qlactors.runtime.signals import Consume, SessionOpen
from qlactors.wire import messages as m

from actor_harness import wait_until
from actor_rigs import new_token, rc  # noqa: F401 - the fixture


def test_a_new_session_sends_the_unanswered_completed_again_naming_it(rc):  # noqa: F811
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    rc.plant(run_id, attempt_id, token)
    rc.ref.tell(Consume(run_id, attempt_id))
    first = rc.peer.expect(m.Completed)
    rc.ref.tell(SessionOpen(first.worker_id, "session-2", first.session_generation + 1))
    again = rc.peer.expect(m.Completed)
    assert (again.session_id, again.session_generation) == ("session-2", first.session_generation + 1)
    assert (again.attempt_id, again.token, again.exit_code) == (attempt_id, token, 0)
    assert rc.answer(again) == "applied"
    wait_until(lambda: rc.ctx.executor_side.journal.get(attempt_id) is None, what="journal row cleared")
    assert rc.h.repo.runs.get(run_id).state == "succeeded"
