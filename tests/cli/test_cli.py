"""The `qlactors` command as users drive it (ARCHITECTURE.md "Command line"): a real subprocess each.

Every test gets its own home. Each subprocess costs close to a second (SQLAlchemy's import), so
independent commands run side by side and read-only checks share one prepared home.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
from pathlib import Path

import pytest

import qlactors
from cli_harness import UUID, UNKNOWN_RUN, clean_env, ql, ok, ok_json, in_parallel, assert_refused


# --- tasks ---------------------------------------------------------------------------------------


def test_task_add_one_spaced_word_is_a_shell_string_several_words_an_argv_and_options_are_stored(tmp_path):
    home = tmp_path / "home"
    (tmp_path / "sub" / "dir").mkdir(parents=True)  # a --cwd that does not exist is refused
    ok("task", "add", "sh1", "--", "echo hi && echo there", home=home)
    added = ok("task", "add", "argv1", "--timeout", "2.5", "--stop-grace", "3", "--max-concurrent", "4",
               "--cwd", "sub/dir", "--env", "A=1", "--env", "B=x=y", "--retry-on-lost",
               "--max-attempts", "3", "--safety", "idempotent", "--backoff", "2,60",
               "--", "echo", "a b", "c", home=home, cwd=tmp_path)
    assert "revision 1" in added.stdout
    shell, argv = in_parallel([(("task", "show", name, "--json"), {"home": home})
                               for name in ("sh1", "argv1")])
    shell, argv = json.loads(shell.stdout), json.loads(argv.stdout)

    assert shell["name"] == "sh1" and shell["revision"] == 1 and shell["enabled"] is True
    assert shell["command"] == {"shell": "echo hi && echo there"}
    assert shell["timeout_ms"] is None and shell["cwd"] is None and shell["env"] == {}
    assert shell["max_concurrent"] == 1 and shell["retry"]["retry_on_lost"] is False

    assert argv["command"] == {"argv": ["echo", "a b", "c"]}
    assert argv["timeout_ms"] == 2500
    assert argv["stop_grace_ms"] == 3000
    assert argv["max_concurrent"] == 4
    assert argv["cwd"] == str(tmp_path / "sub" / "dir")  # relative became absolute
    assert argv["env"] == {"A": {"set": True, "bytes": 1}, "B": {"set": True, "bytes": 3}}  # never the values
    assert argv["retry"] == {"retry_on_lost": True, "max_attempts": 3, "safety": "idempotent",
                             "backoff_base_ms": 2000, "backoff_max_ms": 60000}


def test_task_update_makes_a_new_revision_and_existing_runs_keep_their_pinned_revision(tmp_path):
    home = tmp_path / "home"
    ok("task", "add", "t", "--timeout", "9", "--", "echo", "old", home=home)
    run_id = ok("run", "t", home=home).stdout.strip()
    updated = ok("task", "update", "t", "--timeout", "5", "--", "sleep 1; echo new", home=home)
    assert "revision 2" in updated.stdout
    task, run = in_parallel([(("task", "show", "t", "--json"), {"home": home}),
                             (("show", run_id, "--json"), {"home": home})])
    task, run = json.loads(task.stdout), json.loads(run.stdout)
    assert task["revision"] == 2
    assert task["command"] == {"shell": "sleep 1; echo new"}  # `--` replaced the command
    assert task["timeout_ms"] == 5000
    assert task["id"] and run["task"] == "t"
    assert run["task_revision"] == 1


def test_task_disable_and_enable_show_in_json_and_a_manual_run_still_works_while_disabled(tmp_path):
    home = tmp_path / "home"
    ok("task", "add", "t", "--", "true", home=home)
    assert "disabled" in ok("task", "disable", "t", home=home).stdout
    shown, run = in_parallel([(("task", "show", "t", "--json"), {"home": home}),
                              (("run", "t"), {"home": home})])
    assert json.loads(shown.stdout)["enabled"] is False
    assert run.returncode == 0 and UUID.match(run.stdout.strip()), run
    ok("task", "enable", "t", home=home)
    assert ok_json("task", "show", "t", home=home)["enabled"] is True


def test_task_list_shows_every_task_sorted_by_name(tmp_path):
    home = tmp_path / "home"
    ok("task", "add", "zeta", "--", "true", home=home)  # creates the database first
    added = in_parallel([(("task", "add", name, "--", "true"), {"home": home}) for name in ("alpha", "mid")])
    assert [r.returncode for r in added] == [0, 0], added
    as_json, as_text = in_parallel([(("task", "list", "--json"), {"home": home}),
                                    (("task", "list",), {"home": home})])
    assert [t["name"] for t in json.loads(as_json.stdout)] == ["alpha", "mid", "zeta"]
    rows = as_text.stdout.splitlines()
    assert rows[0].split()[0] == "NAME"
    assert [r.split()[0] for r in rows[1:]] == ["alpha", "mid", "zeta"]


def test_task_rm_refuses_while_a_run_is_queued_and_force_cancels_it_keeping_history(tmp_path):
    home = tmp_path / "home"
    ok("task", "add", "t", "--", "true", home=home)
    run_id = ok("run", "t", home=home).stdout.strip()

    assert_refused(ql("task", "rm", "t", home=home), "active run")
    # The refusal removed nothing: the task is still there for --force to remove (else "no task").
    forced = ok("task", "rm", "t", "--force", home=home)
    assert run_id in forced.stdout and "task t removed" in forced.stdout
    listed, run = in_parallel([(("task", "list", "--json"), {"home": home}),
                               (("show", run_id, "--json"), {"home": home})])
    assert json.loads(listed.stdout) == []
    run = json.loads(run.stdout)
    assert run["state"] == "cancelled"
    assert run["task"] == "t"  # history is kept and still names its task
    assert [a["state"] for a in run["attempts"]] == ["cancelled"]

    again = ok("task", "add", "t", "--", "echo", "again", home=home)  # the name is free again
    assert "revision 1" in again.stdout


# --- runs ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory):
    """A home with tasks a and b and three queued runs, oldest first: a, b, a."""
    home = tmp_path_factory.mktemp("runs") / "home"
    ok("task", "add", "a", "--", "true", home=home)
    add_b, first = in_parallel([(("task", "add", "b", "--", "true"), {"home": home}),
                                (("run", "a"), {"home": home})])
    assert add_b.returncode == 0, add_b
    requests = [first] + [ql("run", name, home=home) for name in ("b", "a")]
    return home, requests


def test_run_prints_only_the_run_id(three_runs):
    _, requests = three_runs
    for result in requests:
        assert result.returncode == 0, result
        assert result.stdout.endswith("\n") and result.stdout.count("\n") == 1, result.stdout
        assert UUID.match(result.stdout[:-1]), result.stdout
    assert len({r.stdout for r in requests}) == 3


def test_runs_lists_newest_first_filters_by_task_and_state_and_pages_without_overlap(three_runs):
    home, requests = three_runs
    r1, r2, r3 = (r.stdout.strip() for r in requests)
    every, of_a, queued, cancelled, first = in_parallel([
        (("runs", "--json"), {"home": home}),
        (("runs", "--task", "a", "--json"), {"home": home}),
        (("runs", "--state", "queued", "--json"), {"home": home}),
        (("runs", "--state", "cancelled", "--json"), {"home": home}),
        (("runs", "--limit", "2"), {"home": home}),
    ])
    assert [r["id"] for r in json.loads(every.stdout)] == [r3, r2, r1]
    assert [r["id"] for r in json.loads(of_a.stdout)] == [r3, r1]
    assert [r["id"] for r in json.loads(queued.stdout)] == [r3, r2, r1]
    assert json.loads(cancelled.stdout) == []

    assert first.returncode == 0, first
    first_ids = [line.split()[0] for line in first.stdout.splitlines()[1:]]
    assert first_ids == [r3, r2]
    match = re.search(r"^more: qlactors runs --after (\S+)$", first.stderr, re.M)
    assert match, first.stderr
    second = ok("runs", "--limit", "2", "--after", match.group(1), home=home)
    second_ids = [line.split()[0] for line in second.stdout.splitlines()[1:]]
    assert second_ids == [r1]  # the rest, nothing shown twice
    assert "more:" not in second.stderr  # the last page says so


def test_show_json_has_the_documented_run_fields_attempts_and_events(three_runs):
    home, requests = three_runs
    run_id = requests[0].stdout.strip()
    run = ok_json("show", run_id, home=home)
    for key in ("id", "task", "state", "trigger_type", "scheduled_for_ms", "created_at_ms",
                "started_at_ms", "finished_at_ms", "error_code", "attempts", "events"):
        assert key in run, key
    assert run["id"] == run_id and run["task"] == "a" and run["state"] == "queued"
    assert run["trigger_type"] == "manual" and run["scheduled_for_ms"] is None
    assert isinstance(run["created_at_ms"], int) and run["created_at_ms"] > 1_600_000_000_000
    assert run["started_at_ms"] is None and run["finished_at_ms"] is None and run["error_code"] is None

    [attempt] = run["attempts"]
    assert {"number", "state", "exit_code", "started_at_ms", "finished_at_ms"} <= attempt.keys()
    assert attempt["number"] == 1 and attempt["exit_code"] is None

    assert [e["type"] for e in run["events"]] == ["run.created", "run.queued", "attempt.claimed"]
    assert [e["seq"] for e in run["events"]] == [1, 2, 3]
    assert all(isinstance(e["at_ms"], int) and e["at_ms"] >= run["created_at_ms"] for e in run["events"])


def test_cancel_of_a_queued_run_cancels_it_and_a_second_cancel_changes_nothing(tmp_path):
    home = tmp_path / "home"
    ok("task", "add", "t", "--", "true", home=home)
    run_id = ok("run", "t", home=home).stdout.strip()
    assert "cancelled" in ok("cancel", run_id, home=home).stdout
    after_first = ok_json("show", run_id, home=home)
    assert after_first["state"] == "cancelled"
    types = [e["type"] for e in after_first["events"]]
    for expected in ("run.cancel_requested", "attempt.cancelled", "run.cancelled"):
        assert expected in types, types
    assert types.index("run.cancel_requested") < types.index("run.cancelled")
    assert after_first["finished_at_ms"] is not None

    second = ok("cancel", run_id, home=home)
    assert "already" in second.stdout
    after_second = ok_json("show", run_id, home=home)
    assert after_second["state"] == "cancelled"
    assert len(after_second["events"]) == len(after_first["events"])


# --- bad input -------------------------------------------------------------------------------------


def test_bad_input_exits_2_with_one_clear_line_and_writes_nothing(tmp_path):
    home = tmp_path / "home"
    ok("task", "add", "existing", "--", "true", home=home)
    cases = [
        # (argv, fragment of the message)
        (("run", "nope"), "no task named 'nope'"),
        (("task", "show", "nope"), "no task named 'nope'"),
        (("task", "update", "nope", "--timeout", "3"), "no task named 'nope'"),
        (("task", "rm", "nope"), "no task named 'nope'"),
        (("task", "add", "existing", "--", "echo", "dup"), "already exists"),
        (("task", "add", "n1", "--timeout", "-1", "--", "true"), "negative"),
        (("task", "add", "n1", "--timeout", "99999999999", "--", "true"), "absurd"),
        (("task", "add", "n1", "--max-concurrent", "0", "--", "true"), "--max-concurrent"),
        (("task", "add", "n1", "--max-concurrent", "100000", "--", "true"), "--max-concurrent"),
        (("task", "add", "n1", "--max-concurrent", "abc", "--", "true"), "'abc' is not a whole number"),
        (("task", "add", "n1", "--max-attempts", "17", "--", "true"), "max_attempts"),
        (("task", "add", "n1", "--retry-on-lost", "--max-attempts", "3", "--", "true"), "--safety"),
        (("show", UNKNOWN_RUN), f"no run with id '{UNKNOWN_RUN}'"),
        (("cancel", UNKNOWN_RUN), f"no run with id '{UNKNOWN_RUN}'"),
        (("task", "add", "n2", "--"), "no command given"),
        (("run", "existing", "--", "echo", "x"), "`-- COMMAND` belongs to"),
        (("task", "add", "n3", "--env", "NOEQUALS", "--", "true"), "expected NAME=VALUE"),
        (("task", "add", "n3", "--env", "QLACTORS_X=1", "--", "true"), "reserved"),
        (("task", "add", "n3", "--env", "q_token=1", "--", "true"), "names starting with q_ are reserved"),
        (("task", "add", "n3", "--cwd", "", "--", "true"), "--cwd needs a directory"),
        (("runs", "--task", "nope"), "no task named 'nope'"),
        (("runs", "--limit", "0"), "--limit"),
        (("task", "frobnicate"), "invalid choice"),
    ]
    results = in_parallel([(argv, {"home": home}) for argv, _ in cases])
    for (argv, fragment), result in zip(cases, results):
        assert_refused(result, fragment)

    tasks, runs = in_parallel([(("task", "list", "--json"), {"home": home}),
                               (("runs", "--json"), {"home": home})])
    [task] = json.loads(tasks.stdout)
    assert task["name"] == "existing" and task["revision"] == 1
    assert task["command"] == {"argv": ["true"]}
    assert json.loads(runs.stdout) == []


# --- the database file -----------------------------------------------------------------------------


def test_a_corrupt_database_is_refused_and_left_untouched(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    db = home / "qlactors.db"
    db.write_bytes(b"this is not SQLite at all\n" + bytes(range(256)) * 16)
    before = db.read_bytes()
    result = ql("task", "list", home=home)
    assert_refused(result, "not a readable qlactors database")
    assert str(db) in result.stderr
    assert db.read_bytes() == before
    assert sorted(p.name for p in home.iterdir()) == ["qlactors.db"]


def test_a_database_from_a_newer_qlactors_is_refused_not_migrated_down(tmp_path):
    home = tmp_path / "home"
    ok("task", "add", "t", "--", "true", home=home)
    db = home / "qlactors.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("UPDATE qlactors_schema SET version = 999")
        conn.commit()
    before = db.read_bytes()
    result = ql("task", "add", "u", "--", "true", home=home)
    assert_refused(result, "newer")
    assert "999" in result.stderr
    assert db.read_bytes() == before
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT version FROM qlactors_schema").fetchall() == [(999,)]


def _foreign_database(home: Path) -> Path:
    home.mkdir()
    db = home / "qlactors.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES ('mine')")
        conn.commit()
    return db


def test_a_sqlite_file_of_another_application_is_refused(tmp_path):
    db = _foreign_database(tmp_path / "home")
    result = ql("task", "add", "t", "--", "true", home=tmp_path / "home")
    assert_refused(result, "not a qlactors database")
    with contextlib.closing(sqlite3.connect(db)) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        assert names == ["notes"]
        assert conn.execute("SELECT body FROM notes").fetchall() == [("mine",)]


def test_a_sqlite_file_of_another_application_is_left_byte_for_byte_untouched(tmp_path):
    db = _foreign_database(tmp_path / "home")
    before = db.read_bytes()
    assert ql("task", "list", home=tmp_path / "home").returncode == 2
    assert db.read_bytes() == before


# --- where the data lives ----------------------------------------------------------------------------


def test_home_is_home_option_else_qlactors_home_else_xdg_data_home_else_local_share(tmp_path):
    env_home, xdg, option_home, user_home = (tmp_path / n for n in ("env-home", "xdg", "option", "user"))
    xdg.mkdir()
    user_home.mkdir()
    by_env, by_xdg, by_option, by_user_home = in_parallel([
        (("task", "add", "t", "--", "true"),
         {"env": clean_env(QLACTORS_HOME=str(env_home), XDG_DATA_HOME=str(xdg), HOME=str(user_home))}),
        (("task", "add", "t", "--", "true"),
         {"env": clean_env(XDG_DATA_HOME=str(tmp_path / "xdg2"), HOME=str(user_home))}),
        (("--home", option_home, "task", "add", "t", "--", "true"),
         {"env": clean_env(QLACTORS_HOME=str(tmp_path / "ignored"), HOME=str(user_home))}),
        (("task", "add", "t", "--", "true"), {"env": clean_env(HOME=str(user_home))}),
    ])
    for result in (by_env, by_xdg, by_option, by_user_home):
        assert result.returncode == 0, result
    assert (env_home / "qlactors.db").is_file()
    assert not (xdg / "qlactors").exists()  # QLACTORS_HOME wins over XDG_DATA_HOME
    assert (tmp_path / "xdg2" / "qlactors" / "qlactors.db").is_file()  # created on first use
    assert (option_home / "qlactors.db").is_file()
    assert not (tmp_path / "ignored").exists()  # --home wins over QLACTORS_HOME
    assert (user_home / ".local" / "share" / "qlactors" / "qlactors.db").is_file()


def test_config_file_with_an_unknown_key_is_refused_and_a_database_url_is_used(tmp_path):
    bad_runtime = tmp_path / "bad-runtime.toml"
    bad_runtime.write_text("[runtime]\nbogus = 1\n")
    bad_section = tmp_path / "bad-section.toml"
    bad_section.write_text("[nonsense]\nx = 1\n")
    good = tmp_path / "good.toml"
    other = tmp_path / "elsewhere" / "other.db"
    other.parent.mkdir()
    good.write_text(f'[database]\nurl = "sqlite:///{other}"\n')
    home = tmp_path / "home"

    runtime_key, section, used = in_parallel([
        (("--config", bad_runtime, "task", "list"), {"home": tmp_path / "home-bad1"}),
        (("--config", bad_section, "task", "list"), {"home": tmp_path / "home-bad2"}),
        (("--config", good, "task", "add", "t", "--", "true"), {"home": home}),
    ])
    assert_refused(runtime_key, "bogus")
    assert_refused(section, "nonsense")
    assert not (tmp_path / "home-bad1").exists() and not (tmp_path / "home-bad2").exists()
    assert used.returncode == 0, used
    assert other.is_file()
    assert not (home / "qlactors.db").exists()


def test_version_exits_0_and_names_the_version():
    result = ok("--version")
    assert qlactors.__version__ in result.stdout
