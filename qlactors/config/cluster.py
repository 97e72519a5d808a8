"""The two cluster profiles' settings (ARCHITECTURE.md "Cluster configuration"): `control.toml`
for a control replica, `worker.toml` for an executor host.

Every setting but the database URL has a default (SEMANTICS.md §11, cluster column), listed with
it in `configs/control.toml` and `configs/worker.toml`. Paths are relative to the config file's
own directory. A bad file is refused with BadInput (exit 2) naming the key; nothing starts.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Mapping

from ..domain.labels import check_labels
from ..domain.model import MAX_STOP_GRACE_MS
from ..errors import BadInput
from .knobs import DAY_MS, DEFAULTS, Knob, RuntimeSettings, check_int, check_shell, knob, knob_of, launcher_shell, \
    read_toml, shared

CLUSTER_PROFILES = ("control", "worker")


@dataclass(frozen=True, slots=True)
class DatabaseSettings:
    """`[database]` of control.toml: the PostgreSQL URL, the pool, and the three server-side
    timeouts, each shorter than the heartbeat interval (SEMANTICS.md §9 Transport)."""

    url: str = knob("", kind="url", doc="the cluster's PostgreSQL (required; the only setting without a default)")
    pool_size: int = knob(8, 1, 256, doc="connections this replica keeps open to PostgreSQL")
    lock_timeout_ms: int = knob(2_000, 1, 3_600_000, doc="a lock wait longer than this fails the transaction")
    statement_timeout_ms: int = knob(5_000, 1, 3_600_000, doc="a statement running longer than this is cancelled")
    idle_in_transaction_session_timeout_ms: int = knob(
        5_000, 1, 3_600_000, doc="a transaction left idle this long is ended by the server")

    SECTION: ClassVar[str] = "database"

    TIMEOUTS: ClassVar[tuple[str, ...]] = (
        "lock_timeout_ms", "statement_timeout_ms", "idle_in_transaction_session_timeout_ms")

    def store_options(self, *, pool: bool = True) -> dict[str, int]:
        """What `Store` takes for this database: the pool size (a replica's; a command keeps the
        default) and the three timeouts, which it sets on every connection of the pool."""
        options = dict(lock_timeout_ms=self.lock_timeout_ms, statement_timeout_ms=self.statement_timeout_ms,
                       idle_in_transaction_timeout_ms=self.idle_in_transaction_session_timeout_ms)
        if pool:
            options["pool_size"] = self.pool_size
        return options


@dataclass(frozen=True, slots=True)
class ControlConfig:
    """One control replica: its database, its ROUTER bind, its key pair, and its cadence."""

    path: Path  # the config file
    database: DatabaseSettings
    bind: str = knob("tcp://0.0.0.0:5710", kind="endpoint", doc="the ROUTER socket workers connect to")
    key: Path = knob(Path("keys/control.key_secret"), kind="path", doc="this replica's CURVE secret key")
    heartbeat_ms: int = knob(10_000, 1_000, 600_000, doc="heartbeat interval told to workers in Welcome")
    session_lease_ms: int = knob(45_000, 2_000, 3_600_000, doc="a session not heard from this long has expired")
    run_lease_ms: int = knob(30_000, 2_000, 3_600_000, doc="an offer's lease, renewed by every heartbeat")
    recovery_grace_ms: int = knob(120_000, 2_000, 7 * DAY_MS,
                                  doc="a session ended at least this long ago is evidence its jobs stopped")
    drain_grace_ms: int = knob(900_000, 0, 7 * DAY_MS,
                               doc="an offline (drained) session counts as ended only after this long")
    cadence_tick_ms: int = shared("cadence_tick_ms")
    recovery_page: int = shared("recovery_page")
    retry_page: int = shared("retry_page")
    cron_page: int = shared("cron_page")
    shutdown_drain_ms: int = shared("shutdown_drain_ms")
    store_outage_stop_ms: int = shared("store_outage_stop_ms")
    retention_max_age_ms: int = shared("retention_max_age_ms")
    retention_max_runs: int = shared("retention_max_runs")
    retention_page: int = shared("retention_page")
    retention_revoked_tokens_ms: int = shared("retention_revoked_tokens_ms")
    retention_task_events: int = shared("retention_task_events")

    SECTION: ClassVar[str] = "control"

    profile: ClassVar[str] = "control"

    @property
    def public_key(self) -> Path:
        """The public half beside the secret key file (`NAME.key` beside `NAME.key_secret`)."""
        return _public_beside(self.key)

    def runtime_settings(self) -> RuntimeSettings:
        """The RuntimeSettings the shared actors take: this replica's knobs; the executor-side
        knobs keep the standalone defaults (no executor runs in a replica)."""
        return _runtime(self)


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """One executor host: the replicas to reach, the keys, its slots and labels, its state."""

    path: Path  # the config file
    control: tuple[str, ...] = knob(("tcp://127.0.0.1:5710",), kind="endpoints",
                                    doc="the control replicas' ROUTER endpoints")
    server_key: Path = knob(Path("keys/control.key"), kind="path", doc="the replicas' CURVE public key")
    key: Path = knob(Path("keys/worker.key_secret"), kind="path", doc="this worker's CURVE secret key")
    slots: int = shared("slots")
    labels: tuple[str, ...] = knob((), kind="labels", doc="labels a task's --require-label must find here")
    state_dir: Path = knob(Path("state"), kind="path", doc="journal, logs and receipts; one worker at a time")
    request_timeout_ms: int = knob(5_000, 100, 60_000,
                                   doc="how long a request waits for its answer before the next replica")
    handshake_failures_max: int = knob(10, 1, 1_000_000,
                                       doc="CURVE handshakes failing in a row (a wrong server_key, a protocol "
                                           "mismatch; not a key the replicas do not allow yet) before the worker "
                                           "exits 1")
    log_cap_bytes: int = shared("log_cap_bytes")
    stop_grace_ms: int = shared("stop_grace_ms")
    kill_grace_ms: int = shared("kill_grace_ms")
    output_drain_ms: int = shared("output_drain_ms")
    publish_grace_ms: int = shared("publish_grace_ms")
    shutdown_drain_ms: int = shared("shutdown_drain_ms")
    receipt_cleanup_interval_ms: int = shared("receipt_cleanup_interval_ms")
    receipt_cleanup_page: int = shared("receipt_cleanup_page")
    quarantine_retention_ms: int = shared("quarantine_retention_ms")
    disk_reserve_bytes: int = shared("disk_reserve_bytes")
    launcher_shell: str = launcher_shell()

    SECTION: ClassVar[str] = "worker"

    profile: ClassVar[str] = "worker"

    @property
    def journal_path(self) -> Path:
        """The worker's journal file (the one `StateDir` opens)."""
        from ..executor.journal.file import JOURNAL_FILE  # the store loads only when asked

        return self.state_dir / JOURNAL_FILE

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def receipts_dir(self) -> Path:
        return self.state_dir / "receipts"

    def runtime_settings(self) -> RuntimeSettings:
        """The RuntimeSettings the shared actors take: this worker's knobs; the control-side
        knobs keep the standalone defaults (no scheduler runs on a worker)."""
        return _runtime(self)


def file_profile(path: str | os.PathLike) -> str:
    """The `profile` a config file names ("edge" when it names none)."""
    profile = read_toml(Path(path)).get("profile", "edge")
    return profile if isinstance(profile, str) else repr(profile)


def load_config(path: str | os.PathLike) -> ControlConfig | WorkerConfig:
    """Read a control.toml or worker.toml; BadInput (exit 2) naming the key for anything wrong."""
    path = Path(path).absolute()
    data = read_toml(path)
    profile = data.pop("profile", None)
    if profile not in CLUSTER_PROFILES:
        raise BadInput(f"{path}: profile = {profile!r}: a cluster config says profile = \"control\" "
                       "or \"worker\" (configs/control.toml, configs/worker.toml)")
    if profile == "worker":
        if "database" in data:
            raise BadInput(f"{path}: [database] has no place in a worker config: a worker holds no "
                           "database credentials and reaches the database only through the control "
                           "replicas; remove the section")
        values = _read_sections(WorkerConfig, data, path, ("worker", "launcher"))
        return _check_worker(WorkerConfig(path=path, **values))
    database = DatabaseSettings(**_read_sections(DatabaseSettings, data, path, ("database",),
                                                 consume=False))
    values = _read_sections(ControlConfig, data, path, ("control",), extra=("database", "web"))  # web: config/web.py
    return _check_control(ControlConfig(path=path, database=database, **values))


def _read_sections(cls, data: dict[str, Any], path: Path, sections: tuple[str, ...], *,
                   consume: bool = True, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """The values of `cls`'s knobs found in `sections` (absent ones keep their defaults)."""
    unknown_sections = set(data) - set(sections) - set(extra) if consume else set()
    if unknown_sections:
        raise BadInput(f"{path}: unknown section(s) or key(s) {sorted(unknown_sections)}; known "
                       f"sections: {', '.join(f'[{s}]' for s in sections + extra)}")
    knobs = {(k.section or cls.SECTION, k.key or f.name): f for f in fields(cls) if (k := knob_of(f))}
    values: dict[str, Any] = {}
    for section in sections:
        table = data.get(section, {})
        if not isinstance(table, dict):
            raise BadInput(f"{path}: [{section}] must be a table")
        for key, value in table.items():
            f = knobs.get((section, key))
            if f is None:
                known = sorted(k for s, k in knobs if s == section)
                raise BadInput(f"{path}: unknown [{section}] key {key!r}; known: {', '.join(known)}")
            values[f.name] = _parse(knob_of(f), value, f"{path}: [{section}] {key}", path.parent)
    for f in knobs.values():  # a default path is relative to the file's directory too
        if knob_of(f).kind == "path" and f.name not in values:
            values[f.name] = path.parent / f.default
    return values


def _parse(k: Knob, value: Any, where: str, base: Path) -> Any:
    kind = k.kind
    if kind == "int":
        return check_int(k, value, where)
    if kind == "path":
        if not isinstance(value, str) or not value:
            raise BadInput(f"{where} = {value!r}: give a path (relative to the config file's directory)")
        return base / Path(value).expanduser()
    if kind == "endpoint":
        return _endpoint(where, value)
    if kind == "endpoints":
        if not isinstance(value, list) or not value:
            raise BadInput(f"{where} = {value!r}: give a list of one or more replica endpoints, "
                           "e.g. [\"tcp://ctl-1:5710\", \"tcp://ctl-2:5710\"]")
        return tuple(_endpoint(where, item) for item in value)
    if kind == "labels":
        if not isinstance(value, list):
            raise BadInput(f"{where} = {value!r}: give a list of labels, e.g. [\"gpu\", \"zone=eu\"]")
        return check_labels(where, value)
    if kind == "url":
        url = cluster_database_url(value)
        if url is None:
            raise BadInput(f"{where} = {value!r}: a control replica needs PostgreSQL: "
                           "postgresql://USER@HOST:5432/DB")
        return url
    if kind == "shell":
        return value  # checked with the rest of the worker (it must exist on this host)
    raise AssertionError(kind)


# The schemes a cluster database URL may have; the bare ones mean psycopg 3, the one driver.
_PSYCOPG_SCHEME = "postgresql+psycopg://"
_BARE_SCHEMES = ("postgresql://", "postgres://")


def cluster_database_url(value: Any) -> str | None:
    """The URL qlactors opens for a cluster database URL as written (`postgresql://` and
    `postgres://`, as libpq and most tools write them, become `postgresql+psycopg://`); None for
    anything that is not PostgreSQL through psycopg."""
    if not isinstance(value, str):
        return None
    if value.startswith(_PSYCOPG_SCHEME):
        return value
    for scheme in _BARE_SCHEMES:
        if value.startswith(scheme):
            return _PSYCOPG_SCHEME + value[len(scheme):]
    return None


def _endpoint(where: str, value: Any) -> str:
    host, sep, port = value.removeprefix("tcp://").rpartition(":") if isinstance(value, str) else ("", "", "")
    if not (isinstance(value, str) and value.startswith("tcp://") and sep and host and port.isdigit()
            and 0 < int(port) < 65536):
        raise BadInput(f"{where} = {value!r}: give a tcp:// endpoint with a host and a port, "
                       "e.g. \"tcp://ctl-1:5710\"")
    return value


def _check_control(cfg: ControlConfig) -> ControlConfig:
    where = f"{cfg.path}:"
    if not cfg.database.url:
        raise BadInput(f"{where} [database] url is missing: a control replica needs its PostgreSQL "
                       "URL, e.g. url = \"postgresql+psycopg://qlactors@db:5432/qlactors\"")
    for name in DatabaseSettings.TIMEOUTS:
        value = getattr(cfg.database, name)
        if value >= cfg.heartbeat_ms:
            raise BadInput(f"{where} [database] {name} = {value} must be below [control] heartbeat_ms "
                           f"= {cfg.heartbeat_ms}, so a stuck transaction cannot hold a worker past a "
                           "heartbeat (SEMANTICS.md §9 Transport)")
    for name in ("session_lease_ms", "run_lease_ms"):
        if getattr(cfg, name) < 2 * cfg.heartbeat_ms:
            raise BadInput(f"{where} [control] {name} = {getattr(cfg, name)} must be at least twice "
                           f"heartbeat_ms = {cfg.heartbeat_ms}, so one lost heartbeat loses no lease")
    floor = cfg.session_lease_ms + MAX_STOP_GRACE_MS
    if cfg.recovery_grace_ms < floor:
        raise BadInput(f"{where} [control] recovery_grace_ms = {cfg.recovery_grace_ms} must be at least "
                       f"session_lease_ms + the longest stop grace a task may have ({cfg.session_lease_ms}"
                       f" + {MAX_STOP_GRACE_MS} = {floor}): a job whose stop had begun when its worker's "
                       "session ended has had its whole stop grace before recovery may run it again "
                       "(SEMANTICS.md §10)")
    return cfg


def _check_worker(cfg: WorkerConfig) -> WorkerConfig:
    check_shell(cfg.launcher_shell, cfg.path)
    return cfg


def _public_beside(secret: Path) -> Path:
    return secret.with_name(secret.name.removesuffix("_secret")) if secret.name.endswith(".key_secret") \
        else secret.with_suffix(".key")


def _runtime(cfg: ControlConfig | WorkerConfig) -> RuntimeSettings:
    base = DEFAULTS["standalone"]
    own = {f.name: getattr(cfg, f.name) for f in fields(RuntimeSettings) if hasattr(cfg, f.name)}
    return dataclasses.replace(base, **own)


def defaults_of(cls) -> Mapping[str, Any]:
    """Each knob of a cluster config class and its default, as written in a file (paths unresolved)."""
    return {f.name: f.default for f in fields(cls) if knob_of(f)}
