"""The host dies (SEMANTICS.md §10 step 1, issue 11): a worker and every one of its jobs' process
groups killed with SIGKILL, and never started again. Idempotent runs are retried on the other
worker as attempt 2 once the recovery grace has passed since the worker's session ended, and not
before (hexpm's Oban rescue running a job twice a night is what "before" would be); runs of
unknown safety wait, with `status` saying why, until `worker retire --confirm-stopped`, then
end `failed` as their policy says; 22 of them waiting at the head of the recovery order never
hold the idempotent ones back (the candidate query holds the evidence predicate). Every run has
exactly one terminal event."""

from __future__ import annotations

import os
import signal
import time

import pytest

from actor_harness import wait_until
from cluster_harness import make_cluster

pytestmark = [pytest.mark.postgres, pytest.mark.chaos]

GRACE_MS = 35_000  # the least a 5 s session lease allows (session lease + the longest stop grace)
UNSAFE, IDEMPOTENT = 22, 5
TERMINAL_EVENTS = ("run.succeeded", "run.failed", "run.cancelled", "run.timed_out")


@pytest.mark.timeout(360)  # a hang guard: 27 runs, a 35 s grace and 22 `show` commands on a loaded machine
def test_a_dead_host_s_idempotent_runs_move_after_the_grace_and_the_others_wait_for_retire(tmp_path):
    c = make_cluster(tmp_path, replicas=1, timings={"recovery_grace_ms": GRACE_MS})
    release = tmp_path / "release"
    wait_for_release = f"while [ ! -e {release} ]; do sleep 0.2; done; echo ok"
    try:
        for name in ("w1", "w2"):
            c.new_key(name)
            c.allow(name)
        c.start_worker("w1", slots=UNSAFE + IDEMPOTENT)
        c.cli("task", "add", "unsafe", "--max-concurrent", "30", "--", "sh", "-c", wait_for_release)
        c.cli("task", "add", "idem", "--max-concurrent", "30", "--retry-on-lost", "--max-attempts", "2",
              "--safety", "idempotent", "--backoff", "1", "--", "sh", "-c", wait_for_release)

        def running_on_w1() -> int:
            return c.sql("SELECT count(*) FROM run_attempts WHERE worker_id = 'w1' AND status = 'running'")[0][0]

        unsafe = [c.cli("run", "unsafe").stdout.decode().strip() for _ in range(UNSAFE)]
        wait_until(lambda: running_on_w1() == UNSAFE, 120, "the unsafe runs running on w1")
        idem = [c.cli("run", "idem").stdout.decode().strip() for _ in range(IDEMPOTENT)]
        wait_until(lambda: running_on_w1() == UNSAFE + IDEMPOTENT, 120, "every run running on w1")
        c.start_worker("w2", slots=IDEMPOTENT)

        # The host dies: its jobs' process groups and the worker, all at once; nothing restarts.
        pgids = [row[0] for row in c.sql("SELECT pgid FROM run_attempts WHERE worker_id = 'w1' "
                                         "AND status = 'running'")]
        assert len(pgids) == UNSAFE + IDEMPOTENT and all(pgids)
        for pgid in pgids:
            os.killpg(pgid, signal.SIGKILL)
        c.stop(c.workers["w1"], signal.SIGKILL)
        killed_at_ms = time.time_ns() // 1_000_000
        release.touch()  # attempt 2 on w2 finishes at once

        states = c.wait_terminal(idem, timeout=GRACE_MS / 1000 + 60)
        assert {s["state"] for s in states.values()} == {"succeeded"}
        for run_id in idem:
            shown = c.show(run_id)
            first, second = shown["attempts"]
            assert (first["state"], first["error_code"]) == ("lost", "RECOVERY_SESSION_ENDED")
            assert second["state"] == "succeeded" and second["exit_code"] == 0
            assert c.sql("SELECT worker_id FROM run_attempts WHERE id = %s", second["id"])[0][0] == "w2"
        lost_at = [row[0] for row in c.sql(
            "SELECT created_at_ms FROM run_events WHERE type = 'attempt.lost' AND run_id = ANY(%s)", idem)]
        assert len(lost_at) == IDEMPOTENT
        assert min(lost_at) - killed_at_ms >= GRACE_MS  # never before the grace

        # The runs of unknown safety wait, and status says why and what to do.
        assert all(c.show(run_id)["state"] == "running" for run_id in unsafe)
        report = c.cli_json("status")
        waiting = [r for r in report["unresolved_recoveries"] if r["run_id"] in set(unsafe)]
        assert len(waiting) >= 20
        assert all("worker retire w1 --confirm-stopped" in r["why"] for r in waiting), waiting[:2]

        retired = c.cli("worker", "retire", "w1", "--confirm-stopped").stdout.decode()
        assert f"{UNSAFE} attempt(s) marked stopped by the operator" in retired
        states = c.wait_terminal(unsafe, timeout=60)
        assert {s["state"] for s in states.values()} == {"failed"}
        for run_id in unsafe:
            shown = c.show(run_id)
            [attempt] = shown["attempts"]
            assert (attempt["state"], attempt["error_code"]) == ("lost", "RECOVERY_WORKER_RETIRED")
            assert shown["error_code"] == "RUN_LOST_RETRY_DISABLED"
        for run_id in unsafe + idem:
            types = [row[0] for row in c.sql("SELECT type FROM run_events WHERE run_id = %s", run_id)]
            assert sum(t in TERMINAL_EVENTS for t in types) == 1, (run_id, types)
    finally:
        c.close()
