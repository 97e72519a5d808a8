"""Transient database failures are retried, shown in `status`, and only a persistent one stops
the runtime (issue 9 §2).

The failures are real: another connection holds SQLite's write lock (`BEGIN IMMEDIATE`) longer
than the store's busy timeout (shortened to 100 ms here), so every write the runtime tries fails
with "database is locked"; on PostgreSQL the server terminates the store's connection.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from qlactors.domain.receipt import token_hash
from qlactors.runtime.home import RuntimeLock, read_store_outage
from qlactors.errors import StoreUnavailable
from qlactors.store.health import ErrorTally, StoreHealth
from qlactors.store.repository import Repository
from qlactors.wire import messages as m

from actor_harness import ActorHarness, db_state, unique_endpoint, wait_until
from actor_rigs import SupervisorRig, make_exe, new_token, spec, start_supervised_gateway  # noqa: F401 - make_exe is a fixture
from qlactors.ids import new_id
from outage_rig import short_busy_timeout, write_locked  # noqa: F401 - fixtures


@pytest.fixture
def make_sup(tmp_path, short_busy_timeout):
    made: list[ActorHarness] = []

    def make(**runtime: int) -> SupervisorRig:
        endpoint = unique_endpoint("control")
        h = ActorHarness(tmp_path, control_bind=endpoint, **runtime)
        made.append(h)
        return start_supervised_gateway(h, endpoint)

    yield make
    for h in made:
        h.close()


def status(home, *extra: str) -> str:
    """The real `qlactors status` command (a runtime is "up": the test holds the home's lock)."""
    done = subprocess.run([sys.executable, "-m", "qlactors", "--home", str(home), "status", *extra],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done
    return done.stdout


def test_a_report_that_meets_a_locked_database_is_answered_once_it_is_free_and_status_says_why(make_sup):
    sup = make_sup()
    h = sup.h
    sup.register()
    offer, lease_token = sup.offered()
    before = db_state(sup.repo, offer.run_id)
    lock = RuntimeLock(h.config.home)  # `status` shows runtime files only while a runtime is up
    lock.acquire()
    try:
        with write_locked(h.config.home / "qlactors.db"):
            sup.peer.send(m.Activate(request_id=new_id(), **sup.fence(offer, lease_token), callback_token_hash=token_hash(new_token()),
                                     log_artifact_id="ab/attempt.log"))
            outage = wait_until(lambda: (o := read_store_outage(h.config.home)) and o["failures"] >= 2 and o,
                                what="the outage published, retried")
            assert "database is locked" in outage["error"]
            assert outage["stop_after_ms"] == 60_000
            sup.peer.quiet(0.3)  # the answer is withheld: nothing was applied
            assert db_state(sup.repo, offer.run_id) == before
            text = status(h.config.home)
            assert "database: failing since " in text and "database is locked" in text
            assert "retrying, the runtime stops if it lasts 60 s" in text
            assert json.loads(status(h.config.home, "--json"))["store_outage"]["error"] == outage["error"]
            assert sup.alive()
        activated = sup.peer.expect(m.Activated)  # handled again once the database answers
        assert activated.attempt_id == offer.attempt_id
        wait_until(lambda: read_store_outage(h.config.home) is None, what="the outage cleared")
        assert json.loads(status(h.config.home, "--json"))["store_outage"] is None
    finally:
        lock.release()
    run, attempts, _, events = db_state(sup.repo, offer.run_id)
    assert attempts[0]["status"] == "starting" and events == before[3] + 1  # applied exactly once
    assert sup.alive()


def test_a_pull_during_an_outage_gets_its_offer_afterwards(make_sup):
    sup = make_sup()
    sup.register()
    sup.repo.tasks.add(spec("job"), actor_name="tester")
    sup.repo.runs.request("job")
    with write_locked(sup.h.config.home / "qlactors.db"):
        sup.peer.send(pull := sup.pull_message(pairs=[("pull-1", new_token())]))
        wait_until(lambda: read_store_outage(sup.h.config.home), what="the outage published")
        sup.peer.quiet(0.3)
    answer = sup.peer.expect(m.Offers)
    assert answer.pull_id == pull.pull_id and [o.offer_id for o in answer.offers] == ["pull-1"]
    assert sup.alive()


def test_a_database_failing_longer_than_store_outage_stop_ms_stops_the_runtime_with_a_clear_reason(make_sup):
    sup = make_sup(store_outage_stop_ms=1_000)
    sup.register()
    offer, lease_token = sup.offered()
    with write_locked(sup.h.config.home / "qlactors.db"):
        sup.peer.send(m.Activate(request_id=new_id(), **sup.fence(offer, lease_token), callback_token_hash=token_hash(new_token()),
                                 log_artifact_id="ab/attempt.log"))
        fatal = sup.h.ctx.fatal
        wait_until(fatal.event.is_set, what="the runtime to stop")
        assert fatal.reason.startswith("the database has failed every transaction for ")
        assert "store_outage_stop_ms = 1000" in fatal.reason and "database is locked" in fatal.reason
        assert "fix the database, then start the runtime again" in fatal.reason
    assert sup.ref.is_alive()  # the Gateway did not crash: the outage was judged persistent


def test_store_health_tracks_one_outage_and_calls_persistent_once():
    now = [100.0]
    health = StoreHealth(clock=lambda: now[0], wall_ms=lambda: 5_000)
    changes, stops = [], []
    health.watch(limit_s=2.0, on_change=changes.append, on_persistent=stops.append)
    health.succeeded()
    assert health.outage() is None and changes == []
    health.failed("connection reset", write=False)
    health.succeeded(write=False)  # only reads failed: a read that works ends it
    assert health.outage() is None and changes.pop() is None and changes.pop().failures == 1
    health.failed("database is locked\n(more)")
    now[0] += 1.5
    health.failed("disk I/O error")
    assert stops == []
    outage = health.outage()
    assert (outage.since_ms, outage.seconds, outage.failures, outage.error) == (5_000, 1.5, 2, "disk I/O error")
    now[0] += 1.0
    health.failed("disk I/O error")
    health.failed("disk I/O error")
    assert [s.seconds for s in stops] == [2.5]  # once
    health.succeeded(write=False)  # a read gets through while writes fail: still an outage
    assert health.outage() is not None
    health.succeeded()
    assert health.outage() is None and changes[-1] is None
    assert [c.failures for c in changes[:-1]] == [1, 2, 3, 4] and changes[0].error == "database is locked (more)"
    # The tally (a replica's row in a cluster `status`) counts every failure, across outages.
    assert health.tally() == ErrorTally(5, "disk I/O error", 5_000)
    assert StoreHealth().tally() == ErrorTally(0, None, None)


@pytest.mark.postgres
def test_a_postgresql_connection_reset_is_a_transient_store_error_and_the_next_transaction_works(pg_schema_url):
    import psycopg

    from conftest import _pg_admin_conninfo

    repo = Repository.open(pg_schema_url)
    try:
        with pytest.raises(StoreUnavailable, match="is unavailable"):
            with repo.store.read() as conn:
                pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
                with psycopg.connect(_pg_admin_conninfo(), autocommit=True) as admin:
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                conn.exec_driver_sql("SELECT 1").scalar_one()
        assert repo.store.health.outage() is not None
        with repo.store.read() as conn:  # the next transaction gets a fresh connection
            assert conn.exec_driver_sql("SELECT 1").scalar_one() == 1
        assert repo.store.health.outage() is None
    finally:
        repo.close()


def test_an_offer_the_executor_cannot_journal_during_an_outage_is_accepted_once_the_database_answers(
        short_busy_timeout, make_exe):
    rig = make_exe()
    pull = rig.welcome()
    rig.repo.tasks.add(spec("job"), actor_name="tester")
    rig.repo.runs.request("job")
    offer = rig.offer_for(pull)
    with write_locked(rig.h.config.home / "qlactors.db"):
        rig.send_offers(pull, offer)
        wait_until(lambda: read_store_outage(rig.h.config.home), what="the outage published")
        rig.peer.quiet(0.3)  # nothing journaled, nothing asked
        assert rig.ref.is_alive()
    act = rig.peer.expect(m.Activate)
    assert act.attempt_id == offer.attempt_id
    assert rig.ctx.executor_side.journal.get(offer.attempt_id).callback_token_hash == act.callback_token_hash
    assert not rig.h.ctx.fatal.event.is_set()
