"""Where qlactors keeps its data, and the knobs of each profile (built-in defaults, optional TOML file)."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

from ..domain.retention import KEEP_AGE_MS_RANGE, KEEP_RUNS_RANGE
from ..errors import BadInput

DATABASE_FILE = "qlactors.db"
CONFIG_FILE = "qlactors.toml"
PROFILES = ("edge", "standalone")


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    """Every knob of SEMANTICS.md §11 for one profile; times in milliseconds, sizes in bytes."""

    slots: int
    cadence_tick_ms: int
    idle_tick_ms: int
    recovery_page: int
    retry_page: int
    cron_page: int
    receipt_cleanup_interval_ms: int
    receipt_cleanup_page: int
    quarantine_retention_ms: int
    log_cap_bytes: int
    stop_grace_ms: int
    kill_grace_ms: int
    shutdown_drain_ms: int
    publish_grace_ms: int
    retention_max_age_ms: int
    retention_max_runs: int
    retention_page: int
    disk_reserve_bytes: int
    output_drain_ms: int = 1_000  # how long a launcher waits for its log reader after the job ended
    store_outage_stop_ms: int = 60_000  # a database failing this long stops the runtime


DEFAULTS: dict[str, RuntimeSettings] = {
    "edge": RuntimeSettings(
        slots=1, cadence_tick_ms=5_000, idle_tick_ms=30_000, recovery_page=4, retry_page=2, cron_page=4,
        receipt_cleanup_interval_ms=300_000, receipt_cleanup_page=8,
        quarantine_retention_ms=300_000, log_cap_bytes=4 * 1024 * 1024,
        stop_grace_ms=1_000, kill_grace_ms=1_000, shutdown_drain_ms=5_000, publish_grace_ms=50,
        retention_max_age_ms=7 * 86_400_000, retention_max_runs=100, retention_page=16,
        disk_reserve_bytes=32 * 1024 * 1024),
    "standalone": RuntimeSettings(
        slots=4, cadence_tick_ms=1_000, idle_tick_ms=5_000, recovery_page=16, retry_page=16, cron_page=16,
        receipt_cleanup_interval_ms=60_000, receipt_cleanup_page=32,
        quarantine_retention_ms=3_600_000, log_cap_bytes=64 * 1024 * 1024,
        stop_grace_ms=1_000, kill_grace_ms=1_000, shutdown_drain_ms=10_000, publish_grace_ms=100,
        retention_max_age_ms=30 * 86_400_000, retention_max_runs=1_000, retention_page=64,
        disk_reserve_bytes=256 * 1024 * 1024),
}

# Hard upper bounds a config file may not exceed (pages: SEMANTICS.md §10 hard max 64).
LIMITS: dict[str, tuple[int, int]] = {
    "slots": (1, 256), "cadence_tick_ms": (100, 3_600_000), "idle_tick_ms": (100, 3_600_000),
    "recovery_page": (1, 64),
    "retry_page": (1, 64), "cron_page": (1, 256), "receipt_cleanup_interval_ms": (1_000, 86_400_000),
    "receipt_cleanup_page": (1, 64), "quarantine_retention_ms": (0, 86_400_000),
    "log_cap_bytes": (64 * 1024, 1 << 30), "stop_grace_ms": (0, 30_000), "kill_grace_ms": (0, 30_000),
    "shutdown_drain_ms": (100, 60_000), "publish_grace_ms": (0, 5_000),
    "retention_max_age_ms": KEEP_AGE_MS_RANGE, "retention_max_runs": KEEP_RUNS_RANGE,  # as per task
    "retention_page": (1, 256), "disk_reserve_bytes": (0, 1 << 40), "output_drain_ms": (0, 60_000),
    "store_outage_stop_ms": (1_000, 86_400_000),
}


DEFAULT_LAUNCHER_SHELL = "/bin/sh"


@dataclass(frozen=True, slots=True)
class Config:
    home: Path
    profile: str
    database_url: str
    runtime: RuntimeSettings
    launcher_shell: str = DEFAULT_LAUNCHER_SHELL  # the POSIX sh that runs the launcher

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    @property
    def receipts_dir(self) -> Path:
        return self.home / "receipts"


def resolve_home(arg: str | None, environ: Mapping[str, str] = os.environ) -> Path:
    """--home, else $QLACTORS_HOME, else $XDG_DATA_HOME/qlactors (~/.local/share/qlactors)."""
    if arg:
        return Path(arg).expanduser().absolute()
    if environ.get("QLACTORS_HOME"):
        return Path(environ["QLACTORS_HOME"]).expanduser().absolute()
    data = environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data).expanduser().absolute() / "qlactors"


def load(home_arg: str | None = None, config_path: str | None = None, *,
         profile: str | None = None, environ: Mapping[str, str] = os.environ) -> Config:
    """Built-in defaults, overlaid by the config file (--config, else `<home>/qlactors.toml` if present)."""
    home = resolve_home(home_arg, environ)
    data: dict[str, Any] = {}
    path = Path(config_path) if config_path else home / CONFIG_FILE
    if config_path or path.is_file():
        data = _read_toml(path)
    unknown = set(data) - {"profile", "database", "runtime", "launcher"}
    if unknown:
        raise BadInput(f"{path}: unknown section(s) {sorted(unknown)}; see configs/edge.toml for every knob")
    chosen = profile or data.get("profile") or "edge"
    if chosen not in PROFILES:
        raise BadInput(f"unknown profile {chosen!r}: use one of {', '.join(PROFILES)}")
    database = _table(data, "database", path)
    url = database.pop("url", None) or f"sqlite:///{home / DATABASE_FILE}"
    if database:
        raise BadInput(f"{path}: unknown [database] key(s) {sorted(database)}")
    runtime = _runtime(DEFAULTS[chosen], _table(data, "runtime", path), path)
    launcher = _table(data, "launcher", path)
    shell = launcher.pop("shell", DEFAULT_LAUNCHER_SHELL)
    if launcher:
        raise BadInput(f"{path}: unknown [launcher] key(s) {sorted(launcher)}")
    _check_shell(shell, path)
    return Config(home=home, profile=chosen, database_url=str(url), runtime=runtime, launcher_shell=shell)


def _check_shell(shell: Any, path: Path) -> None:
    words = shell.split() if isinstance(shell, str) else []
    if not words or not words[0].startswith("/") or not os.access(words[0], os.X_OK):
        raise BadInput(f"{path}: [launcher] shell = {shell!r} must start with the absolute path of an "
                       "executable POSIX sh, e.g. \"/bin/sh\" or \"/bin/busybox sh\"")


def ensure_home(config: Config) -> None:
    """Create the home directory (0700: logs and receipts are the user's business only)."""
    try:
        config.home.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        raise BadInput(f"cannot create home directory {config.home}: {err.strerror}; "
                       "pass --home or set QLACTORS_HOME to a writable place") from err
    if not config.home.is_dir():
        raise BadInput(f"home {config.home} is not a directory; pass --home elsewhere")


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise BadInput(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as err:
        raise BadInput(f"config file {path} is not valid TOML: {err}") from None


def _table(data: Mapping[str, Any], key: str, path: Path) -> dict[str, Any]:
    table = data.get(key, {})
    if not isinstance(table, dict):
        raise BadInput(f"{path}: [{key}] must be a table")
    return dict(table)


def _runtime(base: RuntimeSettings, overrides: dict[str, Any], path: Path) -> RuntimeSettings:
    known = {f.name for f in fields(RuntimeSettings)}
    unknown = set(overrides) - known
    if unknown:
        raise BadInput(f"{path}: unknown [runtime] key(s) {sorted(unknown)}; known: {sorted(known)}")
    for key, value in overrides.items():
        low, high = LIMITS[key]
        if type(value) is not int or not low <= value <= high:
            raise BadInput(f"{path}: [runtime] {key} = {value!r} is out of range {low}..{high}")
    return replace(base, **overrides)
