"""Where an intent command acts: the edge home (as always), or a cluster's PostgreSQL database,
named by `--config control.toml` (`[database] url`) or else `$QLACTORS_DATABASE_URL`."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..config import ControlConfig, DatabaseSettings, cluster_database_url, file_profile, load_config
from ..domain.retention import RetentionPolicy
from ..errors import BadInput, QlactorsError, SchemaError
from .common import say

DATABASE_URL_VARIABLE = "QLACTORS_DATABASE_URL"
# How long a command waits for a control replica that is migrating the database, or for the
# first one to create its schema (`qlactors control ... &` then a command at once, in a script).
MIGRATION_WAIT_S = 10.0
MIGRATION_POLL_S = 0.2


@dataclass(frozen=True, slots=True)
class ClusterTarget:
    database: DatabaseSettings
    control: ControlConfig | None  # None: the URL came from the environment (defaults elsewhere)
    source: str  # for messages: where the URL came from

    @property
    def settings(self) -> ControlConfig:
        """The control settings in force: the file's, or the built-in defaults."""
        return self.control or ControlConfig(path=Path(self.source), database=self.database)

    @property
    def retention(self) -> RetentionPolicy:
        cfg = self.settings
        return RetentionPolicy(max_age_ms=cfg.retention_max_age_ms, max_runs=cfg.retention_max_runs)

    def describe(self) -> str:
        """The database URL as given (password hidden, without the timeouts this adds)."""
        from sqlalchemy.engine import make_url

        return make_url(self.database.url).render_as_string(hide_password=True)

    def open(self):
        """The cluster database, opened without migrating it (each replica migrates at start,
        under an advisory lock): a schema other than this qlactors's is refused."""
        from ..store.engine import Store
        from ..store.migrations import latest_version
        from ..store.repository import Repository

        store = Store(self.database.url, **self.database.store_options(pool=False))
        try:
            known = latest_version(store.dialect_name)
            found, migrating = self._settled_version(store, known)
            if migrating:
                raise QlactorsError(
                    f"the cluster database {self.describe()} (from {self.source}) is still being migrated "
                    f"by a control replica after {MIGRATION_WAIT_S:g} s; nothing was written: try again")
            if found is None or found < known:
                raise BadInput(
                    f"the cluster database {self.describe()} (from {self.source}) has "
                    f"{'no qlactors schema' if found is None else f'schema version {found}'}, this "
                    f"qlactors needs {known}; nothing was written: start a control replica of this "
                    "version once (`qlactors control --config FILE`), it migrates the database")
            if found > known:
                raise SchemaError(f"the cluster database {self.describe()} has schema version {found}, "
                                  f"newer than this qlactors knows ({known}): upgrade qlactors here")
        except BaseException:
            store.close()
            raise
        return Repository(store)

    def _settled_version(self, store, known: int) -> tuple[int | None, bool]:
        """The schema version, once no replica is about to change it, and whether a replica
        still holds the migration lock when the wait ran out: while one holds it, or while the
        database has no schema yet, wait up to MIGRATION_WAIT_S for it (saying so on stderr
        once). An older schema no one migrates is final at once."""
        from ..store.migrations import current_version, migration_in_progress

        deadline = time.monotonic() + MIGRATION_WAIT_S
        said = False
        while True:
            found = current_version(store)
            if found is not None and found >= known:
                return found, False
            migrating = migration_in_progress(store)
            if (found is not None and not migrating) or time.monotonic() >= deadline:
                return found, migrating
            if not said:
                say(f"the cluster database {self.describe()} is being migrated by a control replica: "
                    f"waiting up to {MIGRATION_WAIT_S:g} s" if migrating else
                    f"the cluster database {self.describe()} has no qlactors schema yet: waiting up to "
                    f"{MIGRATION_WAIT_S:g} s for a control replica to create it")
                said = True
            time.sleep(MIGRATION_POLL_S)


def cluster_target(config_path: str | None,
                   environ: Mapping[str, str] = os.environ) -> ClusterTarget | None:
    """The cluster database to act on, or None for the edge home.

    `--config` decides when given: a control.toml is the cluster, a worker.toml is refused (it
    holds no database credentials), an edge or standalone file is the edge home. Without it,
    `$QLACTORS_DATABASE_URL` names the cluster database.
    """
    if config_path:
        profile = file_profile(config_path)
        if profile == "worker":
            raise BadInput(f"{config_path} is a worker config: a worker holds no database credentials, "
                           "so commands cannot act through it; give a control replica's config "
                           f"(--config control.toml) or set ${DATABASE_URL_VARIABLE}")
        if profile != "control":
            return None
        cfg = load_config(config_path)
        return ClusterTarget(cfg.database, cfg, f"--config {config_path}")
    given = environ.get(DATABASE_URL_VARIABLE)
    if not given:
        return None
    url = cluster_database_url(given)
    if url is None:
        raise BadInput(f"${DATABASE_URL_VARIABLE} = {given!r}: the cluster database is PostgreSQL: "
                       "postgresql://USER@HOST:5432/DB (unset it to use the edge home)")
    return ClusterTarget(DatabaseSettings(url=url), None, f"${DATABASE_URL_VARIABLE}")
