"""The HTTP API through a real `qlactors web` process on 127.0.0.1, over a real edge home with a
real `qlactors edge` runtime: every route, every error code, tokens, the audit trail, and a log
read and streamed over Server-Sent Events (tests/harness/web_rigs.py)."""

from __future__ import annotations

import base64
import time

import pytest

from edge_harness import Home, wait_until
from web_rigs import WebServer, new_token, wait_state


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """One home, its runtime (4 slots) and its web server, shared by the module's tests: each test
    uses tasks of its own names."""
    tmp = tmp_path_factory.mktemp("web")
    home = Home(tmp, config="[runtime]\nslots = 4\n")
    server = None
    try:
        home.main("task", "add", "hello", "--", "printf 'hello\\n'; exit 3")
        home.start_edge()
        admin, viewer = new_token(home, "admin"), new_token(home, "viewer", read_only=True)
        server = WebServer(tmp, ["--home", str(home.path)])
        yield home, server, admin, viewer
    finally:
        if server is not None:
            server.stop()
        home.close()


def test_no_token_an_unknown_one_or_a_revoked_one_is_401_and_the_description_needs_none(site):
    home, server, admin, _ = site
    for headers in ({}, {"Authorization": "Bearer qlt_nope"}, {"Authorization": "Basic abc"}):
        answer = server.request("GET", "/api/v1/tasks", headers=headers)
        assert (answer.status, answer.code) == (401, "unauthorized")
        assert answer.headers["www-authenticate"].startswith("Bearer")
    gone = new_token(home, "short-lived")
    assert server.request("GET", "/api/v1/tasks", token=gone).status == 200
    home.main("token", "revoke", "short-lived")
    assert server.request("GET", "/api/v1/tasks", token=gone).status == 401
    assert server.request("GET", "/api/v1/openapi.json").status == 200


def test_a_read_only_token_reads_everything_and_changes_nothing(site):
    home, server, admin, viewer = site
    assert server.request("GET", "/api/v1/tasks", token=viewer).status == 200
    assert server.request("GET", "/api/v1/runs", token=viewer).status == 200
    assert server.request("GET", "/api/v1/status", token=viewer).status == 200
    before = server.request("GET", "/api/v1/runs?task=hello", token=admin).json()["runs"]
    writes = [("POST", "/api/v1/tasks", {"name": "ro", "command": {"argv": ["true"]}}),
              ("PATCH", "/api/v1/tasks/hello", {"timeout_ms": 5000}), ("DELETE", "/api/v1/tasks/hello", None),
              ("POST", "/api/v1/tasks/hello/disable", None), ("POST", "/api/v1/tasks/hello/runs", None)]
    for method, path, body in writes:
        answer = server.request(method, path, token=viewer, body=body)
        assert (answer.status, answer.code) == (403, "read_only"), (method, path, answer)
    assert server.request("GET", "/api/v1/runs?task=hello", token=admin).json()["runs"] == before
    assert server.request("GET", "/api/v1/tasks/ro", token=admin).status == 404
    task = server.request("GET", "/api/v1/tasks/hello", token=admin).json()
    assert task["enabled"] is True and task["revision"] == 1


def test_a_change_from_another_origin_is_refused_and_one_from_this_origin_is_not(site):
    _, server, admin, _ = site
    body = {"name": "origin-check", "command": {"argv": ["true"]}}
    answer = server.request("POST", "/api/v1/tasks", token=admin, body=body,
                            headers={"Origin": "http://evil.example"})
    assert (answer.status, answer.code) == (403, "cross_origin")
    assert server.request("GET", "/api/v1/tasks/origin-check", token=admin).status == 404
    answer = server.request("POST", "/api/v1/tasks", token=admin, body=body,
                            headers={"Origin": f"http://127.0.0.1:{server.port}"})
    assert answer.status == 201, answer
    assert "access-control-allow-origin" not in answer.headers


def test_a_task_is_added_shown_changed_disabled_and_removed_with_who_did_it(site):
    _, server, admin, _ = site
    body = {"name": "lifecycle", "command": {"argv": ["echo", "one"]}, "timeout_ms": 60000,
            "env": {"GREETING": "hi"}, "trigger": {"cron": "0 3 * * *", "tz": "UTC"}, "labels": []}
    added = server.request("POST", "/api/v1/tasks", token=admin, body=body)
    assert added.status == 201, added
    task = added.json()
    assert (task["name"], task["revision"], task["timeout_ms"]) == ("lifecycle", 1, 60000)
    assert task["command"] == {"argv": ["echo", "one"]} and task["env"] == {"GREETING": {"set": True, "bytes": 2}}
    assert task["trigger"]["cron"] == "0 3 * * *"
    changed = server.request("PATCH", "/api/v1/tasks/lifecycle", token=admin,
                             body={"command": {"shell": "echo two; echo three"}, "trigger": None})
    assert changed.status == 200, changed
    task = changed.json()
    assert task["revision"] == 2 and task["trigger"] is None and task["command"] == {"shell": "echo two; echo three"}
    same = server.request("PATCH", "/api/v1/tasks/lifecycle", token=admin, body={})
    assert same.json()["revision"] == 2
    assert server.request("POST", "/api/v1/tasks/lifecycle/disable", token=admin).json()["enabled"] is False
    assert server.request("POST", "/api/v1/tasks/lifecycle/enable", token=admin).json()["enabled"] is True
    shown = server.request("GET", "/api/v1/tasks/lifecycle", token=admin).json()
    history = shown["history"]
    assert [e["type"] for e in history] == ["enabled", "disabled", "updated", "added"]
    assert {e["actor_name"] for e in history} == {"admin"}
    assert "command" in history[2]["changed"]
    assert "echo" not in str(history) and "hi" not in str([e.get("changed") for e in history])
    removed = server.request("DELETE", "/api/v1/tasks/lifecycle", token=admin)
    assert removed.json() == {"task": "lifecycle", "cancelled": [], "requested": []}
    assert server.request("GET", "/api/v1/tasks/lifecycle", token=admin).code == "not_found"
    names = [t["name"] for t in server.request("GET", "/api/v1/tasks", token=admin).json()]
    assert "lifecycle" not in names and "hello" in names


def test_bad_input_is_400_404_409_or_422_with_the_clis_words_and_writes_nothing(site):
    home, server, admin, _ = site
    cases = [
        ("POST", "/api/v1/tasks", b"{not json", 400, "bad_json"),
        ("POST", "/api/v1/tasks", {"name": "bad", "command": {"argv": ["x"]}, "timeout_ms": -1}, 422, "invalid"),
        ("POST", "/api/v1/tasks", {"name": "bad", "command": "echo"}, 422, "invalid"),
        ("POST", "/api/v1/tasks", {"name": "bad"}, 422, "invalid"),
        ("POST", "/api/v1/tasks", {"name": "bad", "command": {"argv": ["x"]}, "colour": 1}, 422, "invalid"),
        ("POST", "/api/v1/tasks", {"name": "bad", "command": {"argv": ["x"]}, "trigger": {"cron": "61 * * * *"}},
         422, "invalid"),
        ("POST", "/api/v1/tasks", {"name": "hello", "command": {"argv": ["x"]}}, 409, "already_exists"),
        ("PATCH", "/api/v1/tasks/hello", {"max_concurrent": "two"}, 422, "invalid"),
        ("PATCH", "/api/v1/tasks/hello", {"enabled": False, "timeout_ms": 5000}, 422, "invalid"),
        ("PATCH", "/api/v1/tasks/nobody", {"timeout_ms": 5}, 404, "not_found"),
        ("POST", "/api/v1/tasks/nobody/runs", None, 404, "not_found"),
        ("GET", "/api/v1/runs/no-such-run", None, 404, "not_found"),
        ("POST", "/api/v1/runs/no-such-run/cancel", None, 404, "not_found"),
        ("GET", "/api/v1/runs?state=sleeping", None, 422, "invalid"),
        ("GET", "/api/v1/runs?limit=zero", None, 400, "bad_query"),
        ("GET", "/api/v1/runs?cursor=xyz", None, 422, "invalid"),
        ("GET", "/api/v1/runs?since=yesterday", None, 422, "invalid"),
        ("GET", "/api/v1/nowhere", None, 404, "no_route"),
        ("PUT", "/api/v1/tasks", None, 405, "method_not_allowed"),
    ]
    before = home.query("SELECT count(*) AS n FROM task_revisions")[0]["n"]
    for method, path, body, status, code in cases:
        raw = body if isinstance(body, bytes) else None
        answer = server.request(method, path, token=admin, body=None if raw else body, raw=raw)
        assert (answer.status, answer.code) == (status, code), (method, path, body, answer)
        assert answer.json()["error"]["message"]
    assert home.query("SELECT count(*) AS n FROM task_revisions")[0]["n"] == before
    refused = server.request("POST", "/api/v1/tasks", token=admin,
                             body={"name": "bad", "command": {"argv": ["x"]}, "timeout_ms": -1})
    assert "--timeout" in refused.json()["error"]["message"]  # the CLI's words


def test_a_run_requested_through_the_api_runs_and_its_log_streams_to_the_final_offset(site):
    home, server, admin, _ = site
    made = server.request("POST", "/api/v1/tasks/hello/runs", token=admin)
    assert made.status == 201, made
    run = wait_state(server, admin, made.json()["id"], {"failed"})
    assert run["attempts"][-1]["exit_code"] == 3
    # The admission's events are the token's; what the runtime did itself has no person behind it.
    assert run["events"][0]["actor_name"] == "admin"
    assert {e["actor_name"] for e in run["events"] if e["actor_type"] == "user"} == {"admin"}
    assert {e["actor_name"] for e in run["events"] if e["actor_type"] != "user"} == {None}
    log = server.request("GET", f"/api/v1/runs/{run['id']}/logs", token=admin)
    assert log.body == b"hello\n" and log.headers["x-qlactors-final-offset"] == "6"
    assert log.headers["x-qlactors-complete"] == "true"
    tail = server.request("GET", f"/api/v1/runs/{run['id']}/logs?offset=2", token=admin)
    assert tail.body == b"llo\n"
    events = list(server.events(f"/api/v1/runs/{run['id']}/logs/stream", token=admin))
    assert events[-1][0] == "end" and events[-1][2] == {"attempt": 1, "offset": 6, "state": "failed", "complete": True}
    assert b"".join(base64.b64decode(d["base64"]) for k, _, d in events if k == "log") == b"hello\n"
    listed = server.request("GET", "/api/v1/runs?task=hello&limit=1", token=admin).json()
    assert listed["runs"][0]["id"] == run["id"]


def test_an_idempotency_key_admits_one_run_and_a_retry_is_a_new_run_of_the_same_revision(site):
    _, server, admin, _ = site
    first = server.request("POST", "/api/v1/tasks/hello/runs", token=admin, headers={"Idempotency-Key": "k-1"})
    again = server.request("POST", "/api/v1/tasks/hello/runs", token=admin, headers={"Idempotency-Key": "k-1"})
    assert (first.status, again.status) == (201, 200) and first.json()["id"] == again.json()["id"]
    wait_state(server, admin, first.json()["id"], {"failed"})
    retried = server.request("POST", f"/api/v1/runs/{first.json()['id']}/retry", token=admin)
    assert retried.status == 201 and retried.json()["retry_of_run_id"] == first.json()["id"]
    wait_state(server, admin, retried.json()["id"], {"failed"})
    running = server.request("POST", "/api/v1/tasks", token=admin,
                             body={"name": "not-done", "command": {"argv": ["sleep", "30"]}})
    assert running.status == 201
    live = server.request("POST", "/api/v1/tasks/not-done/runs", token=admin).json()
    refused = server.request("POST", f"/api/v1/runs/{live['id']}/retry", token=admin)
    assert (refused.status, refused.code) == (422, "invalid")
    server.request("POST", f"/api/v1/runs/{live['id']}/cancel", token=admin)
    wait_state(server, admin, live["id"], {"cancelled"})


def test_cancel_stops_a_long_run_and_says_what_it_did(site):
    _, server, admin, _ = site
    server.request("POST", "/api/v1/tasks", token=admin,
                   body={"name": "long", "command": {"shell": "echo started; sleep 60"}})
    run = server.request("POST", "/api/v1/tasks/long/runs", token=admin).json()
    wait_state(server, admin, run["id"], {"running"})
    first = server.request("POST", f"/api/v1/runs/{run['id']}/cancel", token=admin).json()
    assert first["result"] in ("requested", "cancelled")
    ended = wait_state(server, admin, run["id"], {"cancelled"})
    cancel_event = next(e for e in ended["events"] if e["type"] == "run.cancel_requested")
    assert cancel_event["actor_name"] == "admin"
    again = server.request("POST", f"/api/v1/runs/{run['id']}/cancel", token=admin).json()
    assert again["result"] == "already_terminal"


def test_a_stream_resumed_with_last_event_id_has_no_gap_and_no_repeat(site):
    _, server, admin, _ = site
    script = "i=0; while [ $i -lt 40 ]; do printf 'line %03d\\n' $i; i=$((i+1)); sleep 0.05; done"
    server.request("POST", "/api/v1/tasks", token=admin, body={"name": "counting", "command": {"shell": script}})
    run = server.request("POST", "/api/v1/tasks/counting/runs", token=admin).json()
    path = f"/api/v1/runs/{run['id']}/logs/stream"
    got, last_id = b"", None
    for kind, event_id, data in server.events(path, token=admin):
        if kind == "log":
            assert data["offset"] == len(got)  # each event starts where the last one ended
            got += base64.b64decode(data["base64"])
            last_id = event_id
            if len(got) >= 90:
                break  # the client goes away mid-run
    assert last_id == f"1:{len(got)}"  # attempt 1, up to this offset
    for kind, event_id, data in server.events(path, token=admin, headers={"Last-Event-ID": last_id}):
        if kind == "log":
            assert data["offset"] == len(got)
            got += base64.b64decode(data["base64"])
        elif kind == "end":
            assert data["offset"] == len(got)
    assert got == b"".join(b"line %03d\n" % i for i in range(40))
    for bad in ("12", "0:5", "x:1", "1:-2"):
        assert server.request("GET", path, token=admin, headers={"Last-Event-ID": bad}).code == "bad_query"
    assert server.request("GET", path + "?offset=%C2%B2", token=admin).code == "bad_query"


def test_a_client_that_stops_reading_its_stream_does_not_slow_the_job(site):
    """The job writes 8 MiB as fast as it can, once alone and once with an SSE client that reads
    nothing: the server only reads the file, so the job's run time stays of the same order."""
    _, server, admin, _ = site
    script = "head -c 8388608 /dev/zero | tr '\\0' x; echo"
    server.request("POST", "/api/v1/tasks", token=admin, body={"name": "flood", "command": {"shell": script}})

    def one_run(stalled: bool) -> float:
        run = server.request("POST", "/api/v1/tasks/flood/runs", token=admin).json()
        conn = None
        if stalled:
            conn = server.connection()
            conn.request("GET", f"/api/v1/runs/{run['id']}/logs/stream",
                         headers={"Authorization": f"Bearer {admin}"})
            conn.getresponse()  # headers only: the body is never read
        ended = wait_state(server, admin, run["id"], {"succeeded", "failed"}, timeout=60)
        attempt = ended["attempts"][-1]
        if conn is not None:
            conn.close()
        assert ended["state"] == "succeeded"
        return (attempt["finished_at_ms"] - attempt["started_at_ms"]) / 1000

    alone, stalled = one_run(False), one_run(True)
    # A generous bound (shared, noisy machines): a blocked job would take the whole 60 s.
    assert stalled < max(5.0, alone * 5), (alone, stalled)


def test_status_and_workers_answer_as_the_cli_does(site):
    home, server, admin, _ = site
    status = server.request("GET", "/api/v1/status", token=admin).json()
    assert status["profile"] == "edge" and status["up"] is True and status["home"] == str(home.path)
    assert status["quarantined_receipts"] == 0
    assert server.request("GET", "/api/v1/workers", token=admin).json() == []


def test_the_server_log_holds_no_secret_command_or_output(site):
    home, server, admin, viewer = site
    text = server.log()
    for secret in (admin, viewer, "printf", "hello\\n", "GREETING"):
        assert secret not in text


def test_a_retired_run_is_404_retired_and_a_huge_body_is_413(site):
    home, server, admin, _ = site
    server.request("POST", "/api/v1/tasks", token=admin,
                   body={"name": "short-memory", "command": {"argv": ["true"]}, "retention": {"max_runs": 1}})
    first = server.request("POST", "/api/v1/tasks/short-memory/runs", token=admin).json()
    wait_state(server, admin, first["id"], {"succeeded"})
    second = server.request("POST", "/api/v1/tasks/short-memory/runs", token=admin).json()
    wait_state(server, admin, second["id"], {"succeeded"})

    def retired():
        answer = server.request("GET", f"/api/v1/runs/{first['id']}", token=admin)
        return answer if answer.status == 404 else None
    answer = wait_until(retired, 30, "retention to retire the first run")
    assert answer.code == "retired" and "was retired" in answer.json()["error"]["message"]
    assert server.request("GET", f"/api/v1/runs/{first['id']}/logs", token=admin).code == "retired"
    huge = server.request("POST", "/api/v1/tasks", token=admin, raw=b"{" + b" " * (1024 * 1024 + 1) + b"}")
    assert (huge.status, huge.code) == (413, "too_large")


def test_a_database_that_stays_locked_is_503_and_nothing_is_written(site):
    """Another process holds SQLite's write lock past the busy timeout (5 s): a change is refused
    with 503 `store_unavailable`, and reads still answer (WAL readers are not blocked)."""
    import sqlite3

    home, server, admin, _ = site
    before = home.query("SELECT count(*) AS n FROM runs")[0]["n"]
    holder = sqlite3.connect(home.db_path, timeout=1, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        answer = server.request("POST", "/api/v1/tasks/hello/runs", token=admin, timeout=60)
        assert (answer.status, answer.code) == (503, "store_unavailable"), answer
        assert server.request("GET", "/api/v1/tasks/hello", token=admin).status == 200
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert home.query("SELECT count(*) AS n FROM runs")[0]["n"] == before


def test_a_body_that_is_not_plain_json_is_400_at_any_depth_and_never_a_500(site):
    """Nesting to 100,000 levels, a 5,000-digit number, a name given twice, another media type: 400
    `bad_json` naming why, nothing written; a declared Content-Length over the cap: 413 before a
    byte is read (issue 28)."""
    home, server, admin, _ = site
    before = home.query("SELECT count(*) AS n FROM task_revisions")[0]["n"]
    json_type = {"Content-Type": "application/json"}
    for depth in (10, 1_000, 100_000):
        nested = b'{"name": "deep", "command": ' + b"[" * depth + b"]" * depth + b"}"
        answer = server.request("POST", "/api/v1/tasks", token=admin, raw=nested, headers=json_type)
        assert (answer.status, answer.code) in ((400, "bad_json"), (422, "invalid")), (depth, answer)
        assert depth < 1_000 or answer.code == "bad_json", (depth, answer)
    cases = [(b'{"name": "big", "timeout_ms": ' + b"9" * 5000 + b"}", json_type, "digit"),
             (b'{"name": "twice", "name": "again"}', json_type, "twice"),
             (b'{"name": "typed"}', {"Content-Type": "text/plain"}, "application/json")]
    huge_limit = server.request("GET", "/api/v1/runs?limit=" + "9" * 40, token=admin)
    assert (huge_limit.status, huge_limit.code) == (400, "bad_query") and "too large" in huge_limit.json()["error"]["message"]
    for raw, headers, words in cases:
        answer = server.request("POST", "/api/v1/tasks", token=admin, raw=raw, headers=headers)
        assert (answer.status, answer.code) == (400, "bad_json"), (raw[:40], answer)
        assert words in answer.json()["error"]["message"], answer
    conn = server.connection()
    try:
        conn.putrequest("POST", "/api/v1/tasks")
        conn.putheader("Authorization", f"Bearer {admin}")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(300 * 1024 * 1024))
        conn.endheaders()  # and not a byte of the 300 MiB it announces
        reply = conn.getresponse()
        assert reply.status == 413, reply.read()
    finally:
        conn.close()
    assert home.query("SELECT count(*) AS n FROM task_revisions")[0]["n"] == before
    assert "Traceback" not in server.log()


def test_every_422_names_the_field_it_refuses(site):
    """A refused value's body says which field it is (`"field"`, a path such as `trigger.cron`), so
    a form can show the error where it belongs; a refusal about no one field says `null` (issue 28)."""
    home, server, admin, _ = site
    argv = {"argv": ["x"]}
    cases = [
        ("POST", {"name": "f1", "command": argv, "timeout_ms": -1}, "timeout_ms"),
        ("POST", {"name": "f1", "command": "echo"}, "command"),
        ("POST", {"name": "f1"}, "command"),
        ("POST", {"name": "-f1", "command": argv}, "name"),
        ("POST", {"name": "f1", "command": argv, "trigger": {"cron": "61 * * * *"}}, "trigger.cron"),
        ("POST", {"name": "f1", "command": argv, "trigger": {"cron": "* * * * *", "tz": "Mars/Base"}}, "trigger.tz"),
        ("POST", {"name": "f1", "command": argv, "retry": {"max_attempts": 0}}, "retry.max_attempts"),
        ("POST", {"name": "f1", "command": argv, "env": {"1X": "v"}}, "env"),
        ("POST", {"name": "f1", "command": argv, "labels": [1]}, "labels"),
        ("POST", {"name": "f1", "command": argv, "cwd": "relative/dir"}, "cwd"),
        ("POST", {"name": "f1", "command": argv, "retention": {"max_runs": -3}}, "retention"),
        ("PATCH", {"max_concurrent": "two"}, "max_concurrent"),
        ("POST", {"name": "f1", "command": argv, "colour": 1}, None),
    ]
    for method, body, field in cases:
        path = "/api/v1/tasks" if method == "POST" else "/api/v1/tasks/hello"
        answer = server.request(method, path, token=admin, body=body)
        assert (answer.status, answer.code) == (422, "invalid"), (body, answer)
        assert "field" in answer.json()["error"] and answer.json()["error"]["field"] == field, (body, answer)
    assert server.request("GET", "/api/v1/tasks/f1", token=admin).status == 404
