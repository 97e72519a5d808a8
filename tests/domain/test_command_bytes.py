"""A command is POSIX bytes: whatever `task add` accepts reaches the job byte for byte, or is refused.

Issue 9 §1: the representation (qlactors.domain.posix) in the domain, both databases, `--json`
output and the real process; the task-add limits that agree with the wire.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from qlactors.domain import posix
from qlactors.domain.model import (
    MAX_CWD_BYTES,
    MAX_WORD_BYTES,
    Command,
    TaskSpec,
    TaskSpecError,
    env_from_json,
    env_to_json,
)
from qlactors.store.schema import task_revisions
from qlactors.wire import codec
from qlactors.wire.offers import check_revision_fits
from store_helpers import new_hash, spec

_EXE = Path(sys.executable).parent / "qlactors"
QLACTORS = [str(_EXE)] if _EXE.exists() else [sys.executable, "-m", "qlactors"]

FF_FE = "\udcff\udcfe"  # the bytes ff fe as os.fsdecode holds them


# --- the representation --------------------------------------------------------------------------

@pytest.mark.parametrize("data", [b"", b"plain", "é".encode(), b"\xff\xfe", b"a\x80b\xc3", b"\xed\xa0\x80"])
def test_every_byte_string_round_trips_through_str_json_and_column(data):
    text = posix.posix_text(data)
    assert posix.posix_bytes(text) == data
    assert posix.from_json(json.loads(json.dumps(posix.to_json(text)))) == text
    path = posix.posix_text(b"/" + data)
    assert posix.from_column(posix.to_column(path)) == path


def test_valid_utf8_stays_text_and_other_bytes_become_base64():
    assert posix.to_json("héllo") == "héllo"
    assert posix.to_json(FF_FE) == {"base64": base64.b64encode(b"\xff\xfe").decode()}
    assert posix.to_column("/tmp/é") == "/tmp/é"
    assert posix.to_column("/tmp/" + FF_FE) == "base64:" + base64.b64encode(b"/tmp/\xff\xfe").decode()
    # Escaped bytes that form UTF-8 are written as that text: one spelling for one byte string.
    assert posix.to_json("\udcc3\udca9") == "é"
    assert posix.display("a" + FF_FE) == "a\\xff\\xfe"


@pytest.mark.parametrize("value", [1, None, ["x"], {"base64": "!!"}, {"base64": 1}, {"b64": "AA=="},
                                   {"base64": "AA==", "x": 1}, "\ud800"])
def test_json_values_not_written_by_to_json_are_refused(value):
    with pytest.raises(posix.PosixTextError):
        posix.from_json(value)


@pytest.mark.parametrize("value", ["relative", "", "base64:!!", "\ud800"])
def test_column_values_not_written_by_to_column_are_refused(value):
    with pytest.raises(posix.PosixTextError):
        posix.from_column(value)


def test_command_and_env_json_forms_round_trip():
    for command in (Command(shell="echo " + FF_FE), Command(argv=("printf", FF_FE, "é"))):
        assert Command.from_json(json.loads(json.dumps(command.to_json()))) == command
    env = {"B": FF_FE, "A": "1"}
    assert env_to_json(env) == {"A": "1", "B": {"base64": "//4="}}
    assert env_from_json(env_to_json(env)) == env
    with pytest.raises(ValueError):
        Command.from_json({"argv": "echo"})
    with pytest.raises(ValueError):
        env_from_json(["A=1"])


# --- limits, in bytes, agreeing with the wire ----------------------------------------------------

def test_the_word_limit_is_the_wires_string_limit():
    assert MAX_WORD_BYTES == codec.MAX_STR_BYTES


def _refused(fragment: str, **kw) -> None:
    with pytest.raises(TaskSpecError) as info:
        TaskSpec(name="t", **kw).validated()
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_a_shell_string_or_argv_item_over_the_wire_string_limit_is_refused():
    _refused("shell string is over the 65536-byte limit",
             command=Command(shell="echo " + "a" * MAX_WORD_BYTES))
    _refused("argv item 1 is over the 65536-byte limit",
             command=Command(argv=("echo", "\udcff" * (MAX_WORD_BYTES + 1))))
    TaskSpec(name="t", command=Command(shell="echo " + "a" * (MAX_WORD_BYTES - 5))).validated()


def test_cwd_and_env_values_are_limited_in_bytes_and_must_stand_for_bytes():
    _refused("--cwd is over the 4096-byte path limit", command=Command(argv=("true",)),
             cwd="/" + "\udcff" * MAX_CWD_BYTES)
    _refused("--cwd contains a NUL byte", command=Command(argv=("true",)), cwd="/a\0b")
    _refused("--env K: value has a NUL byte or is over the 65536-byte limit",
             command=Command(argv=("true",)), env={"K": "é" * (MAX_WORD_BYTES // 2 + 1)})
    _refused("argv item 0 holds a lone surrogate", command=Command(argv=("\ud800",)))
    _refused("--env K holds a lone surrogate", command=Command(argv=("true",)), env={"K": "\ud800"})


def test_a_revision_whose_offer_cannot_fit_one_frame_is_refused():
    env = {f"K{i}": "b" * 60_000 for i in range(20)}
    big = TaskSpec(name="t", command=Command(argv=("true",)), env=env).validated()
    with pytest.raises(TaskSpecError, match="do not fit one 262144-byte wire message"):
        check_revision_fits(big)
    # Just under the frame with the longest ids: it fits, whatever ids the offer gets.
    check_revision_fits(TaskSpec(name="t", command=Command(argv=("true",)),
                                 env={f"K{i}": "b" * 60_000 for i in range(4)}).validated())


# --- both databases ----------------------------------------------------------------------------

def test_non_utf8_command_env_and_cwd_round_trip_on_both_databases(repo, dispatch):
    cwd = "/tmp/dir" + FF_FE
    added = repo.tasks.add(spec(command=Command(argv=("printf", FF_FE, "é")), cwd=cwd,
                                env={"K": "x" + FF_FE, "P": "plain"}), actor_name="tester")
    assert repo.tasks.get("job").spec == added.spec
    with repo.store.read() as conn:
        row = conn.execute(task_revisions.select()).one()
    assert json.loads(row.command_json) == {"argv": ["printf", {"base64": "//4="}, "é"]}
    assert json.loads(row.env_json) == {"K": {"base64": "eP/+"}, "P": "plain"}
    assert row.cwd == "base64:" + base64.b64encode(b"/tmp/dir\xff\xfe").decode()
    updated = repo.tasks.update("job", command=Command(shell="echo " + FF_FE), actor_name="tester")
    assert repo.tasks.get("job").spec == updated.spec and updated.revision == 2
    assert updated.to_json()["command"] == {"shell": {"base64": base64.b64encode(b"echo \xff\xfe").decode()}}
    assert updated.to_json()["cwd"] == {"base64": base64.b64encode(b"/tmp/dir\xff\xfe").decode()}
    repo.runs.request("job")
    session = dispatch.sessions.register("edge", 1)
    offer = dispatch.offers.one("edge", session.session_id, 1, "o-1", new_hash(), log_cap_bytes=0)
    assert offer.argv == ("/bin/sh", "-c", "echo " + FF_FE)
    assert (offer.cwd, dict(offer.env)) == (cwd, {"K": "x" + FF_FE, "P": "plain"})


# --- the command line --------------------------------------------------------------------------

def _ql(home: Path, *args: str | bytes) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("QLACTORS_HOME", "XDG_DATA_HOME")}
    return subprocess.run([*QLACTORS, "--home", str(home), *args], capture_output=True, timeout=60,
                          env=env, stdin=subprocess.DEVNULL)


def _gather(*calls):
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda call: call(), calls))


def test_task_add_takes_non_utf8_bytes_and_json_prints_them_as_base64_and_reveal_as_bytes(tmp_path):
    home = tmp_path / "h"
    added = _ql(home, "task", "add", "nu1", "--env", b"K=\xff", "--", b"echo \xff\xfe bad")
    assert added.returncode == 0, added.stderr
    shown, listed = _gather(lambda: _ql(home, "task", "show", "nu1", "--json"),
                            lambda: _ql(home, "task", "list", "--json"))
    assert json.loads(shown.stdout)["command"] == {"shell": {"base64": base64.b64encode(b"echo \xff\xfe bad").decode()}}
    assert json.loads(shown.stdout)["env"] == {"K": {"set": True, "bytes": 1}}  # values are never read back
    revealed = _ql(home, "task", "show", "nu1", "--reveal", "K", "--force")
    assert (revealed.returncode, revealed.stdout) == (0, b"\xff\n")
    assert json.loads(listed.stdout)[0]["command"] == json.loads(shown.stdout)["command"]
    text = _ql(home, "task", "show", "nu1")
    assert text.returncode == 0 and b"echo \\xff\\xfe bad" in text.stdout


def test_task_add_and_update_refuse_what_the_wire_cannot_carry(tmp_path):
    home = tmp_path / "h"
    assert _ql(home, "task", "add", "small", "--", "true").returncode == 0
    envs = [a for i in range(20) for a in ("--env", f"K{i}={'b' * 60_000}")]
    long_shell, big_env, big_update = _gather(
        lambda: _ql(home, "task", "add", "long", "--", "echo " + "a" * (64 * 1024)),
        lambda: _ql(home, "task", "add", "wide", *envs, "--", "true"),
        lambda: _ql(home, "task", "update", "small", *envs))
    for result, fragment in ((long_shell, b"over the 65536-byte limit for one command word"),
                             (big_env, b"do not fit one 262144-byte wire message"),
                             (big_update, b"do not fit one 262144-byte wire message")):
        assert result.returncode == 2, result.stderr
        assert fragment in result.stderr and result.stderr.count(b"\n") == 1, result.stderr
    listed = json.loads(_ql(home, "task", "list", "--json").stdout)
    assert [(t["name"], t["revision"], t["env"]) for t in listed] == [("small", 1, {})]


# --- the process -------------------------------------------------------------------------------

def test_the_job_gets_exactly_the_bytes_it_was_given(home):
    """Argv items, an env value, the cwd and a shell string that are not UTF-8, end to end."""
    odd_dir = os.fsencode(home.path) + b"/dir-\xfe\xff"
    os.makedirs(odd_dir)
    report = 'pwd | od -An -tx1; printf %s "$K" | od -An -tx1; printf %s "$1" | od -An -tx1'
    added = [_ql(home.path, "task", "add", "argv", "--cwd", odd_dir, "--env", b"K=a\xffb", "--",
                 "sh", "-c", report, "sh", b"x\xfey"),
             _ql(home.path, "task", "add", "shell", "--", b"printf %s \xff\xfe | od -An -tx1")]
    assert all(r.returncode == 0 for r in added), [r.stderr for r in added]
    home.start_edge()
    runs = [home.run("argv"), home.run("shell")]
    for run_id in runs:
        assert home.wait_terminal(run_id) == "succeeded", home.edge_logs()

    def od_bytes(run_id: str) -> bytes:  # what `od -An -tx1` printed, back as bytes
        return bytes.fromhex("".join(home.logs(run_id).decode("ascii").split()))
    assert od_bytes(runs[0]) == odd_dir + b"\n" + b"a\xffb" + b"x\xfey"
    assert od_bytes(runs[1]) == b"\xff\xfe"
