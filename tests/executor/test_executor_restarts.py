"""Exact through restarts (issue 26): a worker restarted mid-exchange never stops its own healthy job,
an answer is acted on only by the request it answers, and a report fenced by its ended session is
re-made from the next one with what it said.

The Executor and the ReceiptConsumer are real, on cluster sessions of the harness's store; the
test peer plays the control side with the real store decisions (`ClusterSessions`). A restart
stops the Executor where it is and starts a new one on the same journal (`restart_executor`):
the job it launched runs on, as after `kill -9` of a worker.
"""

from __future__ import annotations

import logging

import pytest

from qlactors.control.gateway import fence_of
from qlactors.domain.receipt import Receipt
from qlactors.domain.transitions import ErrorCode
from qlactors.executor import evidence, session_reports
from qlactors.executor.log_retention import LocalLogRetention
from qlactors.runtime.signals import HeartbeatDue
from qlactors.wire import messages as m

from actor_harness import ack_message, attempt_row, wait_until
from cluster_rigs import (ClusterRig, end_session_by_heartbeat, held_job, make_rig, offer_failing_start,  # noqa: F401
                          ready, release)


def _all_of(rig: ClusterRig, kind: type, settle_s: float = 0.5) -> list:
    """Every `kind` the executor sends until it has said nothing more of that kind for `settle_s`."""
    found = []
    while True:
        try:
            found.append(rig.peer.expect(kind, timeout=settle_s, strict=False))
        except AssertionError:
            return found


def _rebound_and_restarted(rig: ClusterRig):
    """A job re-attested `running` from a new session; the store re-binds it (generation + 1), and
    the worker's process dies before it handles that answer. The new instance resumes the session."""
    s1 = rig.new_session()
    offer, _pull, _started = rig.launch_on(s1, held_job(rig))
    ready(rig)
    s2 = end_session_by_heartbeat(rig)
    rig.welcome_to(s2)
    first = rig.peer.expect(m.Attest, strict=False)
    applied = rig.control.attest(first, rig.worker_id)  # committed; its answer never handled
    assert (applied.result, applied.lease_generation) == ("applied", offer.lease_generation + 1)
    register = rig.restart_executor()
    assert (register.resume_session_id, register.resume_generation) == (s2.session_id, s2.generation)
    assert rig.resume(register).resumed
    return offer, first, applied


def test_a_re_bind_answered_before_its_survivor_is_adopted_again_is_journalled(make_rig, monkeypatch):
    """Issue 26 item 1, the restarted worker cannot read the survivor's /proc at first (no fact: not
    adopted yet) when the answer to its owed `running` Attest comes: the re-bind is journalled all
    the same, so the adoption at the next probe quotes the re-bound lease and the job runs on."""
    real = evidence.liveness_of
    unreadable = {"on": False}
    monkeypatch.setattr(evidence, "liveness_of",
                        lambda *a, **k: evidence.Alive.UNREADABLE if unreadable["on"] else real(*a, **k))
    rig = make_rig()
    unreadable["on"] = True  # from the restart on
    offer, first, applied = _rebound_and_restarted(rig)
    replay = rig.peer.expect(m.Attest, strict=False)
    assert replay.request_id == first.request_id
    rig.answer_attest(replay)
    wait_until(lambda: rig.ctx.executor_side.journal.get(offer.attempt_id).lease.lease_generation
               == applied.lease_generation, what="the re-bind journalled")
    unreadable["on"] = False
    rig.ref.tell(HeartbeatDue())  # probed again: adopted, attested quoting the re-bound lease
    again = rig.peer.expect(m.Attest, strict=False)
    assert (again.fact, again.lease.offer_id, again.lease.lease_generation) == (
        "running", first.new_slot.offer_id, applied.lease_generation)
    assert rig.answer_attest(again).result == "applied"
    release(rig)
    completed = rig.peer.expect(m.Completed, strict=False)
    assert (completed.exit_code, completed.stopped_by) == (0, "exit")


@pytest.mark.parametrize("replay_first", [False, True], ids=["fresh_answer_first", "replay_answer_first"])
def test_a_worker_restarted_right_after_an_applied_re_bind_keeps_its_job_running(make_rig, caplog, replay_first):
    """Issue 26 item 1, both answer orders: the owed Attest is the re-bind's only record; the
    restarted worker learns the re-bind's slot from it, attests the survivor no second time, and
    renews the new lease; the job ends with its own exit code."""
    caplog.set_level(logging.INFO, logger="qlactors")
    rig = make_rig()
    offer, first, applied = _rebound_and_restarted(rig)
    attests = _all_of(rig, m.Attest)
    assert first.request_id in [a.request_id for a in attests]  # the owed one, sent again unchanged
    for attest in sorted(attests, key=lambda a: (a.request_id == first.request_id) != replay_first):
        rig.answer_attest(attest)
    wait_until(lambda: (e := rig.ctx.executor_side.journal.get(offer.attempt_id)) is not None
               and e.lease.lease_generation == applied.lease_generation, what="the journal re-bound")
    beat = rig.heartbeat()
    assert [(r.offer_id, r.lease_generation) for r in beat.renewals] == [
        (first.new_slot.offer_id, applied.lease_generation)]
    ack = rig.answer_heartbeat(beat)
    assert (ack.session_ended, ack.fenced, len(ack.renewed)) == (False, [], 1)
    release(rig)
    completed = rig.peer.expect(m.Completed, strict=False)
    assert (completed.exit_code, completed.stopped_by) == (0, "exit")
    assert rig.ack_completed(completed) == "applied"
    assert rig.repo.runs.get(offer.run_id).state == "succeeded"
    assert "event=stop_term" not in caplog.text and "rebind_refused_process_stopped" not in caplog.text


def test_a_late_answer_to_the_old_sessions_heartbeat_does_not_end_the_new_session(make_rig, caplog):
    """Issue 26 item 3: the answer to a heartbeat of session 1 (`session_ended`), once more after
    the worker re-registered (a copy, or another replica's late answer): it answers no heartbeat of
    the new session, and the new session goes on."""
    rig = make_rig()
    s1 = rig.new_session()
    rig.welcome_to(s1)
    rig.peer.expect(m.Pull)
    beat = rig.heartbeat()
    s2 = rig.new_session()
    ended = rig.answer_heartbeat(beat)
    assert ended.session_ended
    rig.peer.expect(m.Register, strict=False)
    rig.welcome_to(s2)
    rig.peer.expect(m.Pull, strict=False)
    rig.peer.send(ended)  # the old session's answer again
    rig.peer.quiet(0.5)  # no Register: the session is not ended here
    beat2 = rig.heartbeat()
    assert beat2.session_id == s2.session_id
    assert not rig.answer_heartbeat(beat2).session_ended


def test_a_heartbeat_answered_after_the_next_was_sent_is_still_acted_on(make_rig, caplog):
    """Found by the PostgreSQL seed search on a loaded machine (seeds 230037, 230130, 230136...):
    when every answer takes longer than a heartbeat interval, each one answers a heartbeat older
    than the last sent. Waiting only for the last one, the worker acted on none: it never learnt
    that its session had ended (a Pull answered `session_expired` again and again), and never
    registered anew. An answer to any heartbeat of the current session not yet superseded by an
    answer acted on is acted on; older ones, and the old session's (item 3), are not."""
    rig = make_rig()
    s1 = rig.new_session()
    rig.welcome_to(s1)
    rig.peer.expect(m.Pull)
    first = rig.heartbeat()
    second = rig.heartbeat()  # sent before the first was answered
    rig.new_session()  # the store ends s1 meanwhile (a newer generation)
    late = rig.answer_heartbeat(first)
    assert late.session_ended
    register = rig.peer.expect(m.Register, strict=False)  # acted on: the worker registers anew
    assert register.resume_session_id == s1.session_id
    rig.peer.send(rig.control.heartbeat(second, rig.worker_id)[0])  # the second's answer: already acted on
    rig.peer.quiet(0.5)
    assert caplog.text.count("event=session_ended") == 1


def test_a_start_failure_fenced_by_its_ended_session_still_ends_the_run_failed(make_rig, tmp_path):
    """Issue 26 item 5: the StartFailed of session 1 lands after that session ended. Re-made from
    the next session with its reason, it ends the run `failed` (EXECUTOR_START_FAILED) whatever
    the timing, never `lost` as a never-launched attempt."""
    rig = make_rig()
    s1 = rig.new_session()
    rig.welcome_to(s1)
    offer = offer_failing_start(rig, rig.peer.expect(m.Pull), tmp_path)
    rig.activate(rig.peer.expect(m.Activate))
    failed = rig.peer.expect(m.StartFailed, strict=False)
    s2 = end_session_by_heartbeat(rig)
    rig.welcome_to(s2)
    answered = set()
    while rig.repo.runs.get(offer.run_id).state not in ("failed", "lost"):
        report = rig.peer.expect((m.StartFailed, m.Attest), strict=False)
        if report.request_id in answered:
            continue
        answered.add(report.request_id)
        if isinstance(report, m.Attest):
            rig.answer_attest(report)
            break  # the old code's give-back: never_launched, recorded as evidence only
        outcome = rig.ctx.control_side.dispatch.reports.start_failed(fence_of(report, report.worker_id), report.reason)
        if report.request_id == failed.request_id:
            assert outcome.result == "fenced"  # sent from session 1, which has ended
        rig.peer.send(ack_message("start_failed", report.run_id, report.attempt_id, outcome.result,
                                  outcome.detail or "", offer_id=report.offer_id, answer_to=report.request_id))
    run = rig.repo.runs.get(offer.run_id)
    assert (run.state, attempt_row(rig.repo, offer.attempt_id).error_code) == (
        "failed", ErrorCode.EXECUTOR_START_FAILED)
    assert "is not a directory" in (attempt_row(rig.repo, offer.attempt_id).error_summary or "")


def _clock_stepped_back_and_restarted(rig: ClusterRig, monkeypatch):
    """A job running and renewed; the worker's wall clock steps back an hour and its process
    restarts: (offer, the last heartbeat before, the new instance's Register)."""
    offer, _pull, _started = rig.launch_on(rig.new_session(), held_job(rig))
    ready(rig)
    before = rig.heartbeat()
    assert rig.answer_heartbeat(before).renewed
    real = session_reports.wall_ms
    monkeypatch.setattr(session_reports, "wall_ms", lambda: real() - 3_600_000)
    return offer, before, rig.restart_executor()


def test_a_worker_whose_clock_stepped_back_resumes_and_its_heartbeats_renew(make_rig, monkeypatch):
    """Issue 26 item 4: heartbeat numbers came from the wall clock. After the worker's clock steps
    back an hour and it restarts within its session lease, Welcome carries the session's stored
    number and the resumed worker numbers on from it: its first heartbeat renews."""
    rig = make_rig()
    offer, before, register = _clock_stepped_back_and_restarted(rig, monkeypatch)
    welcome = rig.resume(register)
    assert welcome.heartbeat_seq == before.seq
    attest = rig.peer.expect(m.Attest, strict=False)  # the survivor, re-bound in its own session
    assert rig.answer_attest(attest).result == "applied"
    wait_until(lambda: rig.ctx.executor_side.journal.get(offer.attempt_id).lease.offer_id == attest.new_slot.offer_id,
               what="the journal re-bound")
    beat = rig.heartbeat()
    assert beat.seq > before.seq
    ack = rig.answer_heartbeat(beat)
    assert (ack.detail, len(ack.renewed), ack.fenced) == ("", 1, [])
    release(rig)
    assert rig.peer.expect(m.Completed, strict=False).exit_code == 0


def test_a_stale_heartbeat_number_is_jumped_past_at_once(make_rig, monkeypatch):
    """Issue 26 item 4: a Welcome without the stored number (a protocol-4 replica's) and a clock
    stepped back: the first heartbeat is answered `stale_seq` with the stored number, and the worker
    jumps past it and beats again at once; that heartbeat renews."""
    rig = make_rig()
    _offer, before, register = _clock_stepped_back_and_restarted(rig, monkeypatch)
    rig.resume(register, heartbeat_seq=None)
    rig.answer_attest(rig.peer.expect(m.Attest, strict=False))
    stale = rig.heartbeat()
    ack = rig.answer_heartbeat(stale)
    assert (ack.detail, ack.last_seq) == ("stale_seq", before.seq)
    again = rig.peer.expect(m.Heartbeat, strict=False)  # at once, not a heartbeat interval later
    assert again.seq > before.seq
    assert len(rig.answer_heartbeat(again).renewed) == 1
    release(rig)


def test_a_row_whose_end_the_control_side_has_is_finished_after_a_restart(make_rig):
    """Simulation seeds 300002, 300005, 310008, 320005: the worker dies after the control side
    committed its Completed and its receipt was deleted, before the journal row was finished.
    The restarted worker finds the process gone and no receipt and attests `ended`, answered
    `superseded` (the attempt succeeded): the row is finished as the Completed's answer would have
    finished it (its log kept for retention to its final offset), never left `started` for good."""
    rig = make_rig()
    offer, _pull, _started = rig.launch_on(rig.new_session(), ["/bin/sh", "-c", "echo out; exit 0"])
    completed = rig.peer.expect(m.Completed, strict=False)
    receipt = Receipt(schema_version=completed.schema_version, run_id=completed.run_id,
                      attempt_id=completed.attempt_id, callback_sequence=completed.callback_sequence,
                      token=completed.token, started_at_ms=completed.started_at_ms,
                      finished_at_ms=completed.finished_at_ms, exit_code=completed.exit_code)
    assert rig.ctx.control_side.completion.complete(completed.run_id, completed.attempt_id, receipt).result == "applied"
    rig.ctx.executor_side.receipts.delete(offer.attempt_id)  # finish's first step; then the process dies
    assert rig.ctx.executor_side.journal.get(offer.attempt_id).state == "started"
    x = rig.ctx.executor_side  # a cluster worker's: its logs are kept for retention
    x.log_retention = LocalLogRetention(x.journal, x.logs, x.local_receipts)
    rig.resume(rig.restart_executor(receipts=True))
    attest = rig.peer.expect(m.Attest, strict=False)
    assert (attest.attempt_id, attest.fact) == (offer.attempt_id, "ended")
    assert (rig.answer_attest(attest).result, rig.repo.runs.get(offer.run_id).state) == ("superseded", "succeeded")
    entry = wait_until(lambda: (e := rig.ctx.executor_side.journal.get(offer.attempt_id)) is not None
                       and e.state == "completed" and e, what="the row finished")
    assert entry.final_offset == len(b"out\n") and entry.purge_after_ms is not None
    for again in _all_of(rig, m.Attest):  # a second look (the restarted ReceiptConsumer's) says no more
        assert (again.attempt_id, again.fact, rig.answer_attest(again).result) == (offer.attempt_id, "ended",
                                                                                  "superseded")
    assert rig.ctx.executor_side.journal.get(offer.attempt_id) == entry
