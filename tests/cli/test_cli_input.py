"""Bad input on the command line gets one line and exit 2, and nothing is written (issue 9, §5).

Numbers follow one strict grammar, a name given twice to `--env` is refused, names and run ids
that are not UTF-8 are refused before anything is opened, and a `--cwd` that is no directory
is refused by `task add` and `task update`. Each case drives the real `qlactors` command.
"""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from edge_harness import Home
from cli_harness import QLACTORS, UNKNOWN_RUN, assert_refused, clean_env, in_parallel, ok, ok_json


def ql_bytes(home: Path, *args: str | bytes) -> subprocess.CompletedProcess:
    """`qlactors --home H ARGS` with argv items that may be any bytes; output decoded leniently."""
    result = subprocess.run([*QLACTORS, "--home", str(home), *args], capture_output=True, timeout=60,
                            env=clean_env())
    result.stdout = result.stdout.decode("utf-8", "replace")
    result.stderr = result.stderr.decode("utf-8", "replace")
    return result


def _nothing_but_the_existing_task(home: Path) -> None:
    tasks, runs = in_parallel([(("task", "list", "--json"), {"home": home}),
                               (("runs", "--json"), {"home": home})])
    [task] = json.loads(tasks.stdout)
    assert task["name"] == "existing" and task["revision"] == 1, task
    assert task["timeout_ms"] is None and task["env"] == {} and task["cwd"] is None, task
    assert json.loads(runs.stdout) == []


@pytest.fixture
def existing(tmp_path) -> Path:
    home = tmp_path / "home"
    ok("task", "add", "existing", "--", "true", home=home)
    return home


# --- numbers -------------------------------------------------------------------------------------


def test_numbers_outside_the_strict_grammar_are_refused_with_one_line_and_nothing_written(existing):
    home = existing
    add = ("task", "add", "n1")
    cases = [
        # a timeout under a millisecond used to be stored as "no timeout"
        ((*add, "--timeout", "0.0001", "--", "true"), "finer than a millisecond"),
        ((*add, "--timeout", "0.0015", "--", "true"), "finer than a millisecond"),
        ((*add, "--stop-grace", "1.2345", "--", "true"), "finer than a millisecond"),
        # float() accepts all of these; a user does not mean any of them
        ((*add, "--timeout", "1_000", "--", "true"), "'1_000' is not a number of seconds"),
        ((*add, "--timeout", " 5 ", "--", "true"), "' 5 ' is not a number of seconds"),
        ((*add, "--timeout", "1e3", "--", "true"), "'1e3' is not a number of seconds"),
        ((*add, "--timeout", "nan", "--", "true"), "'nan' is not a number of seconds"),
        ((*add, "--timeout", "inf", "--", "true"), "'inf' is not a number of seconds"),
        ((*add, "--timeout", "+5", "--", "true"), "'+5' is not a number of seconds"),
        ((*add, "--timeout", ".5", "--", "true"), "'.5' is not a number of seconds"),
        ((*add, "--backoff", "1e1,60", "--", "true"), "'1e1' is not a number of seconds"),
        ((*add, "--keep-days", "1_0", "--", "true"), "'1_0' is not a number of days"),
        # int() accepts these
        ((*add, "--max-concurrent", "1_0", "--", "true"), "'1_0' is not a whole number"),
        ((*add, "--max-attempts", " 2", "--", "true"), "' 2' is not a whole number"),
        ((*add, "--cron", "* * * * *", "--misfire", "skip", "--grace", "3_0", "--", "true"),
         "'3_0' is not a whole number"),
        ((*add, "--keep-runs", "+5", "--", "true"), "'+5' is not a whole number"),
        (("task", "update", "existing", "--timeout", "0.0001"), "finer than a millisecond"),
        (("runs", "--limit", "1_0"), "'1_0' is not a whole number"),
        (("logs", UNKNOWN_RUN, "--attempt", "\u0663"), "is not a whole number"),  # ARABIC-INDIC 3
        (("audit", "receipts", "--shards", "0x4"), "'0x4' is not a whole number"),
    ]
    results = in_parallel([(argv, {"home": home}) for argv, _ in cases])
    for (argv, fragment), result in zip(cases, results):
        assert_refused(result, fragment)
    _nothing_but_the_existing_task(home)


def test_a_dashed_task_name_is_named_and_a_setting_that_is_no_whole_number_says_so(existing):
    """`task add -dash` names the name it refuses (argparse would take it for an option and say
    a name is missing); `slots = 2.5` in the config says it must be a whole number (issue 28)."""
    home = existing
    for args in (("task", "add", "-dash", "--", "true"), ("task", "show", "-x"), ("task", "rm", "-dash")):
        assert_refused(ql_bytes(home, *args), f"invalid task name {args[2]!r}")
    (home / "qlactors.toml").write_text("[runtime]\nslots = 2.5\n")
    try:
        assert_refused(ql_bytes(home, "status"), "slots = 2.5 must be a whole number in 1..256")
    finally:
        (home / "qlactors.toml").unlink()
    _nothing_but_the_existing_task(home)


def test_seconds_are_whole_milliseconds_and_zero_still_means_no_timeout(tmp_path):
    home = tmp_path / "home"
    ok("task", "add", "t1", "--timeout", "0.001", "--stop-grace", "2.5000", "--", "true", home=home)
    added = in_parallel([(("task", "add", "t0", "--timeout", "0", "--", "true"), {"home": home}),
                         (("task", "add", "t2", "--timeout", "31536000", "--backoff", "0.25,60",
                           "--", "true"), {"home": home})])
    assert [r.returncode for r in added] == [0, 0], added
    by_name = {t["name"]: t for t in ok_json("task", "list", home=home)}
    assert by_name["t1"]["timeout_ms"] == 1 and by_name["t1"]["stop_grace_ms"] == 2500
    assert by_name["t0"]["timeout_ms"] is None
    assert by_name["t2"]["timeout_ms"] == 31_536_000_000
    assert by_name["t2"]["retry"]["backoff_base_ms"] == 250


def test_an_env_name_given_twice_is_refused_on_add_and_on_update(existing):
    home = existing
    added, updated = in_parallel([
        (("task", "add", "n1", "--env", "A=1", "--env", "B=2", "--env", "A=3", "--", "true"), {"home": home}),
        (("task", "update", "existing", "--env", "X=", "--env", "X=again"), {"home": home}),
    ])
    assert_refused(added, "--env 'A' is given twice")
    assert_refused(updated, "--env 'X' is given twice")
    _nothing_but_the_existing_task(home)


# --- names and run ids that are not UTF-8 ----------------------------------------------------------

BAD_ID = b"01a22a70-\xff\xfe-7001"
BAD_NAME = b"caf\xe9"  # Latin-1, not UTF-8

NOT_UTF8 = [
    (("show", BAD_ID), "argument run_id"),
    (("show", BAD_ID, "--json"), "argument run_id"),
    (("logs", BAD_ID), "argument run_id"),
    (("logs", BAD_ID, "-f"), "argument run_id"),
    (("cancel", BAD_ID), "argument run_id"),
    (("retry", BAD_ID), "argument run_id"),
    (("run", BAD_NAME), "argument name"),
    (("run", BAD_NAME, "--wait"), "argument name"),
    (("runs", "--task", BAD_NAME), "argument --task"),
    (("task", "show", BAD_NAME), "argument name"),
    (("task", "rm", BAD_NAME), "argument name"),
    (("task", "update", BAD_NAME, "--timeout", "1"), "argument name"),
]


def _refuse_every_non_utf8_argument(home: Path) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda argv: ql_bytes(home, *argv), [argv for argv, _ in NOT_UTF8]))
    for (argv, fragment), result in zip(NOT_UTF8, results):
        assert_refused(result, fragment)
        assert "is not valid UTF-8" in result.stderr, result.stderr


def test_a_run_id_or_task_name_that_is_not_utf8_exits_2_with_one_line_runtime_down(existing):
    _refuse_every_non_utf8_argument(existing)
    _nothing_but_the_existing_task(existing)


def test_a_run_id_or_task_name_that_is_not_utf8_exits_2_with_one_line_runtime_up(tmp_path):
    home = Home(tmp_path)
    try:
        home.main("task", "add", "existing", "--", "true")
        home.start_edge()
        _refuse_every_non_utf8_argument(home.path)
        assert home.edges[0].proc.poll() is None, home.edge_logs()  # the runtime is not disturbed
        _nothing_but_the_existing_task(home.path)
    finally:
        home.close()


# --- --cwd ---------------------------------------------------------------------------------------


def test_a_cwd_that_does_not_exist_or_is_not_a_directory_is_refused_by_add_and_update(existing, tmp_path):
    home = existing
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    missing = tmp_path / "missing" / "dir"
    cases = [
        (("task", "add", "n1", "--cwd", missing, "--", "true"), f"--cwd {missing}: no such directory"),
        (("task", "add", "n1", "--cwd", a_file, "--", "true"), f"--cwd {a_file}: not a directory"),
        (("task", "add", "n1", "--cwd", a_file / "below", "--", "true"), "no such directory"),
        (("task", "update", "existing", "--cwd", missing), f"--cwd {missing}: no such directory"),
        (("task", "update", "existing", "--cwd", a_file), "not a directory"),
    ]
    results = in_parallel([(argv, {"home": home}) for argv, _ in cases])
    for (argv, fragment), result in zip(cases, results):
        assert_refused(result, fragment)
    _nothing_but_the_existing_task(home)

    ok("task", "update", "existing", "--cwd", tmp_path, home=home)  # a directory is fine
    assert ok_json("task", "show", "existing", home=home)["cwd"] == str(tmp_path)


# --- a reader that goes away --------------------------------------------------------------------


@pytest.mark.parametrize("args", [("task", "list"), ("task", "show", "existing", "--json")])
def test_output_into_a_closed_pipe_ends_quietly_with_status_0(existing, args):
    """`qlactors task list | head -1`: the reader going away is no failure and gets no message."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)  # every write now fails with EPIPE
    try:
        result = subprocess.run([*QLACTORS, "--home", str(existing), *args], stdout=write_end,
                                stderr=subprocess.PIPE, timeout=60, env=clean_env())
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (0, b"")
