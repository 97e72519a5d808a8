"""The edge and standalone profiles: where qlactors keeps its data (the home), and the optional TOML
file that sets their knobs (knobs.py: the table)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from ..errors import BadInput
from .knobs import (DEFAULT_LAUNCHER_SHELL, DEFAULTS, PROFILES, RUNTIME_KNOBS, RuntimeSettings, check_int,
                    check_shell, read_toml)

DATABASE_FILE = "qlactors.db"
CONFIG_FILE = "qlactors.toml"


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
        data = read_toml(path)
    unknown = set(data) - {"profile", "database", "runtime", "launcher", "web"}  # [web]: config/web.py
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
    check_shell(shell, path)
    return Config(home=home, profile=chosen, database_url=str(url), runtime=runtime, launcher_shell=shell)


def ensure_home(config: Config) -> None:
    """Create the home directory (0700: logs and receipts are the user's business only)."""
    try:
        config.home.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        raise BadInput(f"cannot create home directory {config.home}: {err.strerror}; "
                       "pass --home or set QLACTORS_HOME to a writable place") from err
    if not config.home.is_dir():
        raise BadInput(f"home {config.home} is not a directory; pass --home elsewhere")


def _table(data: Mapping[str, Any], key: str, path: Path) -> dict[str, Any]:
    table = data.get(key, {})
    if not isinstance(table, dict):
        raise BadInput(f"{path}: [{key}] must be a table")
    return dict(table)


def _runtime(base: RuntimeSettings, overrides: dict[str, Any], path: Path) -> RuntimeSettings:
    unknown = set(overrides) - set(RUNTIME_KNOBS)
    if unknown:
        raise BadInput(f"{path}: unknown [runtime] key(s) {sorted(unknown)}; known: {sorted(RUNTIME_KNOBS)}")
    for key, value in overrides.items():
        check_int(RUNTIME_KNOBS[key], value, f"{path}: [runtime] {key}")
    return replace(base, **overrides)
