"""A cluster Gateway answers a repeated request with its first answer (SEMANTICS.md §9 Owed
reports, Pull once), on SQLite and PostgreSQL: the real Gateway with a replica's
`ClusterSessions` on the harness's store, a test peer as the worker sending each copy with the
same request id. A second Gateway on the same database plays the other replica."""

from __future__ import annotations

import secrets

import pytest
from sqlalchemy import func, select

from qlactors.domain.receipt import token_hash
from qlactors.ids import new_id
from qlactors.store.schema import worker_requests
from qlactors.wire import messages as m

from cluster_rigs import start_cluster_gateway as start_gateway
from store_helpers import db_state, spec

W = "w1"


@pytest.fixture
def replicas(tmp_path, store_url):
    """Two Gateways (two replicas) on one database, and a worker's socket to each."""
    first = start_gateway(tmp_path / "a", store_url)
    try:
        second = start_gateway(tmp_path / "b", store_url)
        try:
            yield first, second
        finally:
            second[0].close()
    finally:
        first[0].close()


def pull_of(session, pairs) -> m.Pull:
    return m.Pull(request_id=new_id(), worker_id=W, session_id=session.session_id,
                  session_generation=session.generation, pull_id=new_id(),
                  offers=[m.OfferSlot(offer_id=o, lease_token=t) for o, t in pairs])


def test_a_repeated_decline_is_answered_applied_again_and_releases_the_lease_once(replicas):
    (h, peer), (_h2, other) = replicas
    session = h.ctx.control_side.dispatch.sessions.register(W, 2, boot_id="b", session_lease_ms=60_000)
    h.repo.tasks.add(spec("job"), actor_name="tester")
    run_id = h.repo.runs.request("job").run.id
    offer_id, lease_token = secrets.token_hex(8), secrets.token_urlsafe(32)
    offer = h.ctx.control_side.dispatch.offers.one(W, session.session_id, session.generation, offer_id, token_hash(lease_token),
                                 log_cap_bytes=0, lease_ttl_ms=60_000)
    decline = m.Decline(request_id=new_id(), worker_id=W, session_id=session.session_id,
                        session_generation=session.generation, run_id=run_id, attempt_id=offer.attempt_id,
                        offer_id=offer_id, lease_generation=offer.lease_generation, lease_token=lease_token,
                        lease_version=offer.lease_version, reason="draining")
    answers = []
    for to in (peer, peer, other):  # a re-sent copy, then a copy that reached the other replica
        to.send(decline)
        answers.append(to.expect(m.Ack))
    assert [(a.answer_to, a.of, a.result, a.detail) for a in answers] == [(decline.request_id, "decline",
                                                                            "applied", "")] * 3
    leases = db_state(h.repo, run_id)[2]
    assert [(lease["status"], lease["release_reason"], lease["version"]) for lease in leases] == [
        ("released", "declined", 2)]


def test_a_pull_repeated_after_its_answer_left_a_pair_unused_claims_nothing_new(replicas):
    (h, peer), (_h2, other) = replicas
    session = h.ctx.control_side.dispatch.sessions.register(W, 4, boot_id="b", session_lease_ms=60_000)
    h.repo.tasks.add(spec("job"), actor_name="tester")
    first_run = h.repo.runs.request("job").run.id
    pull = pull_of(session, [(secrets.token_hex(8), secrets.token_urlsafe(32)) for _ in range(2)])
    peer.send(pull)
    first = peer.expect(m.Offers)
    assert first.answer_to == pull.request_id and [o.run_id for o in first.offers] == [first_run]
    h.repo.tasks.add(spec("other"), actor_name="tester")
    waiting = h.repo.runs.request("other").run.id  # the unused pair could take it now
    for to in (peer, other):
        to.send(pull)
        again = to.expect(m.Offers)
        assert again.answer_to == pull.request_id
        assert again.offers == first.offers
    run, _attempts, leases, _events = db_state(h.repo, waiting)
    assert run["status"] == "queued" and leases == []
    with h.repo.store.read() as conn:
        assert conn.execute(select(func.count()).select_from(worker_requests)).scalar_one() == 1

