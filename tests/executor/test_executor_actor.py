"""The Executor actor alone, with the real ReceiptConsumer and the real store, driven through its real
ZeroMQ endpoint by a test peer playing the control side (ARCHITECTURE.md "The wire",
docs/protocol.md, SEMANTICS.md §4-§6).

The harness (tests/harness/actor_harness.py) builds the EdgeContext on a SQLite file in a temp
home and starts one actor; the other names in the Directory are recording stubs. The rigs are
tests/harness/actor_rigs.py's.
"""

from __future__ import annotations

import dataclasses
import signal
import stat
from typing import Any

from qlactors.domain.receipt import token_hash
from qlactors.process.identity import Liveness, probe, read_identity
from qlactors.runtime.signals import ActorFailed, Consume
from qlactors.wire import codec
from qlactors.wire import messages as m

from actor_harness import (
    ActorHarness, ack_message, offers_message, register_message, wait_until, welcome_message,
)
from actor_rigs import _body, BOOT_ID, spec, new_token, now_ms, ExecutorRig, make_exe  # noqa: F401 - fixtures


def test_executor_registers_then_pulls_after_welcome(make_exe):
    rig = make_exe()
    assert rig.register == dataclasses.replace(register_message("local", BOOT_ID),
                                               request_id=rig.register.request_id,
                                               register_id=rig.register.register_id,
                                               worker_clock_ms=rig.register.worker_clock_ms)
    assert rig.register.request_id and rig.register.register_id
    assert abs(rig.register.worker_clock_ms - now_ms()) < 60_000  # its own clock, for the skew
    pull = rig.welcome()
    s = rig.ctx.executor_side.session
    assert (pull.worker_id, pull.session_id, pull.session_generation, len(pull.offers)) == (
        s.worker_id, s.session_id, s.generation, 1)
    [pair] = pull.offers
    assert pull.pull_id and pair.offer_id and len(pair.lease_token) >= 32


def test_executor_pulls_one_pair_per_free_slot_and_accepts_a_batch_of_offers_in_one_go(make_exe):
    rig = make_exe(slots=3)
    assert rig.register.capacity == 3
    pull = rig.welcome()
    assert len(pull.offers) == 3  # one (offer id, lease token) pair per free slot
    assert len({p.offer_id for p in pull.offers}) == 3 and len({p.lease_token for p in pull.offers}) == 3
    for i in range(2):
        rig.repo.tasks.add(spec(f"job{i}", sleeper(rig)), actor_name="tester")
        rig.repo.runs.request(f"job{i}")
    first, second = rig.offer_for(pull, 0), rig.offer_for(pull, 2)  # any of the pairs may be used
    rig.send_offers(pull, first, second)
    acts = {a.attempt_id: a for a in (rig.peer.expect(m.Activate), rig.peer.expect(m.Activate))}
    assert set(acts) == {first.attempt_id, second.attempt_id}
    assert acts[first.attempt_id].lease_token == pull.offers[0].lease_token
    assert acts[second.attempt_id].lease_token == pull.offers[2].lease_token
    assert {e.attempt_id for e in rig.ctx.executor_side.journal.list()} == set(acts)
    # Fewer offers than pairs: nothing more to offer now, so no pull until a Nudge; then one pair.
    rig.peer.quiet()
    rig.peer.send(m.Nudge())
    again = rig.peer.expect(m.Pull)
    assert len(again.offers) == 1 and again.pull_id != pull.pull_id


def test_executor_runs_an_offer_end_to_end_through_the_real_receipt_consumer(make_exe):
    rig = make_exe()
    pull = rig.welcome()
    rig.repo.tasks.add(spec("job", ["/bin/sh", "-c", "echo hi; exit 4"]), actor_name="tester")
    run_id = rig.repo.runs.request("job").run.id
    offer = rig.offer_for(pull)
    rig.send_offers(pull, offer)

    act = rig.peer.expect(m.Activate)
    assert (act.worker_id, act.session_id, act.session_generation, act.run_id, act.attempt_id, act.offer_id,
            act.lease_generation, act.lease_version) == (
        pull.worker_id, pull.session_id, pull.session_generation, run_id, offer.attempt_id, offer.offer_id,
        offer.lease_generation, offer.lease_version)
    assert act.lease_token == pull.offers[0].lease_token
    assert len(act.callback_token_hash) == 64 and int(act.callback_token_hash, 16) >= 0
    log_path = rig.ctx.executor_side.logs.path_for(run_id, offer.attempt_id)
    assert act.log_artifact_id == rig.ctx.executor_side.logs.artifact_id(run_id, offer.attempt_id)
    assert log_path.is_file() and stat.S_IMODE(log_path.stat().st_mode) == 0o600
    entry = rig.ctx.executor_side.journal.get(offer.attempt_id)
    assert (entry.state, entry.run_id, entry.callback_token_hash) == ("accepted", run_id, act.callback_token_hash)

    activated = rig.activate(act)
    started = rig.peer.expect(m.Started)
    rig.h.track_group(started.pgid)
    assert (started.run_id, started.attempt_id, started.lease_token, started.lease_version) == (
        run_id, offer.attempt_id, pull.offers[0].lease_token, activated.lease_version)
    assert started.boot_id == BOOT_ID
    assert started.pgid == started.pid  # its own session and group (setsid)
    entry = rig.ctx.executor_side.journal.get(offer.attempt_id)
    assert entry.state in ("started", "completed")
    assert (entry.identity.pid, entry.identity.pgid, entry.identity.start_ticks) == (
        started.pid, started.pgid, started.start_ticks)
    rig.ack_started(started)

    completed = rig.peer.expect(m.Completed, strict=False)
    assert (completed.run_id, completed.attempt_id, completed.exit_code) == (run_id, offer.attempt_id, 4)
    assert token_hash(completed.token) == act.callback_token_hash
    assert (completed.schema_version, completed.callback_sequence) == (2, 1)
    assert completed.session_id == rig.ctx.executor_side.session.session_id
    assert completed.started_at_ms <= completed.finished_at_ms
    assert rig.ack_completed(completed) == "applied"

    wait_until(lambda: rig.ctx.executor_side.journal.get(offer.attempt_id) is None, what="journal row cleared")
    assert not rig.ctx.executor_side.receipts.final_path(offer.attempt_id).exists()
    run = rig.repo.runs.get(run_id)
    assert (run.state, run.attempts[0].exit_code) == ("failed", 4)
    assert log_path.read_bytes() == b"hi\n"
    # Its slot is free again, in the database too: nudged as the Supervisor does after a committed
    # completion, it pulls once more, with a fresh offer id and lease token.
    rig.peer.send(m.Nudge())
    again = rig.peer.expect(m.Pull, strict=False)
    assert again.pull_id != pull.pull_id and again.offers[0] != pull.offers[0]
    assert rig.alive()


# The job announces itself (a file next to the home) before sleeping, and stops are sent only once
# it runs: a TERM that lands while the launcher is still setting up is ignored by it (its
# `trap '' TERM` phase), so the stop would only take effect by KILL after the grace.
def sleeper(rig: ExecutorRig) -> list[str]:
    return ["/bin/sh", "-c", f"echo ready; : > {rig.h.config.home.parent / 'READY'}; exec sleep 30"]


def job_running(rig: ExecutorRig) -> None:
    ready = rig.h.config.home.parent / "READY"
    wait_until(ready.exists, what="the job runs")


def test_executor_stop_requested_terms_the_process_group_and_the_receipt_says_143(make_exe):
    rig = make_exe()
    offer, _, started = rig.launch(sleeper(rig), stop_grace_ms=5_000)
    identity = read_identity(started.pid, boot_id=BOOT_ID)  # the real launcher, from /proc
    assert (identity.pgid, identity.start_ticks) == (started.pgid, started.start_ticks)
    assert probe(identity, current_boot_id=BOOT_ID) is Liveness.RUNNING
    rig.ack_started(started)
    assert rig.repo.runs.cancel(offer.run_id).result == "requested"
    job_running(rig)

    rig.peer.send(m.StopRequested(run_id=offer.run_id, attempt_id=offer.attempt_id, reason="user", grace_ms=5_000))
    completed = rig.peer.expect(m.Completed, strict=False)
    assert completed.exit_code == 128 + signal.SIGTERM
    assert rig.ack_completed(completed) == "applied"
    run = rig.repo.runs.get(offer.run_id)
    assert (run.state, run.attempts[0].exit_code) == ("cancelled", 143)
    wait_until(lambda: probe(identity, current_boot_id=BOOT_ID) is not Liveness.RUNNING, what="group gone")
    wait_until(lambda: rig.ctx.executor_side.journal.get(offer.attempt_id) is None, what="journal row cleared")


def test_executor_a_fenced_started_stops_the_process_by_identity(make_exe):
    rig = make_exe()
    offer, _, started = rig.launch(sleeper(rig), stop_grace_ms=5_000)
    identity = read_identity(started.pid, boot_id=BOOT_ID)
    job_running(rig)
    rig.peer.send(ack_message("started", offer.run_id, offer.attempt_id, "fenced", "lease_token",
                              offer_id=offer.offer_id, answer_to=started.request_id))
    completed = rig.peer.expect(m.Completed, strict=False)
    assert completed.exit_code == 143
    wait_until(lambda: probe(identity, current_boot_id=BOOT_ID) is not Liveness.RUNNING, what="group gone")


def test_executor_a_running_jobs_output_reaches_its_log(make_exe):
    rig = make_exe()
    offer, _, started = rig.launch(sleeper(rig))
    job_running(rig)
    log = rig.ctx.executor_side.logs.path_for(offer.run_id, offer.attempt_id)
    wait_until(lambda: log.read_bytes() == b"ready\n", timeout=1.0, what="the output in the log")


def test_executor_refused_activation_clears_the_journal_and_frees_the_slot(make_exe):
    rig = make_exe()
    pull = rig.welcome()
    rig.repo.tasks.add(spec(), actor_name="tester")
    rig.repo.runs.request("job")
    offer = rig.offer_for(pull)
    rig.send_offers(pull, offer)
    act = rig.peer.expect(m.Activate)
    assert rig.ctx.executor_side.journal.get(act.attempt_id) is not None
    rig.peer.send(ack_message("activate", act.run_id, act.attempt_id, "refused", "cancel_requested",
                              offer_id=act.offer_id, answer_to=act.request_id))
    again = rig.peer.expect(m.Pull)  # the slot is free: it pulls again, never spawns
    assert again.offers[0].offer_id != pull.offers[0].offer_id and len(again.offers) == 1
    assert rig.ctx.executor_side.journal.get(act.attempt_id) is None
    rig.peer.quiet()
    assert rig.alive()


def test_executor_no_offers_means_no_activity_until_a_nudge(make_exe):
    rig = make_exe()
    pull = rig.welcome()
    rig.send_offers(pull)
    rig.peer.quiet()
    rig.peer.send(m.Nudge())
    again = rig.peer.expect(m.Pull)
    assert again.pull_id != pull.pull_id and again.offers[0] != pull.offers[0]


def test_executor_a_stray_heartbeat_ack_or_attested_changes_nothing(make_exe):
    """Edge sends no heartbeat, and an Attested only answers: neither starts or stops anything."""
    rig = make_exe()
    pull = rig.welcome()
    rig.peer.send(m.HeartbeatAck(answer_to="", seq=1, session_ended=True, session_expires_at_ms=None, renewed=[],
                                 fenced=[m.FencedLease(attempt_id="a1", lease_generation=1, reason="lease_released")],
                                 detail="stale session"))
    rig.peer.send(m.Attested(answer_to="", run_id="r1", attempt_id="a1", fact="ended", result="fenced", offer_id=None,
                             lease_generation=None, lease_version=None, lease_expires_at_ms=None,
                             detail="stale session"))
    rig.peer.quiet()
    assert rig.alive() and rig.ctx.executor_side.journal.list() == []
    # Its Pull is still the one waiting: the answer to it is accepted.
    rig.repo.tasks.add(spec(), actor_name="tester")
    rig.repo.runs.request("job")
    rig.send_offers(pull, offer := rig.offer_for(pull))
    assert rig.peer.expect(m.Activate).attempt_id == offer.attempt_id


def test_executor_ignores_an_offer_for_a_pull_it_did_not_send(make_exe):
    rig = make_exe()
    pull = rig.welcome()
    rig.repo.tasks.add(spec(), actor_name="tester")
    rig.repo.runs.request("job")
    offer = rig.offer_for(pull)
    rig.peer.send(dataclasses.replace(offers_message(pull, offer), pull_id="stranger"))
    # Not its pull: it holds nothing for that attempt and says so (recovery then frees the lease).
    given_back = rig.peer.expect(m.Attest)
    assert (given_back.attempt_id, given_back.fact, given_back.lease) == (offer.attempt_id, "never_launched", None)
    assert rig.ctx.executor_side.journal.list() == []
    rig.send_offers(pull, offer)  # the genuine one is still accepted
    rig.peer.expect(m.Activate)


def test_executor_drops_malformed_frames_from_the_control_side_and_keeps_working(make_exe):
    rig = make_exe()
    pull = rig.welcome()
    rig.peer.send_frames([b"\x00garbage"])
    no_offers = dict(kind="offers", answer_to=pull.request_id, worker_id=pull.worker_id, session_id=pull.session_id,
                     session_generation=pull.session_generation, pull_id=pull.pull_id, offers=[])
    rig.peer.send_frames([b"QLACTORS/1", _body(kind="idle", offer_id=pull.offers[0].offer_id)])
    rig.peer.send_frames([codec.HEADER, _body(**no_offers, extra=True)])
    rig.peer.quiet()  # the executor side has nothing to answer a bad frame with
    wait_until(lambda: rig.h.bridge.rejected_frames == 3, what="three rejected frames")
    assert rig.alive()
    rig.peer.send_frames([codec.HEADER, _body(**no_offers)])
    rig.peer.send(m.Nudge())
    rig.peer.expect(m.Pull)


def test_executor_re_adopts_a_surviving_launcher_from_its_journal(make_exe, tmp_path):
    survivor: dict[str, Any] = {}

    def journal_a_survivor(h: ActorHarness) -> None:
        proc, identity = h.spawn_sleep(30)
        attempt_id, run_id = "att-survivor", "run-survivor"
        h.ctx.executor_side.journal.accept(attempt_id, run_id, str(tmp_path / "x.log"), str(tmp_path / "x.json"),
                             token_hash(new_token()))
        h.ctx.executor_side.journal.set_state(attempt_id, "started", identity=identity)
        survivor.update(identity=identity, run_id=run_id, attempt_id=attempt_id)

    rig = make_exe(before=journal_a_survivor, real_receipts=False)
    rig.peer.send(welcome_message(rig.ctx.executor_side.session))
    rig.peer.quiet()  # its one slot is the survivor's: no pull
    assert rig.alive(), rig.h.inbox.items("supervisor", ActorFailed)
    rig.peer.send(m.StopRequested(run_id=survivor["run_id"], attempt_id=survivor["attempt_id"],
                                  reason="user", grace_ms=5_000))
    # Re-adopted: stopped by its exact identity (the test process is its parent, so the executor
    # may reap it itself: judge by /proc, not by an exit status).
    wait_until(lambda: probe(survivor["identity"], current_boot_id=BOOT_ID) is not Liveness.RUNNING,
               what="the survivor stopped")
    [consume] = rig.h.inbox.wait("receipts", Consume)  # its end was noticed (pidfd), not polled
    assert consume == Consume(survivor["run_id"], survivor["attempt_id"], stopped_by="term")
    rig.peer.quiet()  # no pull of its own: the slot is free only once control has recorded the end
    rig.peer.send(m.Nudge())  # as the Supervisor does then
    rig.peer.expect(m.Pull)


def test_executor_keeps_no_state_for_an_attempt_that_completed(make_exe):
    rig = make_exe()
    offer, _, started = rig.launch(["true"])
    rig.ack_started(started)
    completed = rig.peer.expect(m.Completed, strict=False)
    rig.ack_completed(completed)
    wait_until(lambda: rig.ctx.executor_side.journal.get(offer.attempt_id) is None, what="journal row cleared")
    proxy = rig.ref.proxy()
    wait_until(lambda: proxy.slots.live.get() == {}, what="its exit processed")
    assert not hasattr(rig.ref.proxy(), "ended_without_receipt")  # how it ended travels with Consume
