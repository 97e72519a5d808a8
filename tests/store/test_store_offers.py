"""Batched offers (SEMANTICS.md §9 Offers): one transaction per Pull, capacity and max_concurrent
never oversold, labels, repeated pairs, the frame budget; on SQLite and PostgreSQL, and two
sessions pulling at once on the real PostgreSQL."""

from __future__ import annotations

import json
import secrets
import threading

import pytest
from sqlalchemy import event, func, select

from qlactors.errors import BadInput
from qlactors.store.dispatch.dispatch import Dispatch
from qlactors.store.engine import Store
from qlactors.store.records import Fenced
from qlactors.store.schema import run_dispatch_leases, worker_sessions
from store_helpers import db_state, new_hash, spec


def pairs(n):
    return [(secrets.token_hex(8), new_hash()) for _ in range(n)]


def batch(dispatch, session, the_pairs, **kw):
    kw.setdefault("log_cap_bytes", 0)
    return dispatch.offers.batch(session.worker_id, session.session_id, session.generation, the_pairs, **kw)


def set_labels(repo, session, labels):
    with repo.store.write() as conn:
        conn.execute(worker_sessions.update().where(worker_sessions.c.session_id == session.session_id)
                     .values(labels_json=json.dumps(labels)))


def lease_count(repo):
    with repo.store.read() as conn:
        return conn.execute(select(func.count()).select_from(run_dispatch_leases)).scalar_one()


class Commits:
    """Counts the commits on the store's engine while a block runs."""

    def __init__(self, store):
        self.store, self.n = store, 0

    def _count(self, _conn):
        self.n += 1

    def __enter__(self):
        event.listen(self.store.engine, "commit", self._count)
        return self

    def __exit__(self, *exc):
        event.remove(self.store.engine, "commit", self._count)


def test_n_pairs_get_up_to_n_offers_oldest_first_from_one_transaction(repo, dispatch):
    session = dispatch.sessions.register("w", 8)
    for name in ("a", "b", "c", "d"):
        repo.tasks.add(spec(name), actor_name="tester")
    ids = [repo.runs.request(name).run.id for name in ("a", "b", "c", "d")]
    asked = pairs(3)
    with Commits(repo.store) as commits:
        offers = batch(dispatch, session, asked)
    assert commits.n == 1
    assert [o.run_id for o in offers] == ids[:3]
    assert [o.offer_id for o in offers] == [o for o, _ in asked]  # in pair order
    assert {o.lease_generation for o in offers} == {1}
    for offer, (_, token_hash) in zip(offers, asked):
        run, (attempt,), (lease,), _ = db_state(repo, offer.run_id)
        assert run["status"] == "dispatching" and attempt["status"] == "claimed"
        assert (lease["status"], lease["version"], lease["token_hash"]) == ("leased", 1, token_hash)
    assert repo.runs.get(ids[3]).state == "queued"
    # more pairs than work: only what there is
    assert [o.run_id for o in batch(dispatch, session, pairs(5))] == ids[3:]


def test_a_batch_never_oversells_the_session_capacity(repo, dispatch):
    session = dispatch.sessions.register("small", 2)
    repo.tasks.add(spec(max_concurrent=10), actor_name="tester")
    for _ in range(5):
        repo.runs.request("job")
    first = batch(dispatch, session, pairs(5))
    assert len(first) == 2
    assert batch(dispatch, session, pairs(5)) == []
    dispatch.reports.decline(first[0].fence(_hash_of(repo, first[0])))
    again = batch(dispatch, session, pairs(5))
    assert [(o.run_id, o.lease_generation) for o in again] == [(first[0].run_id, 2)]
    assert lease_count(repo) == 3  # 2 offers + the re-offer; the declined one is released


def _hash_of(repo, offer):
    with repo.store.read() as conn:
        return conn.execute(select(run_dispatch_leases.c.token_hash).where(
            run_dispatch_leases.c.offer_id == offer.offer_id)).scalar_one()


def test_max_concurrent_holds_across_one_batch_and_other_tasks_fill_the_rest(repo, dispatch):
    session = dispatch.sessions.register("w", 8)
    repo.tasks.add(spec("two", max_concurrent=2), actor_name="tester")
    repo.tasks.add(spec("one"), actor_name="tester")
    two = [repo.runs.request("two").run.id for _ in range(4)]
    one = [repo.runs.request("one").run.id for _ in range(2)]
    offers = batch(dispatch, session, pairs(6))
    assert sorted(o.run_id for o in offers) == sorted(two[:2] + one[:1])
    assert [repo.runs.get(r).state for r in two[2:] + one[1:]] == ["queued"] * 3
    assert batch(dispatch, session, pairs(6)) == []


def test_labels_a_revision_requires_must_all_be_the_sessions(repo, dispatch):
    plain = dispatch.sessions.register("plain", 4)
    gpu = dispatch.sessions.register("gpu", 4)
    partial = dispatch.sessions.register("partial", 4)
    set_labels(repo, gpu, ["x", "gpu", "ssd"])
    set_labels(repo, partial, ["gpu"])
    repo.tasks.add(spec("needs", labels=("gpu", "ssd")), actor_name="tester")
    needs = repo.runs.request("needs").run.id
    assert batch(dispatch, plain, pairs(2)) == []
    assert batch(dispatch, partial, pairs(2)) == []
    assert repo.runs.get(needs).state == "queued"
    repo.tasks.add(spec("any"), actor_name="tester")
    anyone = repo.runs.request("any").run.id
    assert [o.run_id for o in batch(dispatch, partial, pairs(2))] == [anyone]  # no labels: any session
    assert [o.run_id for o in batch(dispatch, gpu, pairs(2))] == [needs]


def test_repeated_pairs_answer_the_same_offers_and_take_no_second_lease(repo, dispatch):
    session = dispatch.sessions.register("w", 8)
    for name in ("a", "b", "c"):
        repo.tasks.add(spec(name), actor_name="tester")
        repo.runs.request(name)
    asked = pairs(2)
    first = batch(dispatch, session, asked)
    leases = lease_count(repo)
    assert batch(dispatch, session, asked) == first
    assert lease_count(repo) == leases
    # the same pairs with one fresh pair: the same two again, and one new offer
    fresh = pairs(1)
    mixed = batch(dispatch, session, asked + fresh)
    assert mixed[:2] == first and len(mixed) == 3 and mixed[2].offer_id == fresh[0][0]
    assert lease_count(repo) == leases + 1
    # a known offer id with another token yields nothing, and takes nothing
    assert batch(dispatch, session, [(asked[0][0], new_hash())]) == []
    # a repeated offer whose lease was declined meanwhile is not answered again
    dispatch.reports.decline(first[1].fence(asked[1][1]))
    assert batch(dispatch, session, asked) == first[:1]


def test_the_budget_stops_the_batch_and_the_first_offer_always_goes(repo, dispatch):
    session = dispatch.sessions.register("w", 8)
    for name in ("a", "b", "c", "d"):
        repo.tasks.add(spec(name), actor_name="tester")
        repo.runs.request(name)
    sizes = []

    def size(view):
        sizes.append(view.run_id)
        return 100

    assert len(batch(dispatch, session, pairs(4), budget_bytes=250, size=size)) == 2
    assert len(batch(dispatch, session, pairs(4), budget_bytes=50, size=size)) == 1
    assert lease_count(repo) == 3
    with pytest.raises(BadInput):
        batch(dispatch, session, pairs(1), budget_bytes=10)  # a budget needs a size function


def test_an_unencodable_pick_fails_and_the_batch_goes_on(repo, dispatch):
    session = dispatch.sessions.register("w", 8)
    repo.tasks.add(spec("bad"), actor_name="tester")
    repo.tasks.add(spec("good"), actor_name="tester")
    bad = repo.runs.request("bad").run.id
    good = repo.runs.request("good").run.id

    def check(view):
        if view.task == "bad":
            raise ValueError("over the frame")

    offers = batch(dispatch, session, pairs(2), check=check)
    assert [o.run_id for o in offers] == [good]
    assert (repo.runs.get(bad).state, repo.runs.get(bad).error_code) == ("failed", "OFFER_UNENCODABLE")


def test_a_pull_from_a_session_that_is_not_current_is_fenced_and_takes_nothing(repo, dispatch):
    old = dispatch.sessions.register("w", 8)
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    dispatch.sessions.register("w", 8)
    with pytest.raises(Fenced):
        batch(dispatch, old, pairs(2))
    current = dispatch.sessions.register("w", 8)
    with repo.store.write() as conn:
        conn.execute(worker_sessions.update().where(worker_sessions.c.session_id == current.session_id)
                     .values(lease_expires_at_ms=1))
    with pytest.raises(Fenced):
        batch(dispatch, current, pairs(2))
    assert repo.runs.get(run_id).state == "queued" and lease_count(repo) == 0


def test_a_pull_checks_its_pairs(repo, dispatch):
    session = dispatch.sessions.register("w", 8)
    (offer_id, token_hash), = pairs(1)
    with pytest.raises(BadInput):
        batch(dispatch, session, [])
    with pytest.raises(BadInput):
        batch(dispatch, session, [(offer_id, token_hash), (offer_id, new_hash())])
    with pytest.raises(BadInput):
        batch(dispatch, session, [(offer_id, "raw-token")])


@pytest.mark.postgres
def test_two_sessions_pulling_at_once_never_lease_an_attempt_twice(pg_schema_url):
    """Two replicas' connections, two workers' sessions, batches racing on the real PostgreSQL."""
    from qlactors.store.repository import Repository

    repo = Repository.open(pg_schema_url)
    other = Store(pg_schema_url)  # already migrated by the first
    try:
        for name in ("a", "b", "c", "d"):
            repo.tasks.add(spec(name, max_concurrent=6), actor_name="tester")
        ids = {repo.runs.request(name).run.id for name in ("a", "b", "c", "d") for _ in range(10)}
        dispatchers = [Dispatch.open(repo.store), Dispatch.open(other)]
        sessions = [d.sessions.register(f"w{i}", 40) for i, d in enumerate(dispatchers)]
        barrier, got, errors = threading.Barrier(2), [[], []], []

        def puller(i):
            barrier.wait()
            try:
                for _ in range(30):
                    got[i] += batch(dispatchers[i], sessions[i], pairs(3))
            except Exception as err:  # reported below
                errors.append(err)

        threads = [threading.Thread(target=puller, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        offered = [o.attempt_id for o in got[0] + got[1]]
        assert len(offered) == len(set(offered)) == 24  # 4 tasks x max_concurrent 6
        with repo.store.read() as conn:
            leases = conn.execute(select(run_dispatch_leases.c.attempt_id)).scalars().all()
        assert sorted(leases) == sorted(offered)
        assert {o.run_id for o in got[0] + got[1]} <= ids
    finally:
        other.close()
        repo.close()
