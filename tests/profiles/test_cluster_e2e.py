"""The cluster on real processes: control replicas on the real PostgreSQL, workers over tcp with
real CURVE keys, jobs as real processes; the CLI reads results from the control side."""

from __future__ import annotations

import signal
import time

import pytest

from actor_harness import wait_until
from cluster_harness import make_cluster
from qlactors.wire.curve_keys import load_public_key

pytestmark = pytest.mark.postgres


@pytest.fixture
def cluster(tmp_path):
    c = make_cluster(tmp_path, replicas=1)
    yield c
    c.close()


def _run(cluster, task: str) -> str:
    return cluster.cli("run", task).stdout.decode().strip()


def test_a_job_runs_on_a_worker_and_its_exit_code_and_log_are_read_from_the_control_side(cluster):
    cluster.new_key("w1")
    cluster.allow("w1")
    cluster.start_worker("w1", slots=2)
    cluster.cli("task", "add", "hello", "--", "sh", "-c", "printf 'out\\n'; printf 'err\\n' >&2; exit 3")
    run_id = _run(cluster, "hello")
    final = cluster.wait_terminal([run_id], timeout=60)[run_id]
    assert final["state"] == "failed"
    shown = cluster.show(run_id)
    assert [a["exit_code"] for a in shown["attempts"]] == [3]
    # The log is shipped in chunks; `logs` prints the job's bytes exactly once they are in.
    wait_until(lambda: cluster.cli("logs", run_id).stdout == b"out\nerr\n", 30, "the shipped log")


def test_an_unknown_key_cannot_register_and_runs_wait(cluster):
    cluster.new_key("stranger")
    cluster.cli("task", "add", "t", "--", "true")
    run_id = _run(cluster, "t")
    proc = cluster._spawn("worker-stranger", ["worker", "--config", str(
        cluster.worker_config("stranger", slots=1, labels=()))])
    cluster.workers["stranger"] = proc
    key = load_public_key(cluster.keys / "stranger.key").decode("ascii")
    replica = cluster.replicas[0]

    def denied() -> list[str]:
        return [line for line in replica.log().splitlines()
                if "event=curve_denied " in line and f" key={key} reason=unknown_key" in line]
    try:
        # The replica's authenticator refused exactly this key at the CURVE handshake (an unknown
        # key never gets a frame through; a revoked one is refused per frame, below).
        wait_until(denied, 30, f"the replica to log event=curve_denied key={key} reason=unknown_key")
        wait_until(lambda: f"event=link_refused endpoint=tcp://127.0.0.1:{cluster.ports[0]} key={key} " in proc.log(),
                   30, "the worker to log that the replica refused its key")
        assert proc.alive()  # it keeps trying: the operator may still allow its key
        assert all(w["worker_id"] != "stranger" for w in cluster.cli_json("workers"))
        assert cluster.show(run_id)["state"] == "queued"
    finally:
        cluster.stop(proc)


HANG_GUARD_500_S = 360  # 1,000 jobs through two replicas took 150 s on a loaded machine; 500 take ~50 s idle


@pytest.mark.timeout(HANG_GUARD_500_S)
def test_two_replicas_two_workers_run_500_jobs_each_exactly_once(tmp_path):
    """500 queued runs of three short jobs on two replicas and two workers: every run terminal
    with its own exit code, each job ran once (one ledger line per run), logs exact, and neither
    a worker's slots nor a task's max_concurrent exceeded (sampled while they run)."""
    import threading

    from qlactors.store.engine import Store
    from qlactors.store.repository import Repository

    started = time.monotonic()
    c = make_cluster(tmp_path, replicas=2)
    try:
        for name in ("w1", "w2"):
            c.new_key(name)
            c.allow(name)
            c.start_worker(name, slots=4)
        ledger = tmp_path / "ledger"
        c.cli("task", "add", "ok", "--max-concurrent", "3", "--", "sh", "-c", f"echo ok >> {ledger}; echo fine")
        c.cli("task", "add", "bad", "--max-concurrent", "2", "--", "sh", "-c", f"echo bad >> {ledger}; exit 3")
        c.cli("task", "add", "say", "--max-concurrent", "3", "--",
              "sh", "-c", f"echo say >> {ledger}; printf 'a\\tb\\n%%s\\n' \"$$\" >/dev/null; printf 'x y\\n'")
        store = Store(c.database_url)
        repo = Repository(store)
        kinds = ["ok", "bad", "say"]
        run_ids = {kind: [] for kind in kinds}
        for i in range(500):
            kind = kinds[i % 3]
            run_ids[kind].append(repo.runs.request(kind).run.id)
        store.close()
        peaks: dict[str, int] = {}
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                for key, n in c.sql(
                        "SELECT 'worker:' || a.worker_id, count(*) FROM run_attempts a "
                        "WHERE a.status IN ('starting', 'running') GROUP BY a.worker_id "
                        "UNION ALL SELECT 'task:' || t.name, count(*) FROM run_attempts a "
                        "JOIN runs r ON r.id = a.run_id JOIN tasks t ON t.id = r.task_id "
                        "WHERE a.status IN ('starting', 'running') GROUP BY t.name"):
                    peaks[key] = max(peaks.get(key, 0), n)
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        every = [r for ids in run_ids.values() for r in ids]
        # The wait gives up with its own report (how many runs are not terminal, every process's
        # log) 60 s before the hang guard would cut the test off without one; the 60 s are for
        # the checks below.
        try:
            states = c.wait_terminal(every, timeout=HANG_GUARD_500_S - 60 - (time.monotonic() - started))
        finally:
            done.set()  # also when the wait gave up: the sampler must not outlive the database
            sampler.join(5)
        assert {states[r]["state"] for r in run_ids["ok"] + run_ids["say"]} == {"succeeded"}
        assert {states[r]["state"] for r in run_ids["bad"]} == {"failed"}
        codes = dict(c.sql("SELECT run_id, exit_code FROM run_attempts WHERE run_id = ANY(%s)", every))
        assert all(codes[r] == 3 for r in run_ids["bad"]) and all(codes[r] == 0 for r in run_ids["ok"])
        lines = ledger.read_text().splitlines()  # one line per run: none lost, none ran twice
        assert sorted(lines) == sorted(k for k in kinds for _ in run_ids[k])
        attempts = c.sql("SELECT count(*) FROM run_attempts WHERE run_id = ANY(%s)", every)[0][0]
        assert attempts == 500
        for r in run_ids["say"][:5] + run_ids["ok"][:5]:
            want = b"x y\n" if r in run_ids["say"] else b"fine\n"
            wait_until(lambda: c.cli("logs", r).stdout == want, 30, f"the log of {r}")
        assert max(v for k, v in peaks.items() if k.startswith("worker:")) <= 4, peaks
        assert peaks.get("task:ok", 0) <= 3 and peaks.get("task:bad", 0) <= 2 and peaks.get("task:say", 0) <= 3
    finally:
        c.close()


def _leases(cluster, run_id: str) -> list[tuple]:
    return cluster.sql("SELECT lease_generation, status, offer_id FROM run_dispatch_leases "
                       "WHERE run_id = %s ORDER BY lease_generation", run_id)


def _with_fault(tmp_path, monkeypatch, fault: str, timings: dict | None = None):
    """A one-replica cluster whose replica runs with the fault point `fault` (its workers do not),
    and worker w1's key allowed."""
    monkeypatch.setenv("QLACTORS_FAULT", fault)
    c = make_cluster(tmp_path, replicas=1, timings=timings)
    monkeypatch.delenv("QLACTORS_FAULT")
    try:
        c.new_key("w1")
        c.allow("w1")
    except BaseException:
        c.close()
        raise
    return c


def test_a_pull_whose_answer_was_dropped_is_repeated_and_gets_the_same_offer(tmp_path, monkeypatch):
    c = _with_fault(tmp_path, monkeypatch, "gateway_drop_offers")  # the replica drops its first Offers
    try:
        c.cli("task", "add", "once", "--", "true")
        run_id = _run(c, "once")
        c.start_worker("w1", slots=1)
        assert c.wait_terminal([run_id], timeout=60)[run_id]["state"] == "succeeded"
        assert "event=fault_offers_dropped" in c.replicas[0].log()
        leases = _leases(c, run_id)
        assert len(leases) == 1 and leases[0][1] == "completed", leases  # the same offer: one lease
    finally:
        c.close()


def test_a_worker_restarted_after_its_offers_were_lost_declines_them_and_the_run_goes_on(tmp_path, monkeypatch):
    """The replica drops the Offers answer; the worker is killed before it repeats its Pull (a
    long heartbeat interval and request timeout). Restarted within its session lease, it
    resumes, Welcome lists the lease it never received, and it declines it (not waiting for the
    lease to expire): the run is offered again and succeeds."""
    slow = dict(heartbeat_ms=10_000, request_timeout_ms=20_000,  # no repeat of the Pull before the kill
                session_lease_ms=30_000, run_lease_ms=60_000, recovery_grace_ms=90_000)
    c = _with_fault(tmp_path, monkeypatch, "gateway_drop_offers", slow)
    try:
        c.cli("task", "add", "once", "--", "true")
        run_id = _run(c, "once")
        worker = c.start_worker("w1", slots=1)
        wait_until(lambda: "event=fault_offers_dropped" in c.replicas[0].log(), 30, "the dropped Offers")
        assert c.stop(worker, signal.SIGKILL) == -signal.SIGKILL
        again = c.start_worker("w1", slots=1)
        assert c.wait_terminal([run_id], timeout=30)[run_id]["state"] == "succeeded"
        assert "event=unactivated_lease_declined" in again.log()
        assert "resumed=True" in c.replicas[0].log()
        leases = c.sql("SELECT lease_generation, status, release_reason FROM run_dispatch_leases "
                       "WHERE run_id = %s ORDER BY lease_generation", run_id)
        assert leases == [(1, "released", "declined"), (2, "completed", None)]
    finally:
        c.close()


def test_a_lost_heartbeat_answer_does_not_stop_the_job(tmp_path, monkeypatch):
    """The replica commits a heartbeat that renewed the running job's lease and drops its answer;
    the worker's next reports (log chunks, heartbeats, Completed) all land: the job is never
    stopped and the run ends with its own exit code and whole log."""
    c = _with_fault(tmp_path, monkeypatch, "gateway_drop_heartbeat_ack")
    try:
        worker = c.start_worker("w1", slots=1)
        c.cli("task", "add", "steady", "--", "sh", "-c", "echo begin; sleep 4; echo end; exit 7")
        run_id = _run(c, "steady")
        assert c.wait_terminal([run_id], timeout=60)[run_id]["state"] == "failed"
        assert "event=fault_heartbeat_ack_dropped" in c.replicas[0].log()
        assert c.sql("SELECT exit_code, signal FROM run_attempts WHERE run_id = %s", run_id) == [(7, None)]
        assert [lease[1] for lease in _leases(c, run_id)] == ["completed"]
        assert "event=stop_term" not in worker.log() and "event=lease_fenced" not in worker.log()
        wait_until(lambda: c.cli("logs", run_id).stdout == b"begin\nend\n", 30, "the whole log")
    finally:
        c.close()


def test_a_task_requiring_a_label_runs_only_on_the_worker_that_has_it(tmp_path):
    c = make_cluster(tmp_path, replicas=1)
    try:
        for name, labels in (("plain", ()), ("gpu", ("gpu",))):
            c.new_key(name)
            c.allow(name)
            c.start_worker(name, slots=2, labels=labels)
        c.cli("task", "add", "train", "--require-label", "gpu", "--max-concurrent", "4", "--", "true")
        run_ids = [_run(c, "train") for _ in range(8)]
        c.wait_terminal(run_ids, timeout=120)
        workers = c.sql("SELECT DISTINCT worker_id FROM run_attempts WHERE run_id = ANY(%s)", run_ids)
        assert workers == [("gpu",)]
    finally:
        c.close()


def test_a_big_output_is_read_back_exactly_up_to_the_cap(cluster):
    """10 MiB of output with a 4 MiB cap: `logs` on the control side prints exactly the kept bytes."""
    cluster.new_key("w1")
    cluster.allow("w1")
    cluster.start_worker("w1", slots=1, extra=f"log_cap_bytes = {4 * 1024 * 1024}\n")
    script = ("import sys\nfor i in range(10 * 1024):\n"
              "    sys.stdout.buffer.write(((b'%07d' % i) * 147)[:1023] + b'\\n')\n")
    cluster.cli("task", "add", "big", "--", "python3", "-c", script)
    run_id = _run(cluster, "big")
    assert cluster.wait_terminal([run_id], timeout=120)[run_id]["state"] == "succeeded"
    expected = b"".join(((b"%07d" % i) * 147)[:1023] + b"\n" for i in range(10 * 1024))[:4 * 1024 * 1024]
    # The worker ships the kept bytes in chunks; `-f` ends at the final offset.
    out = cluster.cli("logs", run_id, "-f", timeout=120).stdout
    assert len(out) == len(expected) and out == expected
    attempt = cluster.show(run_id)["attempts"][0]
    assert attempt["log_dropped_bytes"] == 10 * 1024 * 1024 - 4 * 1024 * 1024


def test_cron_on_two_replicas_admits_each_occurrence_once(tmp_path):
    c = make_cluster(tmp_path, replicas=2)
    try:
        c.new_key("w1")
        c.allow("w1")
        c.start_worker("w1", slots=4)
        c.cli("task", "add", "tick", "--cron", "* * * * * *", "--tz", "UTC", "--max-concurrent", "4",
              "--", "true")
        time.sleep(20)
        c.cli("task", "disable", "tick")
        time.sleep(1)  # a cycle that began before the disable commits nothing after it
        runs = c.sql("SELECT scheduled_for_ms FROM runs WHERE trigger_type = 'cron' ORDER BY 1")
        times = [r[0] for r in runs]
        assert len(times) == len(set(times)), "an occurrence was admitted twice"
        assert len(times) >= 18
        events = c.sql("SELECT type, scheduled_for_ms, occurrences FROM trigger_events")
        missed = sum(n for kind, _at, n in events if kind == "missed")
        skipped = sum(n for kind, _at, n in events if kind == "skipped")
        # Every second from the first admitted occurrence to the last is a run or counted.
        span = (times[-1] - times[0]) // 1000 + 1
        assert len(times) + missed + skipped >= span
    finally:
        c.close()


def test_a_second_worker_on_the_same_state_directory_refuses_to_start(cluster):
    cluster.new_key("w1")
    cluster.allow("w1")
    cluster.start_worker("w1", slots=1)
    import subprocess
    from cluster_harness import QLACTORS

    second = subprocess.run([*QLACTORS, "worker", "--config", str(cluster.root / "w1.toml")],
                            cwd=cluster.root, capture_output=True, timeout=30)
    assert second.returncode != 0
    assert b"in use by another qlactors worker" in second.stderr
    assert cluster.workers["w1"].alive()


def test_a_revoked_key_is_not_served_any_more(cluster):
    cluster.new_key("w1")
    cluster.allow("w1")
    cluster.start_worker("w1", slots=1)
    cluster.cli("worker", "revoke", "w1")
    cluster.cli("task", "add", "after", "--", "true")
    run_id = _run(cluster, "after")
    time.sleep(4)  # several heartbeats and cycles: the allow-list cache is refreshed every cycle
    assert cluster.show(run_id)["state"] == "queued"  # nothing is offered to it any more
    assert "event=frame_refused reason=unknown_or_revoked_key" in cluster.replicas[0].log()
    assert cluster.sql("SELECT status FROM worker_sessions WHERE worker_id = 'w1'") == [("offline",)]


def test_a_worker_restarted_within_its_session_lease_resumes_and_its_job_finishes(cluster):
    """SIGTERM leaves the job running; the restarted worker resumes its session (same
    generation), re-attests the survivor, and the run ends with its own exit code and log."""
    cluster.new_key("w1")
    cluster.allow("w1")
    worker = cluster.start_worker("w1", slots=1)
    go = cluster.root / "go"  # the job ends only once the restarted worker has re-bound it
    cluster.cli("task", "add", "slow", "--", "sh", "-c",
                f"echo begin; while [ ! -e {go} ]; do sleep 0.1; done; echo end; exit 5")
    run_id = _run(cluster, "slow")
    wait_until(lambda: cluster.sql("SELECT status FROM runs WHERE id = %s", run_id)[0][0] == "running", 30,
             "the job to run")
    [(generation,)] = cluster.sql("SELECT session_generation FROM run_attempts WHERE run_id = %s", run_id)
    assert cluster.stop(worker) == 0
    again = cluster.start_worker("w1", slots=1)
    assert again.alive()
    wait_until(lambda: "event=rebound" in again.log(), 60, "the survivor re-bound")
    go.touch()
    final = cluster.wait_terminal([run_id], timeout=60)[run_id]
    assert final["state"] == "failed"
    assert cluster.sql("SELECT exit_code FROM run_attempts WHERE run_id = %s", run_id) == [(5,)]
    assert "resumed=True" in "".join(r.log() for r in cluster.replicas)
    sessions = cluster.sql("SELECT generation FROM worker_sessions WHERE worker_id = 'w1'")
    assert sessions == [(generation,)]  # resumed: no new generation
    assert "event=rebound" in again.log()
    wait_until(lambda: cluster.cli("logs", run_id).stdout == b"begin\nend\n", 30, "the whole log")


def test_a_worker_whose_session_ends_while_its_job_runs_re_attests_it_and_the_job_finishes(cluster):
    """The session expires under a running job (as after a freeze or an outage longer than the
    session lease): the next heartbeat answer says so, the worker registers a new generation and
    re-attests the job `running` from it; the job is never stopped, its lease is re-bound and the
    run ends with its own exit code and whole log."""
    cluster.new_key("w1")
    cluster.allow("w1")
    worker = cluster.start_worker("w1", slots=1)
    cluster.cli("task", "add", "slow", "--", "sh", "-c", "echo begin; sleep 5; echo end; exit 6")
    run_id = _run(cluster, "slow")
    wait_until(lambda: cluster.sql("SELECT status FROM runs WHERE id = %s", run_id)[0][0] == "running", 30,
               "the job to run")
    [(generation,)] = cluster.sql("SELECT generation FROM worker_sessions WHERE worker_id = 'w1'")
    cluster.sql("UPDATE worker_sessions SET lease_expires_at_ms = 1 WHERE worker_id = 'w1' RETURNING 1")
    final = cluster.wait_terminal([run_id], timeout=60)[run_id]
    assert final["state"] == "failed"
    assert cluster.sql("SELECT exit_code, signal FROM run_attempts WHERE run_id = %s", run_id) == [(6, None)]
    assert sorted(cluster.sql("SELECT generation FROM worker_sessions WHERE worker_id = 'w1'")) == [
        (generation,), (generation + 1,)]
    leases = _leases(cluster, run_id)
    assert [(g, status) for g, status, _ in leases] == [(1, "released"), (2, "completed")]
    log = worker.log()
    assert "event=session_ended" in log and "event=reattest_running" in log and "event=rebound" in log
    assert "event=stop_term" not in log and "event=lease_fenced" not in log
    wait_until(lambda: cluster.cli("logs", run_id).stdout == b"begin\nend\n", 30, "the whole log")


def test_a_replica_whose_connections_are_reset_retries_and_status_shows_the_errors(cluster):
    """Every backend of the replica terminated under it (a connection reset, as a server restart
    or a proxy would do it): the replica neither stops nor crashes, a job still runs, and the
    cluster `status` shows the transient errors it retried (§9 Transport)."""
    import psycopg

    from conftest import _pg_admin_conninfo

    cluster.new_key("w1")
    cluster.allow("w1")
    cluster.start_worker("w1", slots=1)
    cluster.cli("task", "add", "t", "--", "true")
    first = _run(cluster, "t")
    assert cluster.wait_terminal([first], timeout=60)[first]["state"] == "succeeded"
    assert [r["db_errors"] for r in cluster.cli_json("status")["replicas"]] == [0]

    def reset() -> int:
        with psycopg.connect(_pg_admin_conninfo(), autocommit=True) as admin:
            return len(admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
                (cluster.admin_db,)).fetchall())

    def errors_shown() -> bool:
        reset()  # until one of the replica's transactions meets it (an idle pooled connection does)
        time.sleep(0.5)
        replica = cluster.cli_json("status")["replicas"][0]
        return replica["db_errors"] >= 1

    wait_until(errors_shown, 30, "a retried connection reset in the replica's status row")
    replica = cluster.cli_json("status")["replicas"][0]
    assert replica["up"] is True and replica["last_db_error"] and replica["last_db_error_at_ms"] > 0
    assert cluster.replicas[0].alive()
    text = cluster.cli("status").stdout.decode()
    assert "DB ERRORS" in text and "transient database error(s) retried" in text
    second = _run(cluster, "t")
    assert cluster.wait_terminal([second], timeout=60)[second]["state"] == "succeeded"
    assert cluster.replicas[0].alive() and "Traceback" not in cluster.replicas[0].log()


def test_a_worker_below_its_disk_reserve_pulls_nothing_until_space_comes_back(cluster, monkeypatch, tmp_path):
    free = tmp_path / "free-bytes"
    free.write_text("0")  # what the worker reads as its logs' free space (a test hook)
    monkeypatch.setenv("QLACTORS_TEST_FREE_BYTES_FILE", str(free))
    cluster.new_key("w1")
    cluster.allow("w1")
    worker = cluster.start_worker("w1", slots=2)
    cluster.cli("task", "add", "t", "--", "true")
    run_id = _run(cluster, "t")
    wait_until(lambda: "event=disk_reserve_hold" in worker.log(), 30, "the worker's disk reserve hold")
    time.sleep(3)  # heartbeats and nudges meanwhile: still nothing pulled
    assert cluster.show(run_id)["state"] == "queued"
    free.write_text(str(1 << 40))
    assert cluster.wait_terminal([run_id], timeout=60)[run_id]["state"] == "succeeded"
    assert "event=disk_reserve_released" in worker.log()


def test_a_replica_whose_retry_step_breaks_says_so_in_status_until_a_cycle_gets_through(cluster):
    """A head candidate that breaks a cadence step (a lost run whose policy snapshot no
    RetryPolicy accepts, as a corrupt row would): every cycle fails, nothing is offered, and
    `status` names the step, its error and since when; once the run is cancelled the next cycle
    gets through, the line goes, and work is offered again."""
    import psycopg

    cluster.cli("task", "add", "t", "--", "true")
    broken = _run(cluster, "t")  # no worker yet: it waits, queued
    with psycopg.connect(cluster.database_url.replace("+psycopg", "")) as conn:
        conn.execute("ALTER TABLE run_retry_policies DROP CONSTRAINT ck_run_retry_policies_safety")
        conn.execute("UPDATE runs SET status = 'lost' WHERE id = %s", (broken,))
        conn.execute("UPDATE run_attempts SET status = 'lost' WHERE run_id = %s", (broken,))
        conn.execute("INSERT INTO run_retry_policies (run_id, max_attempts, retry_on_lost, safety, backoff_base_ms, "
                     "backoff_max_ms, version, created_at_ms, updated_at_ms) VALUES (%s, 1, false, 'bogus', 0, 0, "
                     "0, 0, 0) ON CONFLICT (run_id) DO UPDATE SET safety = 'bogus'", (broken,))

    def failing_step():  # polled in the database; the real command is run once it is there
        return cluster.sql("SELECT cycle_failed_step FROM control_replicas")[0][0]

    def failure():
        return cluster.cli_json("status")["replicas"][0]["cycle_failure"]

    wait_until(failing_step, 30, "the failing step in the replica's status row")
    shown = failure()
    assert shown["step"] == "retry" and "bogus" in shown["error"] and shown["since_ms"] > 0, shown
    text = cluster.cli("status").stdout.decode()
    assert "cadence: failing since" in text and "at step retry:" in text, text
    cluster.cli("cancel", broken)
    wait_until(lambda: failing_step() is None, 30, "the failure cleared by a cycle that got through")
    assert failure() is None
    assert "cadence:" not in cluster.cli("status").stdout.decode()
    cluster.new_key("w1")
    cluster.allow("w1")
    cluster.start_worker("w1", slots=1)
    second = _run(cluster, "t")
    assert cluster.wait_terminal([second], timeout=60)[second]["state"] == "succeeded"
