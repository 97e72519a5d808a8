"""A slow or stalled replica while long jobs run (issue 17, SEMANTICS.md §9 Exchange (protocol 4),
§10 evidence bound to a lease generation): two control replicas, one worker, jobs of unknown
safety (the default) that last 20 s. Either the worker's requests to the replica serving it
arrive 6 s late for a while (a TcpProxy on 127.0.0.1 holds that direction back; the worker's
request timeout is 1.5 s), or that replica is frozen (SIGSTOP) for 8 s. The jobs outlive the
fault; every run must end with its own job's outcome as attempt 1: `succeeded`, exit 0, its
whole log, its token once in the ledger (no `lost`, no attempt 2, nothing ran twice).

Real processes, each stopped by its PID (`Cluster.close`, which closes the proxies too)."""

from __future__ import annotations

import signal
import time

import pytest

from actor_harness import wait_until
from cluster_harness import make_cluster
from tcp_proxy import DOWN, UP
from chaos_steps import _assert_each_ran_once, _assert_no_actor_failed, _request, _running, _task

pytestmark = [pytest.mark.postgres, pytest.mark.chaos]

JOB_S = 20
DELAY_S = 6
DELAY_WINDOW_S = 14
FREEZE_S = 8
# The replica's Offers frame for two runs is ~1 kB (CURVE-boxed); its Nudges, Acks and
# Welcome-less answers are under 300 bytes.
OFFERS_MIN_BYTES = 600
# The default heartbeat (10 s): the replicas' ZMTP heartbeat follows it (a PING every 10 s, the
# connection closed 30 s after one unanswered), so a 6 s delay keeps the connection up, as on a
# slow network path, and the late answers reach the worker. (With 1 s, the replica would drop
# the slow connection after 3 s and its late answers with it.) The leases are the least it allows.
TIMINGS = dict(heartbeat_ms=10_000, session_lease_ms=30_000, run_lease_ms=20_000, recovery_grace_ms=60_000,
               request_timeout_ms=1_500)


def _serving(c) -> int:
    """The index of the replica the worker registered with (its session's replica)."""
    return next(i for i, r in enumerate(c.replicas) if "event=session_open" in r.log())


def _outcomes(c, run_ids: list[str]) -> dict[str, list[tuple]]:
    """run id -> its attempts as (number, status, exit code, error code), for the failure message."""
    rows = c.sql("SELECT run_id, number, status, exit_code, error_code FROM run_attempts "
                 "WHERE run_id = ANY(%s) ORDER BY run_id, number", run_ids)
    out: dict[str, list[tuple]] = {}
    for run_id, *rest in rows:
        out.setdefault(run_id, []).append(tuple(rest))
    return out


def _each_ran_once(c, run_ids: list[str], ledger) -> None:
    c.wait_terminal(run_ids, timeout=JOB_S + 90)
    outcomes = _outcomes(c, run_ids)
    assert all(a == [(1, "succeeded", 0, None)] for a in outcomes.values()), outcomes
    _assert_each_ran_once(c, run_ids, ledger, timeout=30)


@pytest.mark.timeout(240)
def test_a_replica_whose_incoming_traffic_is_6_s_late_leaves_every_long_job_its_own_outcome(tmp_path):
    """The worker reaches both replicas through proxies; its requests to the replica serving it
    are held back 6 s (4x its request timeout) for 14 s, from the moment that replica offered it
    two new runs (so their Activates go out on the slow path) while a third already runs. The
    worker fails over; the late copies of its requests reach the first replica long after the
    other one answered them (the Activate copy finds its job running). Each 20 s job runs to its
    end once and its run succeeds as attempt 1."""
    c = make_cluster(tmp_path, replicas=2, timings=TIMINGS)
    try:
        c.new_key("w1")
        c.allow("w1")
        proxies = c.route_through_proxies("w1")
        c.start_worker("w1", slots=4)
        ledger = tmp_path / "ledger"
        _task(c, "long", ledger, sleep=JOB_S, max_concurrent=3)
        first = _request(c, "long", 1)
        wait_until(lambda: _running(c, first) == 1, 60, "the first job running")
        slow = proxies[_serving(c)]
        # From the moment that replica's Offers pass (the first frame of their size), before the
        # worker has them: its Activates go out on the slow path.
        slow.when(DOWN, OFFERS_MIN_BYTES, lambda: slow.set_delay(UP, DELAY_S))
        more = _request(c, "long", 2)
        every = first + more
        try:
            wait_until(lambda: c.sql("SELECT count(*) FROM runs WHERE id = ANY(%s) AND status <> 'queued'",
                                     more)[0][0], 60, "the new runs offered")
            time.sleep(DELAY_WINDOW_S)
        finally:
            slow.set_delay(UP, 0)
        assert not ledger.exists()  # the jobs outlive the fault: none has ended yet
        _each_ran_once(c, every, ledger)
        _assert_no_actor_failed(c)
    finally:
        c.close()


@pytest.mark.timeout(240)
def test_a_replica_frozen_past_the_request_timeout_leaves_every_long_job_its_own_outcome(tmp_path):
    """The replica serving the worker is frozen (SIGSTOP) for 8 s, past the worker's 1.5 s
    request timeout, from the moment it offered the worker two new runs while a 20 s job runs;
    SIGCONT. The frozen replica's socket buffers the worker's Activates, the worker fails over,
    the other replica activates them, and the thawed one answers its copies late (their jobs
    running by then). Each job runs to its end once and its run succeeds as attempt 1."""
    c = make_cluster(tmp_path, replicas=2, timings=TIMINGS)
    try:
        c.new_key("w1")
        c.allow("w1")
        proxies = c.route_through_proxies("w1")  # only to see when the Offers pass
        c.start_worker("w1", slots=4)
        ledger = tmp_path / "ledger"
        _task(c, "long", ledger, sleep=JOB_S, max_concurrent=3)
        first = _request(c, "long", 1)
        wait_until(lambda: _running(c, first) == 1, 60, "the first job running")
        serving = _serving(c)
        frozen = c.replicas[serving]
        # Frozen the moment its Offers pass, before the worker has them: its Activates wait in
        # the frozen replica's socket.
        frozen_at = []
        proxies[serving].when(DOWN, OFFERS_MIN_BYTES,
                              lambda: frozen.popen.send_signal(signal.SIGSTOP) or frozen_at.append(time.monotonic()))
        more = _request(c, "long", 2)
        every = first + more
        try:
            wait_until(lambda: frozen_at, 60, "the new runs offered")
            time.sleep(FREEZE_S)
        finally:
            frozen.popen.send_signal(signal.SIGCONT)
        assert not ledger.exists()  # the jobs outlive the fault: none has ended yet
        _each_ran_once(c, every, ledger)
        assert frozen.alive() and all(r.alive() for r in c.replicas)
        _assert_no_actor_failed(c)
    finally:
        c.close()
