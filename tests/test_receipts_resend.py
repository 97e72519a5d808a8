"""A `Completed` is sent until it is answered (SEMANTICS.md §9 Completion): a link may drop it
(`wire/links.MAX_UNANSWERED`) or lose its answer with a replica, and the receipt is deleted only
after the answer. The real ReceiptConsumer, the real store deciding, a peer that drops what the
test says."""

from __future__ import annotations

from qlactors.actors.signals import Cleanup, Consume, SessionOpen
from qlactors.wire import messages as m

from actor_harness import wait_until
from test_actors import new_token, rc  # noqa: F401 - the fixture


def test_an_unanswered_completed_is_sent_again_after_a_whole_cleanup_interval(rc):  # noqa: F811
    token = new_token()
    run_id, attempt_id = rc.journalled_attempt(token)
    path = rc.plant(run_id, attempt_id, token, exit_code=3)
    rc.ref.tell(Consume(run_id, attempt_id))
    dropped = rc.peer.expect(m.Completed)  # never answered
    rc.ref.tell(Cleanup())  # sent within this interval: not yet
    rc.peer.quiet()
    rc.ref.tell(Cleanup())  # unanswered through a whole interval: again, the same report
    again = rc.peer.expect(m.Completed)
    assert again == dropped
    assert path.exists() and rc.ctx.journal.get(attempt_id) is not None  # nothing removed meanwhile
    assert rc.answer(again) == "applied"
    wait_until(lambda: not path.exists() and rc.ctx.journal.get(attempt_id) is None, what="removed after the answer")
    # The late answer to the first copy changes nothing, and nothing is sent any more.
    assert rc.answer(dropped) == "already_terminal"
    rc.ref.tell(Cleanup())
    rc.ref.tell(Cleanup())
    rc.peer.quiet()
    run = rc.h.repo.runs.get(run_id)
    assert (run.state, run.attempts[0].exit_code) == ("failed", 3)


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
    wait_until(lambda: rc.ctx.journal.get(attempt_id) is None, what="journal row cleared")
    assert rc.h.repo.runs.get(run_id).state == "succeeded"
