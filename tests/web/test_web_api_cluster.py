"""The HTTP API over a cluster's PostgreSQL database: a real control replica and worker
(tests/harness/cluster_harness.py) and a real `qlactors web --config control.toml`. A run
requested through the API runs on the worker; its log, shipped to the database, is read and
streamed to its final offset; tokens and refusals behave as on edge."""

from __future__ import annotations

import base64

import pytest

from cluster_harness import make_cluster
from web_rigs import WebServer, wait_state


@pytest.fixture(scope="module")
def cluster_site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("web-cluster")
    cluster = make_cluster(tmp)
    server = None
    try:
        cluster.new_key("w1")
        cluster.allow("w1")
        cluster.start_worker("w1", slots=2)
        admin = cluster.cli("token", "new", "admin").stdout.decode().strip()
        viewer = cluster.cli("token", "new", "viewer", "--read-only").stdout.decode().strip()
        server = WebServer(tmp, ["--config", str(cluster.cli_config)])
        yield cluster, server, admin, viewer
    finally:
        if server is not None:
            server.stop()
        cluster.close()


def test_a_run_requested_through_the_api_runs_on_a_worker_and_its_log_streams_to_the_end(cluster_site):
    cluster, server, admin, viewer = cluster_site
    script = "i=0; while [ $i -lt 20 ]; do echo line $i; i=$((i+1)); sleep 0.05; done; exit 4"
    added = server.request("POST", "/api/v1/tasks", token=admin, body={"name": "remote", "command": {"shell": script}})
    assert added.status == 201, added
    assert server.request("POST", "/api/v1/tasks/remote/runs", token=viewer).code == "read_only"
    run = server.request("POST", "/api/v1/tasks/remote/runs", token=admin).json()
    streamed = b""
    events = list(server.events(f"/api/v1/runs/{run['id']}/logs/stream", token=admin, timeout=90))
    for kind, event_id, data in events:
        if kind == "log":
            assert data["offset"] == len(streamed)
            streamed += base64.b64decode(data["base64"])
            assert event_id == f"1:{len(streamed)}"
    expected = b"".join(b"line %d\n" % i for i in range(20))
    assert streamed == expected
    assert events[-1][0] == "end" and events[-1][2]["offset"] == len(expected)
    ended = wait_state(server, admin, run["id"], {"failed"}, timeout=60)
    assert ended["attempts"][-1]["exit_code"] == 4 and ended["attempts"][-1]["worker_id"] == "w1"
    assert ended["events"][0]["actor_name"] == "admin"
    window = server.request("GET", f"/api/v1/runs/{run['id']}/logs?offset=7&limit=7", token=admin)
    assert window.body == expected[7:14] and window.headers["x-qlactors-final-offset"] == str(len(expected))


def test_status_and_workers_show_the_replica_and_the_worker(cluster_site):
    _, server, admin, _ = cluster_site
    status = server.request("GET", "/api/v1/status", token=admin).json()
    assert status["profile"] == "cluster" and status["up"] is True and len(status["replicas"]) == 1
    workers = server.request("GET", "/api/v1/workers", token=admin).json()
    assert [w["worker_id"] for w in workers] == ["w1"]


def test_refusals_on_a_cluster_are_the_same_codes(cluster_site):
    _, server, admin, _ = cluster_site
    assert server.request("GET", "/api/v1/tasks").status == 401
    assert server.request("GET", "/api/v1/runs/nope", token=admin).code == "not_found"
    answer = server.request("POST", "/api/v1/tasks", token=admin, body={"name": "x y", "command": {"argv": ["true"]}})
    assert (answer.status, answer.code) == (422, "invalid")
