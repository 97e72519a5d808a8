"""The knob table: every setting a profile shares, written once — its name, type, default, range and
meaning — and the one check a value read from a file passes.

`RuntimeSettings` is the table of the knobs every profile has (SEMANTICS.md §11): the field's
default is the standalone (and cluster) one, `edge=` the edge profile's where it differs. The
cluster classes (cluster.py) take a shared knob with `shared(name)`, so `slots` has one range and
one name in `[runtime]`, `[worker]` and `[control]`; their own knobs are declared with `knob(...)`
in the same form. Times are in milliseconds, sizes in bytes.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..domain.model import MAX_STOP_GRACE_MS
from ..domain.retention import KEEP_AGE_MS_RANGE, KEEP_RUNS_RANGE, REVOKED_TOKENS_MS, TASK_EVENTS_KEPT
from ..errors import BadInput

MIB = 1024 * 1024
HOUR_MS, DAY_MS = 3_600_000, 86_400_000
DEFAULT_LAUNCHER_SHELL = "/bin/sh"


@dataclass(frozen=True, slots=True)
class Knob:
    """How a setting is read: its kind, the range of an int, what it is for, the edge default
    when it differs, and the `[section] key` it is written under when not the class's own."""

    kind: str = "int"
    low: int | None = None
    high: int | None = None
    doc: str = ""
    edge: Any = None
    section: str | None = None
    key: str | None = None


def knob(default: Any, low: int | None = None, high: int | None = None, *, doc: str, kind: str = "int",
         edge: Any = None, section: str | None = None, key: str | None = None) -> Any:
    """A dataclass field that is a knob (its Knob in `metadata["knob"]`)."""
    meta = {"knob": Knob(kind, low, high, doc, edge, section, key)}
    return field(default=tuple(default) if isinstance(default, (list, tuple)) else default, metadata=meta)


def knob_of(f: dataclasses.Field) -> Knob | None:
    return f.metadata.get("knob")


def check_int(k: Knob, value: Any, where: str) -> int:
    """The one range check: a whole number (never a bool) in k.low..k.high."""
    if type(value) is not int:
        raise BadInput(f"{where} = {value!r} must be a whole number in {k.low}..{k.high}")
    if not k.low <= value <= k.high:
        raise BadInput(f"{where} = {value!r} is out of range {k.low}..{k.high}")
    return value


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    """Every knob of SEMANTICS.md §11 the actors take, for one profile."""

    slots: int = knob(4, 1, 256, edge=1, doc="jobs that may run at once on this host")
    cadence_tick_ms: int = knob(1_000, 100, 3_600_000, edge=5_000,
                                doc="scheduler cycle when nothing is due (nudges and due fires wake it sooner)")
    idle_tick_ms: int = knob(5_000, 100, 3_600_000, edge=30_000,
                             doc="tick when nothing is in flight, queued, lost or unresolved")
    recovery_page: int = knob(16, 1, 64, edge=4, doc="attempts examined by recovery per cycle")
    retry_page: int = knob(16, 1, 64, edge=2, doc="lost runs resolved per cycle")
    cron_page: int = knob(16, 1, 256, edge=4, doc="due schedules admitted per cycle")
    receipt_cleanup_interval_ms: int = knob(60_000, 1_000, DAY_MS, edge=300_000,
                                            doc="how often journal-driven receipt cleanup runs")
    receipt_cleanup_page: int = knob(32, 1, 64, edge=8, doc="receipts cleaned per pass")
    quarantine_retention_ms: int = knob(HOUR_MS, 0, DAY_MS, edge=300_000,
                                        doc="how long a quarantined receipt is kept")
    log_cap_bytes: int = knob(64 * MIB, 64 * 1024, 1 << 30, edge=4 * MIB,
                              doc="bytes of output kept per attempt; the rest is counted, not stored")
    stop_grace_ms: int = knob(1_000, 0, MAX_STOP_GRACE_MS, doc="default wait between TERM and KILL")
    kill_grace_ms: int = knob(1_000, 0, 30_000, doc="wait after KILL before judging the stop")
    shutdown_drain_ms: int = knob(10_000, 100, 60_000, edge=5_000, doc="budget for stopping actors on shutdown")
    publish_grace_ms: int = knob(100, 0, 5_000, edge=50, doc="wait for a late receipt before judging a process lost")
    retention_max_age_ms: int = knob(30 * DAY_MS, *KEEP_AGE_MS_RANGE, edge=7 * DAY_MS,
                                     doc="finished runs (with their events and logs) are kept this long at most")
    retention_max_runs: int = knob(1_000, *KEEP_RUNS_RANGE, edge=100,
                                   doc="and at most this many per task, newest kept")
    retention_page: int = knob(64, 1, 256, edge=16, doc="finished runs retired per cycle")
    retention_revoked_tokens_ms: int = knob(REVOKED_TOKENS_MS, *KEEP_AGE_MS_RANGE,
                                            doc="a revoked API token's row is kept this long after its revocation")
    retention_task_events: int = knob(TASK_EVENTS_KEPT, *KEEP_RUNS_RANGE, edge=100,
                                      doc="history entries kept per task, newest kept")
    disk_reserve_bytes: int = knob(256 * MIB, 0, 1 << 40, edge=32 * MIB,
                                   doc="free bytes kept on the logs file system: below it no attempt starts")
    output_drain_ms: int = knob(1_000, 0, 60_000,
                                doc="how long a launcher waits for its log reader after the job ended")
    store_outage_stop_ms: int = knob(60_000, 1_000, DAY_MS,
                                     doc="how long the database may keep failing before the runtime stops")


_RUNTIME_FIELDS = {f.name: f for f in fields(RuntimeSettings)}
RUNTIME_KNOBS: dict[str, Knob] = {name: f.metadata["knob"] for name, f in _RUNTIME_FIELDS.items()}

PROFILES = ("edge", "standalone")
DEFAULTS: dict[str, RuntimeSettings] = {
    "standalone": RuntimeSettings(),
    "edge": RuntimeSettings(**{name: k.edge for name, k in RUNTIME_KNOBS.items() if k.edge is not None}),
}
# The bounds a config file may not leave (pages: SEMANTICS.md §10 hard max 64).
LIMITS: dict[str, tuple[int, int]] = {name: (k.low, k.high) for name, k in RUNTIME_KNOBS.items()}


def shared(name: str) -> Any:
    """A cluster class's field for the shared knob `name`: the same Knob (range, doc) and the
    standalone default, read from the class's own section."""
    f = _RUNTIME_FIELDS[name]
    return field(default=f.default, metadata=f.metadata)


def launcher_shell() -> Any:
    """`[launcher] shell`, the POSIX sh that runs the launcher (checked where it runs: check_shell)."""
    return knob(DEFAULT_LAUNCHER_SHELL, kind="shell", section="launcher", key="shell",
                doc="the POSIX sh that runs the launcher: dash, or busybox on a router (\"/bin/busybox sh\")")


def check_shell(shell: Any, path: Path) -> None:
    words = shell.split() if isinstance(shell, str) else []
    if not words or not words[0].startswith("/") or not os.access(words[0], os.X_OK):
        raise BadInput(f"{path}: [launcher] shell = {shell!r} must start with the absolute path of an "
                       "executable POSIX sh, e.g. \"/bin/sh\" or \"/bin/busybox sh\"")


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise BadInput(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as err:
        raise BadInput(f"config file {path} is not valid TOML: {err}") from None
