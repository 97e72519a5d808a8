"""Configuration: the knob table every profile shares (`knobs.py`), the edge and standalone home
(`home.py`) and the cluster profiles, control replica and worker (`cluster.py`); this package
re-exports what callers use."""

from __future__ import annotations

from .cluster import (CLUSTER_PROFILES, ControlConfig, DatabaseSettings, WorkerConfig, cluster_database_url,
                      defaults_of, file_profile, load_config)
from .home import CONFIG_FILE, DATABASE_FILE, Config, ensure_home, load, resolve_home
from .knobs import DEFAULT_LAUNCHER_SHELL, DEFAULTS, LIMITS, PROFILES, RuntimeSettings

__all__ = ["CLUSTER_PROFILES", "CONFIG_FILE", "DATABASE_FILE", "DEFAULT_LAUNCHER_SHELL", "DEFAULTS", "LIMITS",
           "PROFILES", "Config", "ControlConfig", "DatabaseSettings", "RuntimeSettings", "WorkerConfig",
           "cluster_database_url", "defaults_of", "ensure_home", "file_profile", "load", "load_config",
           "resolve_home"]
