"""A task's environment values are written, never read back (issue 28): a value planted with
`task add --env` reaches the job, and appears in no CLI output, API body (read-only or admin
token), run event, server or runtime log line, nor the page's HTML/JS; `--json` and the API
give each name with its size. `task show NAME --reveal KEY` prints one value to a terminal only
(or with `--force`). A PATCH of `env` replaces the names it gives, `null` removes one, and the
names it does not give are kept, so a task sent back as the API showed it keeps its values. The
runtime and the web server log at DEBUG here, and neither log holds an API token either."""

from __future__ import annotations

import json

from edge_harness import Home, wait_until
from web_rigs import WebServer, new_token

SECRET = "cookie-pt_key=AAJk9s2-planted-4f1c9a"


def _env(**sizes: int) -> dict:
    return {name: {"set": True, "bytes": n} for name, n in sizes.items()}


def test_an_environment_value_is_never_read_back_and_a_patch_keeps_what_it_does_not_name(tmp_path):
    home = Home(tmp_path, config="[runtime]\nslots = 2\n")
    server = None
    seen: list[str] = []
    try:
        # The job proves the value reached it without printing it (its length, in its exit code).
        home.main("task", "add", "secretive", "--env", f"COOKIE={SECRET}", "--env", "OTHER=plain",
                  "--", 'test "${#COOKIE}" -eq ' + str(len(SECRET)))
        edge = home.start_edge("--log-level", "DEBUG")
        admin, viewer = new_token(home, "admin"), new_token(home, "viewer", read_only=True)
        server = WebServer(tmp_path, ["--home", str(home.path)], args=("--log-level", "DEBUG"))
        for args in (("task", "show", "secretive"), ("task", "show", "secretive", "--json"), ("task", "list"),
                     ("task", "list", "--json")):
            result = home.ok(*args)
            seen += [result.stdout, result.stderr]
        assert json.loads(home.ok("task", "show", "secretive", "--json").stdout)["env"] == _env(
            COOKIE=len(SECRET), OTHER=5)
        assert "COOKIE" in home.ok("task", "show", "secretive").stdout  # the text shows the names
        run_id = home.run("secretive")
        wait_until(lambda: home.show(run_id)["state"] == "succeeded", 30, "the run to succeed")
        for args in (("show", run_id), ("show", run_id, "--json"), ("runs",), ("status",)):
            seen.append(home.ok(*args).stdout)

        for token in (admin, viewer):
            for path in ("/api/v1/tasks", "/api/v1/tasks/secretive", "/api/v1/runs", f"/api/v1/runs/{run_id}",
                         "/api/v1/status"):
                answer = server.request("GET", path, token=token)
                assert answer.status == 200, (path, answer)
                seen.append(answer.body.decode())
        assert server.request("GET", "/api/v1/tasks/secretive", token=viewer).json()["env"] == _env(
            COOKIE=len(SECRET), OTHER=5)

        patched = server.request("PATCH", "/api/v1/tasks/secretive", token=admin,
                                 body={"env": {"OTHER": None, "NEW": "n"}})
        assert patched.status == 200, patched
        seen.append(patched.body.decode())
        assert patched.json()["env"] == _env(COOKIE=len(SECRET), NEW=1)
        shown = server.request("GET", "/api/v1/tasks/secretive", token=admin).json()
        again = server.request("PATCH", "/api/v1/tasks/secretive", token=admin,
                               body={"env": shown["env"], "timeout_ms": 5000})
        assert again.status == 200 and again.json()["env"] == shown["env"], again
        refused = server.request("POST", "/api/v1/tasks", token=admin,
                                 body={"name": "copied", "command": {"argv": ["true"]}, "env": shown["env"]})
        assert (refused.status, refused.code) == (422, "invalid"), refused
        assert "COOKIE" in refused.json()["error"]["message"]
        run_again = home.run("secretive")  # the value kept by both PATCHes still reaches the job
        wait_until(lambda: home.show(run_again)["state"] == "succeeded", 30, "the second run to succeed")
        for path in ("/", "/page.js", "/page.css"):
            seen.append(server.request("GET", path).body.decode())

        piped = home.ql("task", "show", "secretive", "--reveal", "COOKIE")
        assert piped.returncode == 2 and "terminal" in piped.stderr, piped
        seen += [piped.stdout, piped.stderr]
        missing = home.ql("task", "show", "secretive", "--reveal", "NOPE", "--force")
        assert missing.returncode == 2 and "NOPE" in missing.stderr, missing
        forced = home.ql("task", "show", "secretive", "--reveal", "COOKIE", "--force")
        assert (forced.returncode, forced.stdout) == (0, SECRET + "\n"), forced

        refused = server.request("GET", "/api/v1/tasks", token=admin + "x")  # a wrong token: 401
        assert refused.status == 401, refused
        logs = [edge.log(), server.log()]
        assert all(" DEBUG " in text for text in logs), "both logged at DEBUG"
        seen += [*logs, home.ok("task", "show", "secretive", "--json").stdout]
        leaked = [text[max(0, text.find(SECRET) - 200):text.find(SECRET) + 50] for text in seen if SECRET in text]
        assert not leaked, leaked
        tokens = [t for t in (admin, viewer, admin + "x") if any(t in text for text in logs)]
        assert not tokens, "an API token in a log"
    finally:
        if server is not None:
            server.stop()
        home.close()
