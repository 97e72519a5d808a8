"""The worker's side of the exchange (protocol 4, SEMANTICS.md §9 Exchange, Owed reports, Register
once, Pull once): it acts only on the first answer to the request it still waits for, about the
lease it still holds, and keeps every owed report until that answer.

Each test is one finding of issue 17 that today's protocol got wrong: a late refusal undoing a
launch, a one-shot report stranding a run, a fenced Started about an older lease stopping a
re-bound job, a Register sent once, offers of a Pull no longer waited for left to expire.
The rig is ClusterRig (tests/harness/cluster_rigs.py): a real Executor and ReceiptConsumer on a cluster session of
a real store, the test peer answering with the store's real decisions.
"""

from __future__ import annotations

import logging

from sqlalchemy import select

from qlactors.executor import registration as executor_registration
from qlactors.control.gateway import fence_of
from qlactors.runtime.signals import RegisterDue
from qlactors.executor.journal.schema import executor_journal
from qlactors.wire import messages as m

from actor_harness import ack_message, wait_until
from actor_rigs import spec
from cluster_rigs import (  # noqa: F401 - make_rig is the rig's fixture
    LEASES,
    end_session_by_heartbeat,
    held_job,
    make_rig,
    offer_failing_start,
    ready,
    release,
)


def _journal_rows(rig) -> list:
    """Every journal row, hidden ones (cleared while a report was owed) included."""
    with rig.ctx.executor_side.journal.store.read() as conn:
        return conn.execute(select(executor_journal)).all()


def test_a_late_refusal_of_an_activate_copy_never_undoes_the_launch(make_rig, caplog):
    """Finding 2: one copy of the Activate was committed and answered `Activated` (launched); the
    answer to another copy, `fenced`, comes later and changes nothing: the job runs to its end,
    nothing is given back, its Completed goes out."""
    caplog.set_level(logging.INFO, logger="qlactors")
    rig = make_rig()
    rig.welcome_to(rig.new_session())
    pull = rig.peer.expect(m.Pull)
    rig.repo.tasks.add(spec("job", held_job(rig)), actor_name="tester")
    rig.repo.runs.request("job")
    offer = rig.offer_for(pull)
    rig.send_offers(pull, offer)
    act = rig.peer.expect(m.Activate)
    rig.activate(act)
    started = rig.peer.expect(m.Started, strict=False)
    rig.h.track_group(started.pgid)
    ready(rig)
    rig.peer.send(ack_message("activate", act.run_id, act.attempt_id, "fenced", "lease_expired",
                              offer_id=act.offer_id, answer_to=act.request_id))  # a copy's, late
    rig.ack_started(started)
    rig.peer.quiet()  # no give-back Attest, no Pull beyond its one slot
    assert "already launched" in caplog.text
    assert rig.ctx.executor_side.journal.get(offer.attempt_id).state == "started"
    release(rig)
    completed = rig.peer.expect(m.Completed, strict=False)
    assert (completed.attempt_id, completed.exit_code, rig.ack_completed(completed)) == (offer.attempt_id, 0, "applied")


def test_a_start_failure_is_owed_until_answered_and_its_row_kept_until_then(make_rig, tmp_path):
    """Finding 3: StartFailed is journalled before it is sent and sent again, unchanged, until its
    answer; the attempt's journal row stays (hidden) until that answer, then goes."""
    rig = make_rig()
    rig.welcome_to(rig.new_session(), heartbeat_ms=300)  # re-sent every 0.3 s while unanswered
    offer = offer_failing_start(rig, rig.peer.expect(m.Pull), tmp_path)
    rig.activate(rig.peer.expect(m.Activate))
    failed = rig.peer.expect(m.StartFailed, strict=False)
    assert [r.request_id for r in rig.ctx.executor_side.journal.owed()] == [failed.request_id]
    wait_until(lambda: rig.ctx.executor_side.journal.get(offer.attempt_id) is None, what="the row cleared for its readers")
    assert [r.attempt_id for r in _journal_rows(rig)] == [offer.attempt_id]  # kept while owed
    again = rig.peer.expect(m.StartFailed, strict=False)  # the first copy was lost: sent again
    assert again == failed
    outcome = rig.ctx.control_side.dispatch.reports.start_failed(fence_of(again, again.worker_id), again.reason)
    assert outcome.result == "applied"
    rig.peer.send(ack_message("start_failed", again.run_id, again.attempt_id, outcome.result,
                              offer_id=again.offer_id, answer_to=again.request_id))
    wait_until(lambda: not rig.ctx.executor_side.journal.owed(), what="the report settled")
    wait_until(lambda: _journal_rows(rig) == [], what="the row gone with its last owed report")
    assert rig.repo.runs.get(offer.run_id).state == "failed"


def test_a_fenced_answer_to_a_started_about_an_older_lease_does_not_stop_the_rebound_job(make_rig, caplog):
    """Finding 6: the Started of session 1 is answered `fenced` only after the job was re-bound to
    session 2 under a new lease generation: that answer is about the older lease, and the job
    goes on to its own end."""
    caplog.set_level(logging.INFO, logger="qlactors")
    rig = make_rig()
    s1 = rig.new_session()
    rig.welcome_to(s1)
    pull = rig.peer.expect(m.Pull)
    rig.repo.tasks.add(spec("job", held_job(rig)), actor_name="tester")
    rig.repo.runs.request("job")
    offer = rig.offer_for(pull)
    rig.send_offers(pull, offer)
    rig.activate(rig.peer.expect(m.Activate))
    started = rig.peer.expect(m.Started, strict=False)  # never answered while session 1 lasts
    rig.h.track_group(started.pgid)
    ready(rig)
    s2 = end_session_by_heartbeat(rig)
    rig.welcome_to(s2)
    attest = rig.peer.expect(m.Attest, strict=False)
    assert (attest.fact, attest.session_id) == ("running", s2.session_id)
    assert rig.answer_attest(attest).result == "applied"
    wait_until(lambda: rig.ctx.executor_side.journal.get(offer.attempt_id).lease.session_id == s2.session_id,
               what="the lease re-bound to session 2")
    rig.peer.send(ack_message("started", started.run_id, started.attempt_id, "fenced", "lease_released",
                              offer_id=started.offer_id, answer_to=started.request_id))
    wait_until(lambda: not any(r.request_id == started.request_id for r in rig.ctx.executor_side.journal.owed()),
               what="the Started settled by its answer")
    assert "event=stop_term" not in caplog.text
    release(rig)
    completed = rig.peer.expect(m.Completed, strict=False)
    assert (completed.exit_code, completed.stopped_by, rig.ack_completed(completed)) == (0, "exit", "applied")


def test_a_register_is_repeated_with_the_same_register_id_until_welcomed(make_rig, caplog, monkeypatch):
    """Finding 5: an unanswered or refused Register (a key not yet allowed) is sent again, the same
    request and register id, so a later allow works without a restart; the Welcome to it ends it."""
    caplog.set_level(logging.INFO, logger="qlactors")
    rig = make_rig()
    first = rig.register
    rig.peer.send(ack_message("register", "", "", "refused", "unknown worker 'local'", answer_to=first.request_id))
    wait_until(lambda: "event=worker_key_refused" in caplog.text, what="the refusal logged")
    monkeypatch.setattr(executor_registration, "wall_ms", lambda: first.worker_clock_ms + 300_000)  # allowed 5 min on
    rig.ref.tell(RegisterDue())
    again = rig.peer.expect(m.Register, strict=False)
    assert (again.request_id, again.register_id) == (first.request_id, first.register_id)
    assert again.worker_clock_ms == first.worker_clock_ms + 300_000  # stamped again: its skew is now's
    rig.peer.send(ack_message("register", "", "", "refused", "unknown worker 'local'", answer_to=first.request_id))
    rig.ref.tell(RegisterDue())
    rig.peer.expect(m.Register, strict=False)  # the second refusal handled before this repeat
    assert caplog.text.count("event=worker_key_refused") == 1  # once a minute, not per refusal
    rig.welcome_to(rig.new_session())
    rig.peer.expect(m.Pull, strict=False)
    assert not rig.ctx.executor_side.journal.owed()  # a session is open: nothing owed, no Register repeated
    rig.ref.tell(RegisterDue())
    rig.peer.pending = [p for p in rig.peer.pending if not isinstance(p, m.Register)]
    rig.peer.quiet()


def test_a_register_refused_for_its_protocol_stops_the_worker_with_the_refusal(make_rig):
    rig = make_rig()
    rig.peer.send(ack_message("register", "", "", "refused", "protocol mismatch: this control side speaks "
                              "protocol 5; the worker speaks 4..4: upgrade one of them",
                              answer_to=rig.register.request_id))
    wait_until(rig.ctx.fatal.event.is_set, what="the worker stopping")
    assert "protocol 5" in rig.ctx.fatal.reason and "upgrade" in rig.ctx.fatal.reason


def test_offers_of_a_pull_no_longer_waited_for_are_declined_at_once(make_rig):
    """Finding 7 (worker side): a second answer to an answered Pull (another replica's) carries an
    offer for a pair the first left unused: it is declined at once with that pair, never left to
    hold a slot until its lease expires."""
    rig = make_rig(slots=2)
    rig.welcome_to(rig.new_session())
    pull = rig.peer.expect(m.Pull)
    assert len(pull.offers) == 2
    rig.repo.tasks.add(spec("job", held_job(rig), max_concurrent=2), actor_name="tester")
    rig.repo.runs.request("job")
    rig.repo.runs.request("job")
    first = rig.offer_for(pull, 0)
    rig.send_offers(pull, first)  # one offer for two pairs: answered, nothing more now
    rig.peer.expect(m.Activate, strict=False)
    late = rig.offer_for(pull, 1)  # what a second replica claimed for the other pair
    rig.send_offers(pull, late)
    decline = rig.peer.expect(m.Decline, strict=False)
    assert (decline.attempt_id, decline.offer_id, decline.lease_token) == (
        late.attempt_id, pull.offers[1].offer_id, pull.offers[1].lease_token)
    assert rig.ctx.control_side.dispatch.reports.decline(fence_of(decline, decline.worker_id)).result == "applied"
