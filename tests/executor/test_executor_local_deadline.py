"""A cluster worker cut off from every replica enforces its jobs' deadlines itself (SEMANTICS.md
§7): past its own deadline (activation on its clock + timeout) a local timeout intent goes into
its journal, then the stop by exact identity; while a replica answers its heartbeats it leaves
the stop to the control side. Real Executor and ReceiptConsumer, heartbeats every 100 ms."""

from __future__ import annotations

import logging
import time

from qlactors.profiles.worker import WorkerFacts
from qlactors.wire import messages as m

from actor_harness import WAIT_S
from actor_rigs import spec
from cluster_rigs import ClusterRig, held_job, make_rig, ready, release  # noqa: F401

TIMEOUT_MS = 1_500


def launch_with_timeout(rig: ClusterRig) -> tuple[m.Offer, m.Started, float]:
    """A held job with a timeout, on a session whose heartbeats run every 100 ms; when it started."""
    rig.welcome_to(rig.new_session(), heartbeat_ms=100)
    pull = rig.peer.expect(m.Pull, strict=False)
    rig.repo.tasks.add(spec("job", held_job(rig), timeout_ms=TIMEOUT_MS), actor_name="tester")
    rig.repo.runs.request("job")
    offer = rig.offer_for(pull)
    rig.send_offers(pull, offer)
    rig.activate(rig.peer.expect(m.Activate, strict=False))
    t0 = time.monotonic()
    started = rig.peer.expect(m.Started, strict=False)
    rig.h.track_group(started.pgid)
    rig.ack_started(started)
    ready(rig)
    return offer, started, t0


def test_a_worker_cut_off_from_every_replica_times_its_job_out_itself(make_rig, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, logger="qlactors")

    def worker_facts(h) -> None:  # what a worker's Completed adds: "finished in time" on its clock
        h.ctx.executor_side.completion_facts = WorkerFacts(h.ctx.executor_side.journal, h.ctx.executor_side.logs)

    rig = make_rig(before=worker_facts)
    offer, _started, t0 = launch_with_timeout(rig)
    # No heartbeat is answered from here on: no replica is reachable.
    completed = rig.peer.expect(m.Completed, timeout=WAIT_S, strict=False)
    waited = time.monotonic() - t0
    assert (completed.attempt_id, completed.exit_code, completed.stopped_by) == (offer.attempt_id, 143, "term")
    assert completed.finished_in_time is False  # the report: it ended past this worker's deadline
    assert waited >= TIMEOUT_MS / 1000  # not before its own deadline
    entry = rig.ctx.executor_side.journal.get(offer.attempt_id)  # the intent committed before the stop
    assert entry.timeout_intent_at_ms is not None and entry.timeout_intent_at_ms >= entry.local_deadline_ms
    assert entry.local_deadline_ms == entry.activated_at_ms + TIMEOUT_MS
    assert "event=local_timeout" in caplog.text
    assert caplog.text.index("event=local_timeout") < caplog.text.index("event=stop_term")


def test_a_worker_whose_heartbeats_are_answered_leaves_the_timeout_to_the_control_side(make_rig, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, logger="qlactors")
    rig = make_rig()
    offer, _started, t0 = launch_with_timeout(rig)
    while time.monotonic() - t0 < TIMEOUT_MS / 1000 + 0.8:  # past its deadline, every beat answered
        message = rig.peer.recv(timeout=WAIT_S)
        assert not isinstance(message, m.Completed), message
        if isinstance(message, m.Heartbeat):
            rig.answer_heartbeat(message)
    assert rig.ctx.executor_side.journal.get(offer.attempt_id).timeout_intent_at_ms is None
    release(rig)
    completed = rig.peer.expect(m.Completed, strict=False)
    assert (completed.exit_code, completed.stopped_by) == (0, "exit")
    assert "event=local_timeout" not in caplog.text and "event=stop_term" not in caplog.text


def test_nudges_and_refusals_naming_no_request_do_not_keep_a_cut_off_worker_from_its_deadline(make_rig, caplog):  # noqa: F811
    """Protocol 4 (§9 Exchange, §7): a revoked worker hears only refusals of frames its replicas
    will not read, and Nudges: neither answers a request, so neither counts as hearing a replica,
    and the worker still times its job out itself."""
    from actor_harness import ack_message
    from qlactors.wire.curve import REFUSED_KEY

    caplog.set_level(logging.INFO, logger="qlactors")
    rig = make_rig()
    offer, _started, t0 = launch_with_timeout(rig)
    while True:
        message = rig.peer.recv(timeout=WAIT_S)
        if isinstance(message, m.Completed):
            break
        # Every frame answered with what a replica sends a key it no longer knows, and a Nudge.
        rig.peer.send(ack_message("unknown", "", "", "refused", REFUSED_KEY))
        rig.peer.send(m.Nudge())
    assert (message.attempt_id, message.stopped_by) == (offer.attempt_id, "term")
    assert time.monotonic() - t0 >= TIMEOUT_MS / 1000
    assert "event=local_timeout" in caplog.text
