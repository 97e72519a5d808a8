"""`/metrics` through a real `qlactors web` over a real edge home: it parses with
prometheus_client's own parser, its figures match the database, and the finished-run counters
stay as they were after retention deletes the runs they counted."""

from __future__ import annotations

import pytest

from edge_harness import Home, wait_until
from web_rigs import WebServer, new_token, wait_state


def _parse(text: str) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


@pytest.fixture(scope="module")
def metered(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("metrics")
    home = Home(tmp, config="[runtime]\nslots = 2\n")
    server = None
    try:
        home.main("task", "add", "good", "--", "true")
        home.main("task", "add", "bad", "--", "sh -c 'sleep 1.2; exit 1'")
        home.start_edge()
        token = new_token(home, "prometheus", read_only=True)
        admin = new_token(home, "admin")
        server = WebServer(tmp, ["--home", str(home.path)])
        yield home, server, token, admin
    finally:
        if server is not None:
            server.stop()
        home.close()


def _run(server, admin, task: str, state: str) -> str:
    run = server.request("POST", f"/api/v1/tasks/{task}/runs", token=admin).json()
    wait_state(server, admin, run["id"], {state})
    return run["id"]


def test_metrics_parse_match_the_database_and_survive_retention(metered):
    home, server, token, admin = metered
    assert server.request("GET", "/metrics").status == 401
    for _ in range(3):
        _run(server, admin, "good", "succeeded")
    for _ in range(2):
        _run(server, admin, "bad", "failed")
    answer = server.request("GET", "/metrics", token=token)
    assert answer.status == 200 and answer.headers["content-type"].startswith("text/plain")
    figures = _parse(answer.body.decode())
    in_db = {(r["name"], r["status"]): r["n"] for r in home.query(
        "SELECT t.name, r.status, count(*) AS n FROM runs r JOIN tasks t ON t.id = r.task_id GROUP BY 1, 2")}
    assert in_db == {("good", "succeeded"): 3, ("bad", "failed"): 2}
    for (task, state), n in in_db.items():
        assert figures[("qlactors_runs_finished_total", (("state", state), ("task", task)))] == n
        assert figures[("qlactors_run_duration_seconds_count", (("state", state), ("task", task)))] == n
    # The failing job sleeps 1.2 s: neither of its runs is in the 1-second bucket, both in the 5-second one.
    bad = (("state", "failed"), ("task", "bad"))
    assert figures[("qlactors_run_duration_seconds_bucket", (("le", "1.0"), *bad))] == 0
    assert figures[("qlactors_run_duration_seconds_bucket", (("le", "5.0"), *bad))] == 2
    assert 2.4 <= figures[("qlactors_run_duration_seconds_sum", bad)] < 60
    assert figures[("qlactors_queue_depth", ())] == 0
    assert figures[("qlactors_up", ())] == 1
    assert figures[("qlactors_quarantined_receipts", ())] == 0

    # Retention keeps one run of `good`: two are deleted, and the counters do not move.
    changed = server.request("PATCH", "/api/v1/tasks/good", token=admin, body={"retention": {"max_runs": 1}})
    assert changed.status == 200, changed
    wait_until(lambda: home.query("SELECT count(*) AS n FROM runs r JOIN tasks t ON t.id = r.task_id "
                                  "WHERE t.name = 'good'")[0]["n"] == 1, 30, "retention to keep one run of good")
    after = _parse(server.request("GET", "/metrics", token=token).body.decode())
    assert after[("qlactors_runs_finished_total", (("state", "succeeded"), ("task", "good")))] == 3
    assert after[("qlactors_run_duration_seconds_count", (("state", "succeeded"), ("task", "good")))] == 3


def test_queue_depth_and_oldest_queued_age_follow_queued_runs(metered):
    home, server, token, admin = metered
    server.request("POST", "/api/v1/tasks", token=admin, body={"name": "gated", "command": {"argv": ["true"]},
                                                                "labels": ["nowhere"]})
    run = server.request("POST", "/api/v1/tasks/gated/runs", token=admin).json()
    figures = _parse(server.request("GET", "/metrics", token=token).body.decode())
    assert figures[("qlactors_queue_depth", ())] >= 1
    assert figures[("qlactors_runs_active", (("state", "queued"),))] >= 1
    assert figures[("qlactors_oldest_queued_age_seconds", ())] >= 0
    server.request("POST", f"/api/v1/runs/{run['id']}/cancel", token=admin)
    figures = _parse(server.request("GET", "/metrics", token=token).body.decode())
    assert figures[("qlactors_queue_depth", ())] == 0
    assert figures[("qlactors_runs_finished_total", (("state", "cancelled"), ("task", "gated")))] == 1


def test_every_metric_the_sample_dashboard_plots_is_served(metered):
    import json
    import re
    from pathlib import Path

    from prometheus_client.parser import text_string_to_metric_families

    _, server, token, _ = metered
    served = {f.name for f in text_string_to_metric_families(
        server.request("GET", "/metrics", token=token).body.decode())}
    dashboard = (Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json").read_text()
    plotted = {re.sub(r"_(total|bucket|sum|count)$", "", name)
               for name in re.findall(r"qlactors_[a-z_]+", json.dumps(json.loads(dashboard)))}
    cluster_only = {"qlactors_replicas_up", "qlactors_worker_sessions"}
    assert plotted - cluster_only <= served, plotted - served


def test_every_active_state_and_every_tasks_counters_are_there_at_0_and_edge_has_no_worker_sessions(tmp_path):
    """A scrape before any run: `qlactors_runs_active` has every state not finished, at 0, and each
    task's finished and lost counters exist at 0 (a rate over them is defined from the first
    scrape); a task name used again after `task rm` gives one series, not two; edge exports no
    worker sessions (issue 28)."""
    home = Home(tmp_path)
    server = None
    try:
        home.main("task", "add", "fresh", "--", "true")
        home.main("task", "add", "reused", "--", "true")
        home.main("task", "rm", "reused")
        home.main("task", "add", "reused", "--", "true")
        token = new_token(home, "prometheus", read_only=True)
        server = WebServer(tmp_path, ["--home", str(home.path)])
        answer = server.request("GET", "/metrics", token=token)
        assert answer.status == 200
        text = answer.body.decode()
        samples = _parse(text)
    finally:
        if server is not None:
            server.stop()
        home.close()
    for state in ("queued", "dispatching", "running", "retry_wait", "lost"):
        assert samples[("qlactors_runs_active", (("state", state),))] == 0, state
    for task in ("fresh", "reused"):
        for state in ("succeeded", "failed", "cancelled", "timed_out"):
            assert samples[("qlactors_runs_finished_total", (("state", state), ("task", task)))] == 0
        assert samples[("qlactors_runs_lost_total", (("task", task),))] == 0
    assert "qlactors_worker_sessions" not in text
    lines = [line for line in text.splitlines() if line.startswith("qlactors_runs_finished_total{")]
    assert len(lines) == len(set(line.rsplit(" ", 1)[0] for line in lines)) == 8, lines


def test_a_task_name_used_again_after_task_rm_gives_no_two_series_with_the_same_labels(tmp_path):
    """Add x, run it, remove it, add x again, run it: every series of the scrape has labels of its
    own (a duplicate makes Prometheus refuse the whole scrape), and x's counters go on from the
    first x's (issue 28)."""
    from prometheus_client.parser import text_string_to_metric_families

    home = Home(tmp_path)
    server = None
    try:
        home.main("task", "add", "x", "--", "true")
        home.start_edge()
        home.ok("run", "x", "--wait")
        home.main("task", "rm", "x")
        home.main("task", "add", "x", "--", "true")
        home.ok("run", "x", "--wait")
        token = new_token(home, "prometheus", read_only=True)
        server = WebServer(tmp_path, ["--home", str(home.path)])
        answer = server.request("GET", "/metrics", token=token)
    finally:
        if server is not None:
            server.stop()
        home.close()
    assert answer.status == 200
    keys = [(sample.name, tuple(sorted(sample.labels.items())))
            for family in text_string_to_metric_families(answer.body.decode()) for sample in family.samples]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
    samples = _parse(answer.body.decode())
    x = (("state", "succeeded"), ("task", "x"))
    assert samples[("qlactors_runs_finished_total", x)] == 2
    assert samples[("qlactors_run_duration_seconds_count", x)] == 2
