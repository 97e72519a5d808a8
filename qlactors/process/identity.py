"""Durable process identity (boot id, pid, process group, start ticks) read from /proc, and liveness.

A pid alone is not an identity: it is recycled. A process is the one we launched only while the
boot id, its start time in clock ticks and its process group all still match (SEMANTICS.md §4
step 5, §6 step 3). Parsing is pure (text in, value out); reading /proc is kept in thin wrappers.
Liveness is judged from /proc only, never from logs.
"""

from __future__ import annotations

import enum
import os
import re
from dataclasses import dataclass
from typing import Callable, Mapping

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
BOOT_ID_FILE_ENV = "QLACTORS_TEST_BOOT_ID_FILE"
MAX_MARKER_BYTES = 4096

# /proc/PID/stat fields are numbered from 1; everything after the comm's last ')' starts at
# field 3 (state). We need field 5 (pgrp) and field 22 (starttime).
_FIRST_FIELD_AFTER_COMM = 3
_PGRP_FIELD = 5
_STARTTIME_FIELD = 22

_UINT = re.compile(r"[0-9]{1,20}")
_STATE = re.compile(r"[A-Za-z]")
# What /proc/sys/kernel/random/boot_id holds: a UUID. Strict enough to refuse a torn or
# foreign marker, loose about case.
_BOOT_ID = re.compile(r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}")
_MARKER_KEYS = ("pid", "pgid", "start_ticks", "boot_id")
# Written by the job's own process just before it execs the job (launcher.sh): its pid, which is
# also its process group once `setsid` has run, and its start ticks. Both or neither.
_JOB_KEYS = ("job_pid", "job_start_ticks")


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """Who a launched process is, durably: the same values only ever name one process."""

    boot_id: str
    """The kernel's boot id; a different one means every process of ours is gone."""
    pid: int
    """The process's pid (the launcher's: also its process group and session leader)."""
    pgid: int
    """Its process group (the launcher's own; a job's group is the job's pid)."""
    start_ticks: int
    """Start time after boot in clock ticks (/proc/PID/stat field 22); tells a recycled pid apart."""


class Liveness(enum.Enum):
    """What /proc says about an identity."""

    RUNNING = "running"
    NOT_RUNNING = "not_running"
    UNKNOWN = "unknown"


def _uint(text: str, what: str) -> int:
    """A plain decimal integer; Python's int() would also take '+1', ' 1' and '1_0'."""
    if _UINT.fullmatch(text) is None:
        raise ValueError(f"{what} is not a non-negative decimal integer: {text[:40]!r}")
    return int(text)


def parse_stat(text: str) -> tuple[str, int, int]:
    """(state, pgid, start_ticks) from the text of /proc/PID/stat.

    Fields are counted after the last ')' because the command name between the parens may hold
    spaces and parens of its own.
    """
    head, paren, tail = text.rpartition(")")
    if not paren or "(" not in head:
        raise ValueError("not a /proc/PID/stat line: no '(comm)'")
    fields = tail.split()
    needed = _STARTTIME_FIELD - _FIRST_FIELD_AFTER_COMM + 1
    if len(fields) < needed:
        raise ValueError(f"/proc/PID/stat has {len(fields)} fields after the comm, need {needed}")
    state = fields[0]
    if _STATE.fullmatch(state) is None:
        raise ValueError(f"/proc/PID/stat state is not one letter: {state[:10]!r}")
    pgid = _uint(fields[_PGRP_FIELD - _FIRST_FIELD_AFTER_COMM], "pgrp")
    start_ticks = _uint(fields[_STARTTIME_FIELD - _FIRST_FIELD_AFTER_COMM], "starttime")
    return state, pgid, start_ticks


def _marker_values(text: str) -> dict[str, str]:
    """The key=value pairs of a start marker, strictly (see parse_marker)."""
    line = text[:-1] if text.endswith("\n") else text
    values: dict[str, str] = {}
    for token in line.split(" "):
        key, eq, value = token.partition("=")
        if not eq or not value:
            raise ValueError(f"start marker token is not key=value: {token[:40]!r}")
        if key not in _MARKER_KEYS and key not in _JOB_KEYS:
            raise ValueError(f"start marker has an unknown key {key[:40]!r}")
        if key in values:
            raise ValueError(f"start marker repeats the key {key!r}")
        values[key] = value
    missing = [k for k in _MARKER_KEYS if k not in values]
    if missing:
        raise ValueError(f"start marker lacks {missing}")
    if sum(k in values for k in _JOB_KEYS) == 1:
        raise ValueError(f"start marker has one of {list(_JOB_KEYS)} without the other")
    if _BOOT_ID.fullmatch(values["boot_id"]) is None:
        raise ValueError("start marker boot_id is not a UUID")
    return values


def parse_marker(text: str) -> ProcessIdentity:
    """The launcher's identity in its start marker: `pid=N pgid=N start_ticks=N boot_id=UUID`,
    optionally followed by the job's `job_pid=N job_start_ticks=N`.

    Strict: those keys, once each, single spaces, at most one trailing newline; anything else
    is a torn or foreign file and raises ValueError.
    """
    values = _marker_values(text)
    pid = _uint(values["pid"], "marker pid")
    pgid = _uint(values["pgid"], "marker pgid")
    if pid <= 0 or pgid <= 0:
        raise ValueError("start marker pid and pgid must be positive")
    return ProcessIdentity(boot_id=values["boot_id"], pid=pid, pgid=pgid,
                           start_ticks=_uint(values["start_ticks"], "marker start_ticks"))


def parse_job_marker(text: str) -> ProcessIdentity | None:
    """The job's identity in a start marker (its pid is its process group), None if it has none."""
    values = _marker_values(text)
    if "job_pid" not in values:
        return None
    pid = _uint(values["job_pid"], "marker job_pid")
    if pid <= 0:
        raise ValueError("start marker job_pid must be positive")
    return ProcessIdentity(boot_id=values["boot_id"], pid=pid, pgid=pid,
                           start_ticks=_uint(values["job_start_ticks"], "marker job_start_ticks"))


def boot_id_source(environ: Mapping[str, str] = os.environ) -> Callable[[], str]:
    """How the runtime reads the current boot id: /proc, or `QLACTORS_TEST_BOOT_ID_FILE` when set
    (a test shows the runtime a "reboot" by rewriting that file, without rebooting)."""
    override = environ.get(BOOT_ID_FILE_ENV)
    if not override:
        return read_boot_id
    return lambda: read_boot_id(override)


def read_boot_id(path: str = BOOT_ID_PATH) -> str:
    """The current boot id (a UUID string, without its newline)."""
    with open(path, encoding="ascii") as f:
        boot_id = f.read().strip()
    if not boot_id:
        raise ValueError(f"{path} is empty")
    return boot_id


def _read_stat(pid: int, proc: str) -> str:
    # Bytes, decoded leniently: a comm may hold any byte, and only the fields after it matter.
    with open(f"{proc}/{pid}/stat", "rb") as f:
        return f.read().decode("utf-8", errors="replace")


def read_identity(pid: int, *, boot_id: str | None = None, proc: str = "/proc") -> ProcessIdentity:
    """The identity of a live or zombie process (a zombie's stat stays readable until reaped).

    Raises FileNotFoundError (or ProcessLookupError) when the pid is gone, ValueError on an
    unparseable stat.
    """
    if boot_id is None:
        boot_id = read_boot_id(f"{proc}/sys/kernel/random/boot_id")
    _state, pgid, start_ticks = parse_stat(_read_stat(pid, proc))
    return ProcessIdentity(boot_id=boot_id, pid=pid, pgid=pgid, start_ticks=start_ticks)


def _read_marker_text(path: str | os.PathLike[str]) -> str | None:
    """A start marker's text, None when there is none yet; ValueError when it is too big.

    The launcher writes its marker in place with one short write, so a reader can catch it
    empty or cut short: a file that does not end in a newline is not published yet (None).
    """
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_MARKER_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(data) > MAX_MARKER_BYTES:
        raise ValueError(f"start marker {os.fspath(path)!r} is over {MAX_MARKER_BYTES} bytes")
    if not data.endswith(b"\n"):
        return None  # empty, or caught mid-write
    return data.decode("ascii")  # UnicodeDecodeError is a ValueError


def read_markers(path: str | os.PathLike[str]) -> tuple[ProcessIdentity | None, ProcessIdentity | None]:
    """The launcher's and the job's identities from one read of a start marker file: (None,
    None) when there is none yet, a None job when it names none; ValueError when it is bad (a
    complete line that does not parse)."""
    text = _read_marker_text(path)
    return (None, None) if text is None else (parse_marker(text), parse_job_marker(text))


def read_marker(path: str | os.PathLike[str]) -> ProcessIdentity | None:
    """The launcher's identity in a start marker file (see read_markers)."""
    return read_markers(path)[0]


def read_job_marker(path: str | os.PathLike[str]) -> ProcessIdentity | None:
    """The job's identity (pid = process group) in a start marker file (see read_markers)."""
    return read_markers(path)[1]


def probe(identity: ProcessIdentity, *, current_boot_id: str, proc: str = "/proc") -> Liveness:
    """Whether the process named by `identity` still runs, from /proc alone.

    NOT_RUNNING is conclusive: another boot, no /proc entry, a recycled pid (start ticks or
    group differ) or a zombie. Evidence we cannot read (permissions, a garbled stat) is
    UNKNOWN, never a guess either way.
    """
    if identity.boot_id != current_boot_id:
        return Liveness.NOT_RUNNING
    try:
        text = _read_stat(identity.pid, proc)
    except (FileNotFoundError, ProcessLookupError):
        return Liveness.NOT_RUNNING
    except OSError:
        return Liveness.UNKNOWN
    try:
        state, pgid, start_ticks = parse_stat(text)
    except ValueError:
        return Liveness.UNKNOWN
    if start_ticks != identity.start_ticks or pgid != identity.pgid:
        return Liveness.NOT_RUNNING
    if state in ("Z", "X", "x"):  # zombie, or dead and about to vanish
        return Liveness.NOT_RUNNING
    return Liveness.RUNNING
