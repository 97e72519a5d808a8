"""The command line against a cluster database (real PostgreSQL, a real `qlactors` subprocess
each): --config control.toml or $QLACTORS_DATABASE_URL, the allow-list, `workers`, placement by
labels, `status` of replicas, `logs` from log chunks, and the config errors of `control`/`worker`."""

from __future__ import annotations

import json
import os
import secrets
import subprocess

import pytest
from sqlalchemy import insert, select, update

from qlactors.domain.receipt import token_hash
from qlactors.store.dispatch.dispatch import Dispatch
from qlactors.store.engine import Store
from qlactors.store.schema import control_replicas, log_chunks, run_attempts, worker_sessions
from qlactors.store.admin.worker_keys import WorkerKeys
from qlactors.wire.curve_keys import load_public_key, new_key_pair
from cli_cluster_harness import QLACTORS, cluster  # noqa: F401 - fixtures

pytestmark = pytest.mark.postgres


def test_an_unmigrated_cluster_database_is_refused_and_left_untouched(pg_schema_url, tmp_path):
    config = tmp_path / "control.toml"
    config.write_text(f'profile = "control"\n[database]\nurl = "{pg_schema_url}"\n')
    done = subprocess.run([*QLACTORS, "--config", str(config), "runs"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "has no qlactors schema" in done.stderr
    from qlactors.store.migrations import current_version

    store = Store(pg_schema_url)
    try:
        assert current_version(store) is None
    finally:
        store.close()


def test_intent_commands_act_on_the_cluster_database_not_the_edge_home(cluster):
    cluster.ok("task", "add", "t1", "--", "echo", "hi")
    run_id = cluster.ok("run", "t1", env_url=True).stdout.strip()
    listed = json.loads(cluster.ok("runs", "--json").stdout)
    assert [r["id"] for r in listed] == [run_id]
    assert json.loads(cluster.ok("show", run_id, "--json", env_url=True).stdout)["state"] == "queued"
    assert "cancelled" in cluster.ok("cancel", run_id).stdout
    assert cluster.repo.runs.get(run_id).state == "cancelled"
    retried = cluster.ok("retry", run_id).stdout.strip()
    assert cluster.repo.runs.get(retried).retry_of_run_id == run_id
    assert not (cluster.tmp / "edge-home").exists()


def test_a_worker_config_is_no_way_to_the_database(cluster):
    worker = cluster.tmp / "worker.toml"
    worker.write_text('profile = "worker"\n')
    done = subprocess.run([*QLACTORS, "--config", str(worker), "runs"], capture_output=True, text=True,
                          env=cluster.env, timeout=60)
    assert done.returncode == 2 and "holds no database credentials" in done.stderr


def test_allow_binds_one_key_to_one_worker_and_revoke_ends_its_sessions(cluster):
    k1, _ = new_key_pair(cluster.tmp / "keys", "w1")
    k2, _ = new_key_pair(cluster.tmp / "keys", "w2")
    assert "worker w1 allowed" in cluster.ok("worker", "allow", "w1", k1).stdout
    assert "already allowed" in cluster.ok("worker", "allow", "w1", k1).stdout  # a repeat is no change
    other_key = cluster.ql("worker", "allow", "w1", k2)
    assert other_key.returncode == 2 and "already allowed with another key" in other_key.stderr
    other_id = cluster.ql("worker", "allow", "w9", k1)
    assert other_id.returncode == 2 and "already allowed for worker w1" in other_id.stderr
    assert WorkerKeys(cluster.repo.store).all() == {load_public_key(k1).decode(): "w1"}

    session = cluster.session("w1")
    bystander = cluster.session("w2")
    with cluster.repo.store.read() as conn:
        before = conn.execute(select(worker_sessions).where(
            worker_sessions.c.session_id == session.session_id)).one()
    assert "1 session(s) ended" in cluster.ok("worker", "revoke", "w1").stdout
    with cluster.repo.store.read() as conn:
        after = conn.execute(select(worker_sessions).where(
            worker_sessions.c.session_id == session.session_id)).one()
    assert (after.status, after.version) == ("offline", before.version + 1)
    assert after.ended_at_ms is not None and after.ended_at_ms >= before.created_at_ms
    assert WorkerKeys(cluster.repo.store).all() == {}
    with cluster.repo.store.read() as conn:
        assert conn.execute(select(worker_sessions.c.status).where(
            worker_sessions.c.session_id == bystander.session_id)).scalar_one() == "online"
    again = cluster.ql("worker", "revoke", "w1")
    assert again.returncode == 2 and "not on the allow-list" in again.stderr
    assert "worker w2 allowed" in cluster.ok("worker", "allow", "w2", k2).stdout


def test_a_worker_retired_after_its_drain_shows_retired_and_an_expired_one_needs_no_force(cluster):
    """Retire is the operator's word, a drain only the worker's: a drained worker retired shows
    `retired` in `workers`; a worker whose lease has expired is retired without --force (issue 28)."""
    key, _ = new_key_pair(cluster.tmp / "keys", "w1")
    cluster.ok("worker", "allow", "w1", key)
    session = cluster.session("w1")
    with cluster.repo.store.write() as conn:
        now = cluster.repo.store.now_ms(conn)
        conn.execute(update(worker_sessions).where(worker_sessions.c.session_id == session.session_id)
                     .values(status="offline", drained_at_ms=now - 1000, ended_at_ms=now - 1000,
                             lease_expires_at_ms=now - 1000))
    [before] = json.loads(cluster.ok("workers", "--json").stdout)
    assert before["state"] == "offline (drained)", before
    cluster.ok("worker", "retire", "w1", "--confirm-stopped")  # gone: no --force needed
    [after] = json.loads(cluster.ok("workers", "--json").stdout)
    assert after["state"] == "retired", after


def test_retire_needs_confirm_stopped_then_ends_the_sessions_and_keeps_the_key(cluster):
    key, _ = new_key_pair(cluster.tmp / "keys", "w1")
    cluster.ok("worker", "allow", "w1", key)
    session = cluster.session("w1")
    unconfirmed = cluster.ql("worker", "retire", "w1")
    assert unconfirmed.returncode == 2 and "--confirm-stopped" in unconfirmed.stderr
    assert "nothing was changed" in unconfirmed.stderr
    with cluster.repo.store.read() as conn:
        assert conn.execute(select(worker_sessions.c.status).where(
            worker_sessions.c.session_id == session.session_id)).scalar_one() == "online"
    alive = cluster.ql("worker", "retire", "w1", "--confirm-stopped")  # its heartbeat is fresh
    assert alive.returncode == 2 and "looks alive" in alive.stderr and "--force" in alive.stderr, alive
    assert "nothing was changed" in alive.stderr
    done = cluster.ok("worker", "retire", "w1", "--confirm-stopped", "--force").stdout
    assert "worker w1 retired: 1 session(s) ended" in done and "0 attempt(s)" in done
    with cluster.repo.store.read() as conn:
        assert conn.execute(select(worker_sessions.c.status).where(
            worker_sessions.c.session_id == session.session_id)).scalar_one() == "offline"
    assert WorkerKeys(cluster.repo.store).all() == {load_public_key(key).decode(): "w1"}
    unknown = cluster.ql("worker", "retire", "ghost", "--confirm-stopped")
    assert unknown.returncode == 2 and "no worker ghost" in unknown.stderr


def test_a_database_url_variable_that_is_not_postgresql_is_refused(tmp_path):
    env = {**os.environ, "QLACTORS_DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}"}
    done = subprocess.run([*QLACTORS, "--home", str(tmp_path / "h"), "runs"], capture_output=True,
                          text=True, env=env, timeout=60)
    assert done.returncode == 2 and "the cluster database is PostgreSQL" in done.stderr
    assert not (tmp_path / "x.db").exists() and not (tmp_path / "h").exists()


@pytest.mark.parametrize("scheme", ["postgresql://", "postgres://"])
def test_a_bare_postgresql_url_reaches_the_cluster_database(cluster, scheme):
    """As libpq and most tools write it: in $QLACTORS_DATABASE_URL and in control.toml alike."""
    bare = cluster.url.replace("postgresql+psycopg://", scheme, 1)
    cluster.ok("task", "add", "t1", "--", "true")
    env = {**cluster.env, "QLACTORS_DATABASE_URL": bare}
    listed = subprocess.run([*QLACTORS, "task", "list", "--json"], capture_output=True, text=True,
                            env=env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert [t["name"] for t in json.loads(listed.stdout)] == ["t1"]
    config = cluster.tmp / "bare.toml"
    config.write_text(f'profile = "control"\n[database]\nurl = "{bare}"\n')
    shown = subprocess.run([*QLACTORS, "--config", str(config), "task", "show", "t1"], capture_output=True,
                           text=True, env=cluster.env, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert not (cluster.tmp / "edge-home").exists()


def test_the_allow_list_needs_a_cluster_database(tmp_path):
    key, _ = new_key_pair(tmp_path, "w1")
    env = {k: v for k, v in os.environ.items() if k != "QLACTORS_DATABASE_URL"}
    done = subprocess.run([*QLACTORS, "--home", str(tmp_path / "h"), "worker", "allow", "w1", str(key)],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and "no cluster database: pass --config control.toml" in done.stderr
    retire = subprocess.run([*QLACTORS, "--home", str(tmp_path / "h"), "worker", "retire", "w1", "--confirm-stopped"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert retire.returncode == 2 and "no cluster database: pass --config control.toml" in retire.stderr
    assert not (tmp_path / "h").exists()  # nothing written on the edge home


def test_workers_lists_current_sessions_and_allowed_workers_that_never_came(cluster):
    WorkerKeys(cluster.repo.store).allow("w0", load_public_key(new_key_pair(cluster.tmp, "w0")[0]).decode())
    cluster.session("w1", labels=["gpu"], skew_ms=-12)
    second = cluster.session("w1", labels=["gpu", "big"], capacity=8, skew_ms=7)  # generation 2
    listed = {w["worker_id"]: w for w in json.loads(cluster.ok("workers", "--json").stdout)}
    assert set(listed) == {"w0", "w1"}
    assert listed["w0"]["status"] == "never" and listed["w0"]["allowed"] is True
    w1 = listed["w1"]
    assert (w1["generation"], w1["session_id"], w1["status"]) == (2, second.session_id, "online")
    assert (w1["capacity"], w1["free_slots"], w1["clock_skew_ms"]) == (8, 8, 7)
    assert w1["labels"] == ["gpu", "big"] and w1["lease_expired"] is False and w1["allowed"] is False
    assert w1["heartbeat_age_ms"] >= 0
    text = cluster.ok("workers", env_url=True).stdout
    assert "never" in text and "8/8" in text and "+7ms" in text and "gpu,big" in text


def test_workers_shows_each_workers_state(cluster):
    """online, draining, expired, offline (drained), retired, offline (revoked) and never."""
    from qlactors.store.admin.worker_retirement import WorkerRetirement

    dispatch = Dispatch.open(cluster.repo.store)
    for name in ("w0", "w5"):
        WorkerKeys(cluster.repo.store).allow(name, load_public_key(new_key_pair(cluster.tmp, name)[0]).decode())
    cluster.session("w1")
    draining = cluster.session("w2")
    assert dispatch.sessions.end("w2", draining.session_id, 1, status="draining").result == "applied"
    expired = cluster.session("w3")
    drained = cluster.session("w4")
    assert dispatch.sessions.end("w4", drained.session_id, 1, status="offline").result == "applied"
    cluster.session("w5")
    WorkerRetirement(cluster.repo.store).retire("w5")
    revoked = cluster.session("w6")
    with cluster.repo.store.write() as conn:
        now = cluster.repo.store.now_ms(conn)
        conn.execute(update(worker_sessions).where(worker_sessions.c.session_id == expired.session_id)
                     .values(lease_expires_at_ms=now - 1))
        conn.execute(update(worker_sessions).where(worker_sessions.c.session_id == revoked.session_id)
                     .values(status="offline", ended_at_ms=now))
    listed = {w["worker_id"]: w for w in json.loads(cluster.ok("workers", "--json").stdout)}
    assert {k: w["state"] for k, w in listed.items()} == {
        "w0": "never", "w1": "online", "w2": "draining", "w3": "expired", "w4": "offline (drained)",
        "w5": "retired", "w6": "offline"}
    assert listed["w4"]["drained_at_ms"] is not None and listed["w4"]["ended_at_ms"] is not None
    assert listed["w2"]["drained_at_ms"] is not None and listed["w2"]["ended_at_ms"] is None
    assert listed["w3"]["status"] == "online"  # the session's own status is kept beside the state
    rows = {line.split()[0]: line for line in cluster.ok("workers", env_url=True).stdout.splitlines()[1:]}
    assert "offline (drained)" in rows["w4"] and "retired" in rows["w5"] and "expired" in rows["w3"]
    assert "offline (not allowed)" in rows["w6"] and "draining" in rows["w2"]
    # Free slots only while the session serves (online or draining); an ended one's are `-`.
    assert {k: w["free_slots"] for k, w in listed.items()} == {
        "w0": None, "w1": 4, "w2": 4, "w3": 4, "w4": None, "w5": None, "w6": None}
    assert " 4/4 " in rows["w1"] and " 4/4 " in rows["w2"]
    assert all(" -/4 " in rows[w] and "4/4" not in rows[w] for w in ("w4", "w5", "w6")), rows


def test_require_label_places_a_task_and_task_show_names_who_qualifies(cluster):
    cluster.ok("task", "add", "g", "--require-label", "gpu", "--require-label", "zone=eu", "--", "true")
    cluster.session("w1", labels=["gpu", "zone=eu", "big"])
    cluster.session("w2", labels=["gpu"])
    gone = cluster.session("w3", labels=["gpu", "zone=eu"])
    with cluster.repo.store.write() as conn:  # its session lease ran out: it serves no offers now
        conn.execute(update(worker_sessions).where(worker_sessions.c.session_id == gone.session_id)
                     .values(lease_expires_at_ms=cluster.repo.store.now_ms(conn) - 1))
    shown = json.loads(cluster.ok("task", "show", "g", "--json").stdout)
    assert shown["labels"] == ["gpu", "zone=eu"] and shown["qualifying_workers"] == ["w1"]
    assert cluster.repo.tasks.get("g").spec.labels == ("gpu", "zone=eu")
    cluster.ok("task", "update", "g", "--require-label", "gpu")
    assert json.loads(cluster.ok("task", "show", "g", "--json").stdout)["qualifying_workers"] == ["w1", "w2"]
    cluster.ok("task", "update", "g", "--no-require-label")
    assert cluster.repo.tasks.get("g").spec.labels == ()
    bad = cluster.ql("task", "add", "h", "--require-label", "no space", "--", "true")
    assert bad.returncode == 2 and "--require-label: label 'no space'" in bad.stderr
    assert "workers now:    w1, w2" in cluster.ok("task", "show", "g").stdout


def test_task_show_on_edge_says_the_local_runtime_has_no_labels(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "QLACTORS_DATABASE_URL"}
    home = ["--home", str(tmp_path / "h")]
    subprocess.run([*QLACTORS, *home, "task", "add", "g", "--require-label", "gpu", "--", "true"],
                   check=True, capture_output=True, env=env, timeout=60)
    shown = subprocess.run([*QLACTORS, *home, "task", "show", "g"], capture_output=True, text=True,
                           env=env, timeout=60)
    assert "edge: runs here only if the task requires no label (no: it requires labels)" in shown.stdout


def _replica(cluster, *, age_ms: int, stopped: bool = False) -> str:
    replica_id = secrets.token_hex(8)
    with cluster.repo.store.write() as conn:
        now = cluster.repo.store.now_ms(conn)
        conn.execute(insert(control_replicas).values(
            replica_id=replica_id, host="ctl-1", pid=4242, bind="tcp://0.0.0.0:5710",
            started_at_ms=now - age_ms - 1000, heartbeat_at_ms=now - age_ms,
            stopped_at_ms=now if stopped else None))
    return replica_id


def test_status_exits_0_only_while_a_replica_is_up(cluster):
    # A 60 s tick: a replica is up while its heartbeat is at most 3 ticks + 5 s = 185 s old.
    cluster.config.write_text(cluster.config.read_text() + "[control]\ncadence_tick_ms = 60000\n")
    assert cluster.ql("status").returncode == 3
    _replica(cluster, age_ms=186_000)  # silent for longer than that
    _replica(cluster, age_ms=0, stopped=True)
    down = cluster.ql("status", "--json", "--all")
    assert down.returncode == 3 and [r["up"] for r in json.loads(down.stdout)["replicas"]] == [False, False]
    counted = json.loads(cluster.ql("status", "--json").stdout)["replicas"]  # a stopped one is history
    assert [(r["up"], r["stopped_at_ms"]) for r in counted] == [(False, None)]
    live = _replica(cluster, age_ms=30_000)  # up with a 60 s tick, silent with the default 1 s
    cluster.ok("task", "add", "t1", "--", "true")
    cluster.ok("run", "t1")
    cluster.session("w1")
    report = json.loads(cluster.ok("status", "--json").stdout)
    assert report["up"] is True and [r["replica_id"] for r in report["replicas"] if r["up"]] == [live]
    assert report["active_runs"] == {"queued": 1} and [w["worker_id"] for w in report["workers"]] == ["w1"]
    text = cluster.ok("status").stdout
    assert "1 of 2 replica(s) up" in text and "active runs: queued 1" in text
    assert "(1 stopped or long-silent not counted: `qlactors status --all`)" in text
    assert cluster.ql("status", env_url=True).returncode == 3  # the default 1 s tick: none is up
    from qlactors.store.cadence.cluster_status import replicas_up  # what `run --wait` asks on each poll

    assert (replicas_up(cluster.repo.store, 60_000), replicas_up(cluster.repo.store, 1_000)) == (1, 0)


def test_status_shows_a_replicas_failing_cadence_step_until_a_cycle_gets_through(cluster):
    """A replica whose cycles fail at a step offers nothing: `status` names the step, its error
    and since when, from the replica's heartbeat, until a cycle gets through."""
    from qlactors.control.cycle_health import CycleFailure
    from qlactors.store.health import ErrorTally
    from qlactors.store.admin.replicas import Replicas

    replicas = Replicas(cluster.repo.store)
    replica_id = replicas.register("ctl-1", 4242, "tcp://0.0.0.0:5710")
    failure = CycleFailure("recovery", "RuntimeError('head candidate 01ab')", 1_767_225_600_000)
    replicas.heartbeat(replica_id, ErrorTally(0, None, None), failure)
    [replica] = json.loads(cluster.ok("status", "--json").stdout)["replicas"]
    assert replica["up"] and replica["cycle_failure"] == {
        "step": "recovery", "error": "RuntimeError('head candidate 01ab')", "since_ms": 1_767_225_600_000}
    text = cluster.ok("status").stdout
    assert (f"  replica {replica_id} cadence: failing since 2026-01-01 00:00:00.000Z at step recovery: "
            "RuntimeError('head candidate 01ab'); nothing is offered until a cycle gets through") in text, text
    replicas.heartbeat(replica_id, ErrorTally(0, None, None), None)  # the next cycle got through
    [replica] = json.loads(cluster.ok("status", "--json").stdout)["replicas"]
    assert replica["cycle_failure"] is None
    assert "cadence:" not in cluster.ok("status").stdout


def test_run_wait_on_a_cluster_with_no_replica_says_so_and_times_out(cluster):
    cluster.ok("task", "add", "t1", "--", "true")
    done = cluster.ql("run", "t1", "--wait", "--wait-timeout", "0.5")
    assert done.returncode == 75
    assert "no control replica is up" in done.stderr


def _running_attempt(cluster, task: str = "t1"):
    """A run whose attempt a worker has started (offer, activate, started through the store)."""
    cluster.ok("task", "add", task, "--", "true")
    run_id = cluster.ok("run", task).stdout.strip()
    dispatch = Dispatch.open(cluster.repo.store)
    session = dispatch.sessions.register("w1", 2)
    lease_hash = token_hash(secrets.token_urlsafe(32))
    offer = dispatch.offers.one("w1", session.session_id, 1, secrets.token_hex(8), lease_hash, log_cap_bytes=1 << 20)
    fence = offer.fence(lease_hash)
    dispatch.reports.activate(fence, token_hash(secrets.token_urlsafe(32)), "log")
    dispatch.reports.started(fence, "boot", 100, 100, 5)
    return run_id, offer.attempt_id


def _chunks(cluster, run_id: str, attempt_id: str, data: bytes, size: int) -> None:
    import hashlib

    with cluster.repo.store.write() as conn:
        for start in range(0, len(data), size):
            piece = data[start:start + size]
            conn.execute(insert(log_chunks).values(
                attempt_id=attempt_id, start_offset=start, run_id=run_id, length=len(piece),
                checksum=hashlib.sha256(piece).hexdigest(), data=piece, created_at_ms=0))


def test_logs_of_a_cluster_run_prints_the_chunks_byte_for_byte(cluster):
    run_id, attempt_id = _running_attempt(cluster)
    data = bytes(range(256)) * 2048 + b"\x00tail without newline"  # 512 KiB + change, 4 chunks
    _chunks(cluster, run_id, attempt_id, data, 131_072)
    done = subprocess.run([*QLACTORS, "--config", str(cluster.config), "logs", run_id], capture_output=True,
                          env=cluster.env, timeout=60)
    assert done.returncode == 0 and done.stdout == data


def test_logs_follow_of_a_cluster_run_ends_at_the_final_offset(cluster):
    run_id, attempt_id = _running_attempt(cluster)
    data = b"line one\nline two\n"
    _chunks(cluster, run_id, attempt_id, data, 9)
    with cluster.repo.store.write() as conn:
        conn.execute(update(run_attempts).where(run_attempts.c.id == attempt_id)
                     .values(log_final_offset=len(data)))
    done = subprocess.run([*QLACTORS, "--config", str(cluster.config), "logs", "-f", run_id],
                          capture_output=True, env=cluster.env, timeout=60)
    assert done.returncode == 0 and done.stdout == data  # the run is still `running`: -f ended anyway


@pytest.mark.parametrize("profile, body, words", [
    ("control", 'profile = "control"\n[database]\nurl = "postgresql+psycopg://q@h/q"\nlock_timeout_ms = 20000\n',
     "lock_timeout_ms = 20000 must be below"),
    ("control", 'profile = "control"\n[database]\nurl = "postgresql+psycopg://q@h/q"\n', "control.key_secret does not exist"),
    ("control", 'profile = "worker"\n', "is a worker config"),
    ("worker", 'profile = "worker"\n[database]\nurl = "postgresql+psycopg://q@h/q"\n', "holds no database credentials"),
    ("worker", 'profile = "worker"\n[worker]\nslots = 0\n', "[worker] slots = 0 is out of range"),
    ("worker", 'profile = "worker"\n', "control.key does not exist"),
])
def test_control_and_worker_refuse_a_bad_config_and_start_nothing(tmp_path, profile, body, words):
    config = tmp_path / f"{profile}.toml"
    config.write_text(body)
    done = subprocess.run([*QLACTORS, profile, "--config", str(config)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert words in done.stderr and done.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == [config.name]  # no state, no keys made


def test_control_without_a_config_is_a_usage_error(tmp_path):
    done = subprocess.run([*QLACTORS, "control"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and "needs --config FILE" in done.stderr
