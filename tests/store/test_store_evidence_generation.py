"""Evidence is bound to a lease generation (SEMANTICS.md §10 step 1, issue 17 findings 1 and 7),
on SQLite and PostgreSQL: a fact about lease generation N never ends generation N + 1; every new
lease and every activation clears it; `never_launched` is refused once a start was recorded and
gives a claim back at once; `confirm-stopped RUN`, the operator's word for one attempt."""

from __future__ import annotations

import dataclasses
import json
import secrets

import pytest
from sqlalchemy import select, update

from qlactors.domain.receipt import token_hash
from qlactors.domain.transitions import ErrorCode
from qlactors.errors import BadInput, NotFound
from qlactors.store.cadence.cluster_recovery import ClusterRecoveryCases
from qlactors.store.dispatch.evidence import ConfirmStopped
from qlactors.store.records import LeaseQuote
from qlactors.store.schema import run_attempts, run_events
from qlactors.store.admin.worker_retirement import WorkerRetirement
from store_helpers import db_state, new_hash
from session_steps import IDENTITY, Flight, attest, beat, complete, expire_lease, launch, register

GRACE_MS = 120_000


@pytest.fixture
def worker(dispatch):
    return register(dispatch, "w1")


@pytest.fixture
def cases(repo):
    return ClusterRecoveryCases(repo.store, recovery_grace_ms=GRACE_MS, drain_grace_ms=GRACE_MS)


def evidence_of(repo, attempt_id) -> tuple:
    with repo.store.read() as conn:
        return tuple(conn.execute(select(
            run_attempts.c.evidence, run_attempts.c.evidence_lease_generation, run_attempts.c.evidence_by,
            run_attempts.c.lease_generation).where(run_attempts.c.id == attempt_id)).one())


def page_ids(cases) -> list[str]:
    page, _more = cases.page(16)
    return [c.attempt_id for c in page]


def start(dispatch, fence):
    return dispatch.reports.started(fence, IDENTITY.boot_id, IDENTITY.pid, IDENTITY.pgid, IDENTITY.start_ticks)


def offer_again(dispatch, session, run_id, *, activated=True, started=True) -> Flight:
    """The next offer to `session` (the attempt given back), activated and started by default."""
    lease_hash = new_hash()
    offer = dispatch.offers.one(session.worker_id, session.session_id, session.generation,
                           secrets.token_hex(8), lease_hash, log_cap_bytes=0, lease_ttl_ms=30_000)
    assert offer is not None and offer.run_id == run_id
    fence = offer.fence(lease_hash)
    token = secrets.token_urlsafe(32)
    if activated:
        assert dispatch.reports.activate(fence, token_hash(token), "log").result == "applied"
    if started:
        assert start(dispatch, fence).result == "applied"
    quote = LeaseQuote(run_id, offer.attempt_id, offer.offer_id, offer.lease_generation, lease_hash)
    return Flight(offer, fence, quote, token)


def assert_waits(repo, cases, flight) -> None:
    """The attempt's lease lapsed inside a live session: recovery has nothing to act on."""
    expire_lease(repo, flight.quote.attempt_id)
    before = db_state(repo, flight.quote.run_id)
    assert flight.quote.attempt_id not in page_ids(cases)
    assert cases.waiting_for(flight.quote.attempt_id) is not None
    run, attempts, _leases, _events = db_state(repo, flight.quote.run_id)
    assert (run["status"], attempts[-1]["status"]) == ("running", "running")
    assert db_state(repo, flight.quote.run_id) == before


def assert_lost(repo, cases, flight, code) -> None:
    page, _more = cases.page(16)
    mine = [c for c in page if c.attempt_id == flight.quote.attempt_id]
    assert len(mine) == 1 and cases.resolve(mine[0]).result == "applied"
    run, attempts, _leases, _events = db_state(repo, flight.quote.run_id)
    assert (run["status"], attempts[-1]["status"], attempts[-1]["error_code"]) == ("lost", "lost", code)


# -- a fact about lease generation N never ends generation N + 1 ------------------------------

def test_a_give_back_of_a_claim_never_ends_the_next_lease_of_its_attempt(repo, dispatch, cases, worker):
    """The issue's report: an Activate fenced `lease_expired` (or a re-register) gives the claim
    back as `never_launched`; the attempt is offered again, runs, and its run lease lapses inside
    a live session (a freeze past the run lease): it must wait, not end RECOVERY_NEVER_LAUNCHED."""
    first = launch(repo, dispatch, worker, activated=False, started=False)
    assert attest(dispatch, worker, first, worker, "never_launched").result == "applied"
    second = offer_again(dispatch, worker, first.quote.run_id)
    assert second.quote.lease_generation == 2
    assert evidence_of(repo, second.quote.attempt_id)[0] is None
    assert_waits(repo, cases, second)


@pytest.mark.parametrize("fact", ["stopped", "ended", "ended_with_receipt", "launch_unknown"])
def test_a_fact_recorded_for_a_claim_is_cleared_by_its_activation(repo, dispatch, cases, worker, fact):
    flight = launch(repo, dispatch, worker, activated=False, started=False)
    assert attest(dispatch, worker, flight, worker, fact).result == "applied"
    assert evidence_of(repo, flight.quote.attempt_id)[:2] == (fact, 1)
    assert dispatch.reports.activate(flight.fence, token_hash(flight.token), "log").result == "applied"
    assert evidence_of(repo, flight.quote.attempt_id)[:3] == (None, None, None)
    assert start(dispatch, flight.fence).result == "applied"
    assert_waits(repo, cases, flight)


def test_a_fact_about_a_declined_lease_is_cleared_by_the_re_offer(repo, dispatch, cases, worker):
    flight = launch(repo, dispatch, worker, activated=False, started=False)
    assert attest(dispatch, worker, flight, worker, "stopped").result == "applied"
    assert dispatch.reports.decline(flight.fence).result == "applied"
    again = offer_again(dispatch, worker, flight.quote.run_id, activated=False, started=False)
    assert evidence_of(repo, again.quote.attempt_id) == (None, None, None, 2)


def test_recovery_trusts_a_fact_only_for_the_current_lease_generation(repo, dispatch, cases, worker):
    """However an old fact survived (a replica of the previous release wrote it, or a row from
    before schema 9 that names no generation), it is not trusted, and the waiting reason says so."""
    flight = launch(repo, dispatch, worker)
    attest(dispatch, worker, flight, worker, "stopped")
    expire_lease(repo, flight.quote.attempt_id)
    for stale, words in ((None, "the recorded `stopped` names no lease generation, not the current 1"),
                         (2, "the recorded `stopped` is about lease generation 2, not the current 1")):
        with repo.store.write() as conn:
            conn.execute(update(run_attempts).where(run_attempts.c.id == flight.quote.attempt_id)
                         .values(evidence_lease_generation=stale))
        assert page_ids(cases) == []
        why = cases.waiting_for(flight.quote.attempt_id)
        assert why is not None and f"waiting for evidence: {words}" in why.reason
    with repo.store.write() as conn:
        conn.execute(update(run_attempts).where(run_attempts.c.id == flight.quote.attempt_id)
                     .values(evidence_lease_generation=1))
    assert_lost(repo, cases, flight, ErrorCode.RECOVERY_PROCESS_STOPPED)


def test_a_started_voids_a_never_launched_recorded_before_it(repo, dispatch, cases, worker):
    """An earlier copy of the Activate committed, the worker's journal still said `accepted`: its
    `never_launched` is recorded; then a Started lands, so it was launched after all."""
    flight = launch(repo, dispatch, worker, started=False)
    assert attest(dispatch, worker, flight, worker, "never_launched").result == "applied"
    assert evidence_of(repo, flight.quote.attempt_id)[:2] == ("never_launched", 1)
    assert start(dispatch, flight.fence).result == "applied"
    assert evidence_of(repo, flight.quote.attempt_id)[:2] == (None, None)
    assert_waits(repo, cases, flight)


def stale_stopped(repo, flight) -> None:
    """A `stopped` that speaks of no lease the attempt holds (written before schema 9)."""
    with repo.store.write() as conn:
        conn.execute(update(run_attempts).where(run_attempts.c.id == flight.quote.attempt_id)
                     .values(evidence="stopped", evidence_lease_generation=None))


def test_rebooted_replaces_a_fact_about_an_older_lease_and_names_the_current_one(repo, dispatch, cases, worker):
    flight = launch(repo, dispatch, worker)
    stale_stopped(repo, flight)
    register(dispatch, "w1", boot_id="boot-2")
    assert evidence_of(repo, flight.quote.attempt_id) == ("rebooted", 1, None, 1)
    expire_lease(repo, flight.quote.attempt_id)
    assert_lost(repo, cases, flight, ErrorCode.RECOVERY_HOST_REBOOTED)


def test_retired_replaces_a_fact_about_an_older_lease_and_names_the_current_one(repo, dispatch, cases, worker):
    flight = launch(repo, dispatch, worker)
    stale_stopped(repo, flight)
    assert WorkerRetirement(repo.store).retire("w1").attempts == (flight.quote.attempt_id,)
    assert evidence_of(repo, flight.quote.attempt_id) == ("retired", 1, None, 1)
    expire_lease(repo, flight.quote.attempt_id)
    assert_lost(repo, cases, flight, ErrorCode.RECOVERY_WORKER_RETIRED)


# -- never_launched -------------------------------------------------------------------------

def test_never_launched_after_a_recorded_start_is_refused_and_changes_nothing(repo, dispatch, worker):
    flight = launch(repo, dispatch, worker)
    before = db_state(repo, flight.quote.run_id)
    result = attest(dispatch, worker, flight, worker, "never_launched")
    assert (result.result, result.detail) == ("refused", "started")
    assert db_state(repo, flight.quote.run_id) == before


def test_never_launched_after_a_running_re_bind_is_refused(repo, dispatch, worker):
    flight = launch(repo, dispatch, worker, started=False)  # its Started never landed
    restarted = register(dispatch, "w1")
    bound = attest(dispatch, restarted, flight, worker, new_lease_token_hash=(token := new_hash()),
                   new_offer_id="offer-2")
    assert (bound.result, bound.value.lease_generation) == ("applied", 2)
    rebound = flight._replace(quote=dataclasses.replace(flight.quote, offer_id="offer-2", lease_generation=2,
                                                        lease_token_hash=token))
    before = db_state(repo, flight.quote.run_id)
    result = attest(dispatch, restarted, rebound, restarted, "never_launched")
    assert (result.result, result.detail) == ("refused", "started")
    assert db_state(repo, flight.quote.run_id) == before


def test_never_launched_for_a_claim_releases_its_lease_at_once_and_it_is_offered_again(repo, dispatch, worker):
    flight = launch(repo, dispatch, worker, activated=False, started=False)
    result = attest(dispatch, worker, flight, worker, "never_launched")
    assert (result.result, result.detail, result.value.lease_generation, result.value.lease_version) == (
        "applied", "released", 1, 2)
    run, (attempt,), (lease,), _events = db_state(repo, flight.quote.run_id)
    assert (lease["status"], lease["release_reason"], lease["version"]) == ("released", "declined", 2)
    assert (run["status"], attempt["status"], attempt["evidence"]) == ("dispatching", "claimed", None)
    assert attempt["lease_version"] == 2
    # A repeat (its answer was lost) gets the same answer and changes nothing more.
    before = db_state(repo, flight.quote.run_id)
    again = attest(dispatch, worker, flight, worker, "never_launched")
    assert (again.result, again.detail, again.value.lease_version) == ("applied", "released", 2)
    assert db_state(repo, flight.quote.run_id) == before
    # A late Activate of the given-back lease launches nothing; the next Pull offers it again.
    assert dispatch.reports.activate(flight.fence, token_hash(flight.token), "log").result == "fenced"
    other = register(dispatch, "w2")
    assert offer_again(dispatch, other, flight.quote.run_id, activated=False,
                       started=False).quote.lease_generation == 2


# -- confirm-stopped RUN ----------------------------------------------------------------------

def test_confirm_stopped_ends_the_attempt_lost_with_the_operator_recorded(repo, dispatch, cases, worker):
    flight = launch(repo, dispatch, worker)
    attest(dispatch, worker, flight, worker, "launch_unknown")  # never trusted: it waits
    expire_lease(repo, flight.quote.attempt_id)
    assert page_ids(cases) == []
    done = ConfirmStopped(repo.store).confirm_stopped(flight.quote.run_id, "alice")
    assert (done.result, done.detail, done.value.attempt_id, done.value.by, done.value.lease_generation) == (
        "applied", None, flight.quote.attempt_id, "alice", 1)
    assert evidence_of(repo, flight.quote.attempt_id) == ("confirmed_stopped", 1, "alice", 1)
    again = ConfirmStopped(repo.store).confirm_stopped(flight.quote.run_id, "bob")
    assert (again.result, again.detail, again.value.by) == ("applied", "already_confirmed_stopped", "alice")
    assert evidence_of(repo, flight.quote.attempt_id)[2] == "alice"
    assert_lost(repo, cases, flight, ErrorCode.RECOVERY_CONFIRMED_STOPPED)


def test_confirm_stopped_keeps_a_trusted_fact_about_the_current_lease(repo, dispatch, worker):
    flight = launch(repo, dispatch, worker)
    attest(dispatch, worker, flight, worker, "stopped")
    expire_lease(repo, flight.quote.attempt_id)
    done = ConfirmStopped(repo.store).confirm_stopped(flight.quote.run_id, "alice")
    assert (done.result, done.detail) == ("applied", "already_stopped")
    assert evidence_of(repo, flight.quote.attempt_id)[:3] == ("stopped", 1, None)


def test_confirm_stopped_speaks_only_of_the_lease_it_was_given_for(repo, dispatch, cases, worker):
    """The worker comes back after all and re-attests the process running: the new lease clears
    the operator's word, and the re-bound attempt is not ended by it."""
    flight = launch(repo, dispatch, worker)
    expire_lease(repo, flight.quote.attempt_id)
    assert ConfirmStopped(repo.store).confirm_stopped(flight.quote.run_id, "alice").result == "applied"
    restarted = register(dispatch, "w1")
    token = new_hash()
    assert attest(dispatch, restarted, flight, worker, new_lease_token_hash=token,
                  new_offer_id="offer-2").value.lease_generation == 2
    assert evidence_of(repo, flight.quote.attempt_id) == (None, None, None, 2)
    assert_waits(repo, cases, flight)


def test_confirm_stopped_refuses_without_a_matching_attempt_and_writes_nothing(repo, dispatch, cases, worker):
    confirm = ConfirmStopped(repo.store).confirm_stopped
    with pytest.raises(NotFound, match="no run ghost"):
        confirm("ghost", "alice")
    with pytest.raises(BadInput):
        confirm("ghost", " ")
    live = launch(repo, dispatch, worker)
    claimed = launch(repo, dispatch, worker, activated=False, started=False)
    ended = launch(repo, dispatch, worker)
    complete(repo, ended)
    lost = launch(repo, dispatch, worker)
    attest(dispatch, worker, lost, worker, "stopped")
    expire_lease(repo, lost.quote.attempt_id)
    assert_lost(repo, cases, lost, ErrorCode.RECOVERY_PROCESS_STOPPED)
    expire_lease(repo, claimed.quote.attempt_id)  # even expired: a claim never ran
    expected = [(live, "lease_live", "running"), (claimed, "attempt_claimed", "dispatching"),
                (ended, "run_succeeded", "succeeded"), (lost, "attempt_lost", "lost")]
    for flight, detail, run_status in expected:
        before = db_state(repo, flight.quote.run_id)
        done = confirm(flight.quote.run_id, "alice")
        assert (done.result, done.detail, done.run_state) == ("refused", detail, run_status)
        assert db_state(repo, flight.quote.run_id) == before
    assert confirm(live.quote.run_id, "alice").value.lease_expires_at_ms is not None


def test_a_renewal_of_the_confirmed_generation_withdraws_the_operators_word(repo, dispatch, cases, worker):
    """Issue 26 item 2: the operator confirms a lapsed lease stopped; the worker's queued heartbeat
    then renews that same generation. The renewal proves the worker holds the lease: the statement
    is cleared in the renewal's transaction, `attempt.evidence_withdrawn` names who had said it
    and when, and the next lapse of the run lease waits (no RECOVERY_CONFIRMED_STOPPED)."""
    flight = launch(repo, dispatch, worker)
    expire_lease(repo, flight.quote.attempt_id)
    confirmed = ConfirmStopped(repo.store).confirm_stopped(flight.quote.run_id, "alice")
    assert confirmed.result == "applied"
    answer = beat(dispatch, worker, 1, flight.quote)
    assert ([r[0] for r in answer.renewed], answer.fenced) == ([flight.quote.attempt_id], ())
    assert evidence_of(repo, flight.quote.attempt_id) == (None, None, None, 1)
    (withdrawn,) = events_of(repo, flight.quote.run_id, "attempt.evidence_withdrawn")
    assert withdrawn.attempt_id == flight.quote.attempt_id and withdrawn.actor_type == "executor"
    assert json.loads(withdrawn.payload_json) == {
        "fact": "confirmed_stopped", "by": "alice", "at_ms": confirmed.value.now_ms, "lease_generation": 1}
    assert_waits(repo, cases, flight)
    # A renewal with nothing to withdraw appends nothing.
    beat(dispatch, worker, 2, flight.quote)
    assert len(events_of(repo, flight.quote.run_id, "attempt.evidence_withdrawn")) == 1


def events_of(repo, run_id: str, kind: str) -> list:
    with repo.store.read() as conn:
        return list(conn.execute(select(run_events).where(run_events.c.run_id == run_id)
                                 .where(run_events.c.type == kind).order_by(run_events.c.sequence)))
