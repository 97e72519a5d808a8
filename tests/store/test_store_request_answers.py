"""The answer ledger (SEMANTICS.md §9 Owed reports, Pull once), on SQLite and PostgreSQL: a
repeated Pull, Activate, Started, StartFailed, Decline, Completed, Attest and Leave — the same
request id, at the same replica or at another one, in turn or at once — gets its first answer
and changes nothing more, even where its facts alone would now be judged otherwise.

"Another replica" is a second `Repository` on the same database, with its own Dispatch,
CompletionService and ReportBatch, as a second control replica holds them.
"""

from __future__ import annotations

import secrets
import threading

import pytest
from sqlalchemy import func, select, update

from qlactors.domain.receipt import Receipt, token_hash
from qlactors.domain.results import Outcome, Result
from qlactors.ids import new_id
from qlactors.store.dispatch.completion import CompletionService
from qlactors.store.dispatch.dispatch import Dispatch
from qlactors.store.records import Activation, LeaseTerms
from qlactors.store.dispatch.report_batch import Report, ReportBatch
from qlactors.store.dispatch.report_locks import LockRequest
from qlactors.store.repository import Repository
from qlactors.store.dispatch.request_answers import RETENTION_MS, AnswerKey, PullAnswer, RequestAnswers, decode, encode
from qlactors.store.schema import worker_requests
from store_helpers import db_state, new_hash, spec
from session_steps import IDENTITY, launch, register

W = "w1"


class Replica:
    """One control replica's store objects on its own connections, with the ledger on."""

    def __init__(self, url: str) -> None:
        self.repo = Repository.open(url)
        self.dispatch = Dispatch.open(self.repo.store)
        self.completion = CompletionService(self.repo.store)
        self.batch = ReportBatch(self.repo.store, ledger=True)

    # Each report as the Gateway builds it (`Gateway._report_of`), applied alone.
    def _one(self, locks, apply, kind, result_type, request_id):
        return self.batch.apply([Report(locks, apply, answer=AnswerKey(W, request_id, kind, result_type))])[0]

    def activate(self, fence, callback_hash, request_id):
        return self._one(LockRequest(fence.attempt_id, fence.run_id, fence, revision=True),
                         lambda c, r: self.dispatch.reports.activate_in(c, r, fence, callback_hash, "log"),
                         "activate", Outcome[Activation], request_id)

    def started(self, fence, request_id):
        return self._one(LockRequest(fence.attempt_id, fence.run_id, fence),
                         lambda c, r: self.dispatch.reports.started_in(c, r, fence, IDENTITY.boot_id, IDENTITY.pid,
                                                               IDENTITY.pgid, IDENTITY.start_ticks),
                         "started", Outcome[None], request_id)

    def start_failed(self, fence, request_id):
        return self._one(LockRequest(fence.attempt_id, fence.run_id, fence),
                         lambda c, r: self.dispatch.reports.start_failed_in(c, r, fence, "spawn failed"),
                         "start_failed", Outcome[None], request_id)

    def decline(self, fence, request_id):
        return self._one(LockRequest(fence.attempt_id, fence.run_id, fence),
                         lambda c, r: self.dispatch.reports.decline_in(c, r, fence),
                         "decline", Outcome[None], request_id)

    def complete(self, flight, request_id):
        receipt = Receipt(schema_version=2, run_id=flight.quote.run_id, attempt_id=flight.quote.attempt_id,
                          callback_sequence=1, token=flight.token, started_at_ms=1, finished_at_ms=2,
                          exit_code=0, output_open=0)
        return self._one(LockRequest(flight.quote.attempt_id, flight.quote.run_id, live_lease=True),
                         lambda c, r: self.completion.complete_in(c, r, flight.quote.run_id, flight.quote.attempt_id,
                                                                  receipt, 0, "exit", worker_id=W,
                                                                  final_log_offset=0),
                         "completed", Outcome[None], request_id)

    def pull(self, session, pairs, request_id):
        return self.dispatch.offers.batch(session.worker_id, session.session_id, session.generation, pairs,
                                         log_cap_bytes=0, lease_ttl_ms=30_000,
                                         answer=AnswerKey(W, request_id, "pull", PullAnswer))

    def attest(self, session, flight, fact, request_id):
        return self.dispatch.attestations.apply(W, session.session_id, session.generation, flight.quote,
                                    flight.offer.session_id, flight.offer.session_generation, fact,
                                    run_lease_ms=30_000, answer=AnswerKey(W, request_id, "attest", Outcome[LeaseTerms]))

    def leave(self, session, status, request_id):
        return self.dispatch.sessions.end(W, session.session_id, session.generation, status=status,
                                         answer=AnswerKey(W, request_id, "leave", Outcome[None]))

    def close(self) -> None:
        self.repo.close()


@pytest.fixture
def replicas(store_url):
    first, second = Replica(store_url), Replica(store_url)
    try:
        yield first, second
    finally:
        second.close()
        first.close()


def kept(repo) -> int:
    with repo.store.read() as conn:
        return conn.execute(select(func.count()).select_from(worker_requests)).scalar_one()


def flight_of(replica, session, **kw):
    return launch(replica.repo, replica.dispatch, session, **kw)


def test_a_repeated_pull_replays_its_first_offers_and_claims_nothing_for_the_pairs_it_left_unused(replicas):
    a, b = replicas
    session = register(a.dispatch, W)
    a.repo.tasks.add(spec("job"), actor_name="tester")
    first_run = a.repo.runs.request("job").run.id
    pairs = [(secrets.token_hex(8), new_hash()) for _ in range(3)]
    request_id = new_id()
    offers = a.pull(session, pairs, request_id)
    assert [o.run_id for o in offers] == [first_run]  # two pairs left unused
    a.repo.tasks.add(spec("other"), actor_name="tester")
    second_run = a.repo.runs.request("other").run.id  # queued work the unused pairs could take now
    before = db_state(a.repo, first_run), db_state(a.repo, second_run)
    for replica in (a, b):  # at the same replica, then at another one
        again = replica.pull(session, pairs, request_id)
        assert again == offers
    assert (db_state(a.repo, first_run), db_state(a.repo, second_run)) == before
    assert db_state(a.repo, second_run)[0]["status"] == "queued" and db_state(a.repo, second_run)[2] == []
    assert kept(a.repo) == 1
    # A Pull with another request id takes the queued run (the ledger holds back only repeats).
    assert [o.run_id for o in b.pull(session, [(secrets.token_hex(8), new_hash())], new_id())] == [second_run]


def test_a_repeated_empty_pull_stays_empty_when_work_arrives(replicas):
    a, b = replicas
    session = register(a.dispatch, W)
    a.repo.tasks.add(spec("job"), actor_name="tester")
    pairs = [(secrets.token_hex(8), new_hash())]
    request_id = new_id()
    assert a.pull(session, pairs, request_id) == []
    run_id = a.repo.runs.request("job").run.id
    assert b.pull(session, pairs, request_id) == []
    assert db_state(a.repo, run_id)[0]["status"] == "queued"


def test_a_repeated_activate_gets_its_first_answer_after_the_job_started(replicas):
    a, b = replicas
    session = register(a.dispatch, W)
    flight = flight_of(a, session, activated=False, started=False, timeout_ms=60_000)
    request_id, callback = new_id(), token_hash(flight.token)
    first = a.activate(flight.fence, callback, request_id)
    assert first.result == "applied" and first.value.deadline_at_ms is not None and first.detail is None
    assert a.started(flight.fence, new_id()).result == "applied"
    before = db_state(a.repo, flight.quote.run_id)
    for replica in (a, b):
        assert replica.activate(flight.fence, callback, request_id) == first  # by its facts: refused
    assert db_state(a.repo, flight.quote.run_id) == before


def test_a_repeated_started_gets_its_first_answer_after_the_attempt_ended(replicas):
    a, b = replicas
    session = register(a.dispatch, W)
    flight = flight_of(a, session, started=False)
    request_id = new_id()
    first = a.started(flight.fence, request_id)
    assert (first.result, first.detail, first.run_state) == ("applied", None, "running")
    assert a.complete(flight, new_id()).result == "applied"
    before = db_state(a.repo, flight.quote.run_id)
    for replica in (a, b):
        assert replica.started(flight.fence, request_id) == first  # by its facts: fenced
    assert db_state(a.repo, flight.quote.run_id) == before


def test_a_repeated_start_failure_gets_applied_again_and_changes_nothing(replicas):
    a, b = replicas
    session = register(a.dispatch, W)
    flight = flight_of(a, session, started=False)
    request_id = new_id()
    first = a.start_failed(flight.fence, request_id)
    assert (first.result, first.run_state) == ("applied", "failed")
    before = db_state(a.repo, flight.quote.run_id)
    for replica in (a, b):
        assert replica.start_failed(flight.fence, request_id) == first  # by its facts: fenced
    assert db_state(a.repo, flight.quote.run_id) == before


def test_a_repeated_decline_gets_applied_again_and_changes_nothing(replicas):
    a, b = replicas
    session = register(a.dispatch, W)
    flight = flight_of(a, session, activated=False, started=False)
    request_id = new_id()
    first = a.decline(flight.fence, request_id)
    assert first.result == "applied"
    before = db_state(a.repo, flight.quote.run_id)
    for replica in (a, b):
        assert replica.decline(flight.fence, request_id) == first  # by its facts: fenced lease_released
    assert db_state(a.repo, flight.quote.run_id) == before
    assert kept(a.repo) == 1


def test_a_repeated_completed_gets_applied_again_and_changes_nothing(replicas):
    a, b = replicas
    session = register(a.dispatch, W)
    flight = flight_of(a, session)
    request_id = new_id()
    first = a.complete(flight, request_id)
    assert (first.result, first.run_state) == ("applied", "succeeded")
    before = db_state(a.repo, flight.quote.run_id)
    for replica in (a, b):
        assert replica.complete(flight, request_id) == first  # by its facts: already_terminal
    assert db_state(a.repo, flight.quote.run_id) == before


def test_a_repeated_attest_gets_its_first_answer_after_a_new_session(replicas):
    a, b = replicas
    session = register(a.dispatch, W)
    flight = flight_of(a, session)
    request_id = new_id()
    first = a.attest(session, flight, "stopped", request_id)
    assert first.result == "applied"
    register(a.dispatch, W)  # the worker's next generation: the attesting session is superseded
    before = db_state(a.repo, flight.quote.run_id)
    for replica in (a, b):
        assert replica.attest(session, flight, "stopped", request_id) == first  # by its facts: fenced
    assert db_state(a.repo, flight.quote.run_id) == before


def test_a_repeated_leave_gets_its_first_answer_after_a_new_session(replicas):
    a, b = replicas
    session = register(a.dispatch, W)
    request_id = new_id()
    first = a.leave(session, "draining", request_id)
    assert first == Outcome("applied")
    register(a.dispatch, W)  # superseded: by its facts a Leave of it is fenced now
    for replica in (a, b):
        assert replica.leave(session, "draining", request_id) == first
    assert kept(a.repo) == 1


def test_a_request_id_of_another_kind_is_not_its_answer(replicas):
    a, _b = replicas
    session = register(a.dispatch, W)
    flight = flight_of(a, session, activated=False, started=False)
    request_id = new_id()
    assert a.leave(session, "draining", request_id).result == "applied"
    assert a.decline(flight.fence, request_id).result == "applied"  # judged by its facts
    assert db_state(a.repo, flight.quote.run_id)[2][0]["status"] == "released"


def test_without_a_ledger_nothing_is_kept(repo, dispatch):
    """Edge: the Gateway's ReportBatch has no ledger and its Pulls name no request."""
    session = register(dispatch, W)
    flight = launch(repo, dispatch, session, activated=False, started=False)
    batch = ReportBatch(repo.store)
    report = Report(LockRequest(flight.fence.attempt_id, flight.fence.run_id, flight.fence),
                    lambda c, r: dispatch.reports.decline_in(c, r, flight.fence),
                    answer=AnswerKey(W, new_id(), "decline", Outcome[None]))
    assert batch.apply([report])[0].result == "applied"
    assert kept(repo) == 0


def test_prune_deletes_only_answers_older_than_the_retention_oldest_first(replicas):
    a, _b = replicas
    session = register(a.dispatch, W)
    ids = [new_id() for _ in range(5)]
    for request_id in ids:
        a.leave(session, "draining", request_id)
    with a.repo.store.write() as conn:
        now = a.repo.store.now_ms(conn)
        for age, request_id in enumerate(ids[:3]):  # three past the retention, the oldest first
            conn.execute(update(worker_requests).where(worker_requests.c.request_id == request_id)
                         .values(created_at_ms=now - RETENTION_MS - 1_000 + age))
    ledger = RequestAnswers(a.repo.store)
    assert ledger.prune(page=2) == 2
    assert ledger.prune(page=2) == 1
    assert ledger.prune(page=2) == 0
    with a.repo.store.read() as conn:
        left = set(conn.execute(select(worker_requests.c.request_id)).scalars())
    assert left == set(ids[3:])


# -- two replicas at once (PostgreSQL: the copies really race on the locks) ----------------------

def race(*calls):
    barrier = threading.Barrier(len(calls), timeout=10)
    results: list = [None] * len(calls)
    errors: list = []

    def run(i, fn):
        try:
            barrier.wait()
            results[i] = fn()
        except Exception as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads) and errors == [], errors
    return results


@pytest.mark.postgres
def test_two_copies_racing_on_two_replicas_get_one_answer_and_one_effect(pg_schema_url):
    a, b = Replica(pg_schema_url), Replica(pg_schema_url)
    try:
        session = register(a.dispatch, W, capacity=64)
        # All offered first: a declined attempt is offered again to the next pull.
        flights = [(flight_of(a, session, activated=False, started=False), flight_of(a, session))
                   for _ in range(10)]
        for decline, done in flights:
            rid_decline, rid_done = new_id(), new_id()
            declined = race(lambda: a.decline(decline.fence, rid_decline), lambda: b.decline(decline.fence, rid_decline))
            assert [o.result for o in declined] == ["applied", "applied"]
            leases = db_state(a.repo, decline.quote.run_id)[2]
            assert [(lease["status"], lease["version"]) for lease in leases] == [("released", 2)]
            completed = race(lambda: a.complete(done, rid_done), lambda: b.complete(done, rid_done))
            assert completed[0] == completed[1] and completed[0].result == "applied"
        declined = sorted(decline.quote.run_id for decline, _done in flights)
        pairs = [(secrets.token_hex(8), new_hash()) for _ in range(12)]
        rid_pull = new_id()
        pulled = race(lambda: a.pull(session, pairs, rid_pull), lambda: b.pull(session, pairs, rid_pull))
        assert pulled[0] == pulled[1] and sorted(o.run_id for o in pulled[0]) == declined  # offered again, once
        assert all(len([lease for lease in db_state(a.repo, run_id)[2] if lease["status"] == "leased"]) == 1
                   for run_id in declined)
    finally:
        b.close()
        a.close()


@pytest.mark.parametrize("result_type, result", [
    (Outcome[None], Outcome(Result.APPLIED, None, "running")),
    (Outcome[None], Outcome(Result.REFUSED, "bad_token", "running")),
    (Outcome[Activation], Outcome(Result.APPLIED, "already_starting", value=Activation(1_700_000_000_000, 2))),
    (Outcome[Activation], Outcome(Result.REFUSED, "cancel_requested", value=Activation(lease_version=3))),
    (Outcome[Activation], Outcome(Result.FENCED, "lease_token")),
    (Outcome[LeaseTerms], Outcome(Result.APPLIED, "rebound", value=LeaseTerms(2, 1, 1_700_000_030_000))),
    (Outcome[LeaseTerms], Outcome(Result.SUPERSEDED, "later_attempt")),
    (PullAnswer, PullAnswer(("offer-1", "offer-2"))),
])
def test_an_answer_reads_back_as_it_was_kept(result_type, result):
    assert decode(result_type, encode(result)) == result


@pytest.mark.parametrize("result_type, kept, expected", [
    # rows a replica wrote before the one Outcome (kept up to 24 h across an upgrade)
    (Outcome[None], '{"reason":"bad_token","result":"refused","run_state":"running"}',
     Outcome(Result.REFUSED, "bad_token", "running")),
    (Outcome[None], '{"detail":null,"result":"applied","run_state":"succeeded"}',
     Outcome(Result.APPLIED, None, "succeeded")),
    (Outcome[Activation], '{"deadline_at_ms":null,"detail":null,"lease_version":1,"result":"applied"}',
     Outcome(Result.APPLIED, value=Activation(None, 1))),
    (Outcome[LeaseTerms], '{"detail":"rebound","expires_at_ms":9,"lease_generation":2,"lease_version":1,'
                          '"result":"applied"}', Outcome(Result.APPLIED, "rebound", value=LeaseTerms(2, 1, 9))),
    (Outcome[LeaseTerms], '{"detail":"lease_token","expires_at_ms":null,"lease_generation":null,'
                          '"lease_version":null,"result":"fenced"}', Outcome(Result.FENCED, "lease_token")),
])
def test_an_answer_kept_in_the_earlier_form_reads_back_the_same(result_type, kept, expected):
    assert decode(result_type, kept) == expected
