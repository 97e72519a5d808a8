"""CLI: the commands of the cluster: `keys new`, `worker allow|revoke`, `workers`, `control`, `worker`,
and the cluster side of `status`, `logs` and `run --wait` (no local runtime socket: the store)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any

from ..config import ControlConfig, WorkerConfig, load_config
from ..domain.states import AttemptStatus, RunStatus
from ..errors import BadInput, QlactorsError
from ..store.cadence.cluster_status import read_cluster_status
from ..store.repository import Repository
from ..store.admin.workers import Workers
from ..wire.curve_keys import COPY_THE_REPLICAS_KEY, load_key_pair, load_public_key, new_key_pair
from .render import (WORKER_HEADER, active_runs, age_of, confirm_line, confirm_refusal, cycle_failure_line,
                     dump_json, table, when, worker_rows)
from .common import EXIT_DOWN, not_started, operator_name, pick_attempt, say
from .placement import active_with_reasons

LOG_READ_LIMIT = 1024 * 1024  # bytes asked of the log store per read
FOLLOW_POLL_S = 0.2


# -- keys and the allow-list -----------------------------------------------------------------

def keys_new(args: argparse.Namespace) -> int:
    public, secret = new_key_pair(args.dir, args.name)
    print(f"public key: {public}")
    print(f"secret key: {secret} (0600: copy it only to the hosts that use it, keeping the mode)")
    return 0


def worker_allow(repo: Repository, args: argparse.Namespace) -> int:
    from ..store.admin.worker_keys import WorkerKeys

    key = load_public_key(args.keyfile).decode("ascii")
    added = WorkerKeys(repo.store).allow(args.name, key)
    print(f"worker {args.name} {'allowed' if added else 'was already allowed'} with key {key}")
    return 0


def worker_revoke(repo: Repository, args: argparse.Namespace) -> int:
    from ..store.admin.worker_keys import WorkerKeys

    revoked = WorkerKeys(repo.store).revoke(args.name)
    print(f"worker {revoked.worker_id} revoked; {revoked.sessions_ended} session(s) ended: its "
          "reports are fenced, and its key no longer connects")
    return 0


def worker_retire(repo: Repository, args: argparse.Namespace) -> int:
    from ..store.admin.worker_retirement import WorkerRetirement

    if not args.confirm_stopped:
        raise BadInput(f"`worker retire {args.name}` is your word that nothing of worker {args.name} runs any "
                       "more: its runs are then recovered and may run again elsewhere. Make sure of it (its "
                       "host is down, or its job processes are gone), then add --confirm-stopped; "
                       "nothing was changed")
    retirement = WorkerRetirement(repo.store)
    alive = None if args.force else retirement.fresh(args.name)
    if alive is not None:
        raise BadInput(f"worker {args.name} looks alive: its session {alive.session_id} heartbeat "
                       f"{alive.age_ms / 1000:.1f} s ago and its lease runs {alive.left_ms / 1000:.1f} s more; "
                       "retire is for a worker that is gone (stop it first, or wait for its lease to expire), "
                       "and --force retires it anyway; nothing was changed")
    done = retirement.retire(args.name)
    print(f"worker {done.worker_id} retired: {done.sessions_ended} session(s) ended (its reports are fenced; "
          f"its key stays allowed); {len(done.attempts)} attempt(s) marked stopped by the operator: "
          "recovery ends them `lost` once their lease has expired, then their retry policy applies")
    for attempt_id in done.attempts:
        print(f"  {attempt_id}")
    return 0


def confirm_stopped(repo: Repository, args: argparse.Namespace) -> int:
    """`confirm-stopped RUN [--by NAME]`: the operator's word that the run's current attempt runs
    nowhere (SEMANTICS.md §10), for one stuck attempt instead of a whole worker's retire."""
    from ..store.dispatch.evidence import ConfirmStopped

    by = args.by if args.by is not None else operator_name()
    view = repo.runs.get(args.run_id)  # an unknown or retired run, in its own words
    done = ConfirmStopped(repo.store).confirm_stopped(view.id, by)
    if not done.applied:
        raise BadInput(confirm_refusal(done))
    print(confirm_line(done))
    return 0


def workers(repo: Repository, args: argparse.Namespace) -> int:
    listed = Workers(repo.store).list()
    if args.json:
        dump_json([w.to_json() for w in listed.workers])
    else:
        table(worker_rows(listed.workers), WORKER_HEADER)
    return 0


# -- the two cluster processes ---------------------------------------------------------------

def _profile_config(args: argparse.Namespace, profile: str) -> ControlConfig | WorkerConfig:
    if not args.config:
        raise BadInput(f"`qlactors {profile}` needs --config FILE (configs/{profile}.toml lists every "
                       "setting at its default)")
    cfg = load_config(args.config)
    if cfg.profile != profile:
        raise BadInput(f"{cfg.path} is a {cfg.profile} config; `qlactors {profile}` needs "
                       f"profile = \"{profile}\"")
    return cfg


def _logging(args: argparse.Namespace) -> None:
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, args.log_level),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")


def _runtime_class(module: str, name: str):
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as err:
        if err.name != module:
            raise
        raise QlactorsError(f"this qlactors has no {name} ({module} is missing)") from None


def control(args: argparse.Namespace) -> int:
    """Validate control.toml and the replica's key pair, then run the replica in the foreground."""
    from ..wire.endpoints import check_bindable, parse_endpoint

    cfg = _profile_config(args, "control")
    load_key_pair(cfg.key)
    check_bindable(parse_endpoint(cfg.bind))  # in use: one line, before the database is opened
    _logging(args)
    return _runtime_class("qlactors.profiles.control", "ControlRuntime")(cfg).run()


def worker(args: argparse.Namespace) -> int:
    """Validate worker.toml and its keys, then run the executor worker in the foreground."""
    cfg = _profile_config(args, "worker")
    load_public_key(cfg.server_key, missing=f"[worker] server_key {COPY_THE_REPLICAS_KEY}")
    load_key_pair(cfg.key)
    _logging(args)
    return _runtime_class("qlactors.profiles.worker", "WorkerRuntime")(cfg).run()


# -- status, logs and run --wait against the cluster database --------------------------------

@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """The cluster `status --json` report (also `GET /api/v1/status`), and what the text form
    prints beside it."""

    report: dict
    cluster: Any  # store.cadence.cluster_status.ClusterStatus
    workers: Any  # the Workers listing
    listing: list
    reasons: dict


def cluster_status(repo: Repository, target, *, all_replicas: bool = False, listed: bool = True) -> ClusterStatus:
    """The cluster `status --json` report (also `GET /api/v1/status`; `listed` False: no
    `active_run_list`, as `/metrics` needs none)."""
    from ..store.cadence.control import Control

    settings = target.settings
    cluster = read_cluster_status(repo.store, settings.cadence_tick_ms, recovery_grace_ms=settings.recovery_grace_ms,
                                  drain_grace_ms=settings.drain_grace_ms)
    workers = Workers(repo.store).list()
    counts = {k: v for k, v in Control.open(repo.store).status.run_counts().items() if v}
    active = {k: v for k, v in sorted(counts.items()) if not RunStatus(k).terminal}
    listing, reasons = (active_with_reasons(repo, [(w.worker_id, w.labels) for w in workers.workers if w.serving])
                        if listed else ([], {}))
    shown = cluster.replicas if all_replicas else cluster.current
    report = {"up": cluster.replicas_up > 0, "profile": "cluster", "database": target.describe(),
              "replicas": [r.to_json() for r in shown],
              "workers": [w.to_json() for w in workers.workers], "runs": counts, "active_runs": active,
              **({"active_run_list": [r.to_json(reasons[r.run_id]) for r in listing]} if listed else {}),
              "unresolved_recoveries": [w.to_json() for w in cluster.waiting]}
    return ClusterStatus(report, cluster, workers, listing, reasons)


def status(repo: Repository, args: argparse.Namespace) -> int:
    """Replicas, workers, active runs and open recovery cases; exit 0 when a replica is up, else 3."""
    found = cluster_status(repo, args.cluster, all_replicas=args.all)
    report, cluster, listed, listing, reasons = found.report, found.cluster, found.workers, found.listing, found.reasons
    up, active = report["up"], report["active_runs"]
    shown = cluster.replicas if args.all else cluster.current
    hidden = len(cluster.replicas) - len(cluster.current)
    if args.json:
        dump_json(report)
        return 0 if up else EXIT_DOWN
    print(f"cluster: {cluster.replicas_up} of {len(cluster.current)} replica(s) up  "
          f"database: {args.cluster.describe()}"
          + (f"  ({hidden} stopped or long-silent not counted: `qlactors status --all`)"
             if hidden and not args.all else ""))
    table([(r.replica_id, "up" if r.up else "stopped" if r.stopped_at_ms else "silent", r.host,
            str(r.pid), r.bind, age_of(cluster.at_ms, r.heartbeat_at_ms), str(r.db_errors))
           for r in shown],
          ("REPLICA", "STATE", "HOST", "PID", "BIND", "HEARTBEAT", "DB ERRORS"), indent="  ")
    for r in shown:
        if r.up and r.last_db_error is not None:
            print(f"  replica {r.replica_id}: {r.db_errors} transient database error(s) retried, the last "
                  f"at {when(r.last_db_error_at_ms)} (the replica's clock): {r.last_db_error}")
        if r.up and r.cycle_failure is not None:
            print("  " + cycle_failure_line(r.cycle_failure, f"replica {r.replica_id} cadence"))
    serving = sum(1 for w in listed.workers if w.serving)
    print(f"workers: {serving} serving of {len(listed.workers)}")
    table(worker_rows(listed.workers), WORKER_HEADER, indent="  ")
    print("active runs: " + (", ".join(f"{k} {v}" for k, v in active.items()) or "none"))
    active_runs(listing, reasons, sum(active.values()))
    print(f"unresolved recoveries: {len(cluster.waiting)}")
    for w in cluster.waiting:
        print(f"  run {w.run_id} attempt {w.attempt_id} ({w.attempt_status}): {w.reason}")
    return 0 if up else EXIT_DOWN


def logs(repo: Repository, args: argparse.Namespace) -> int:
    """A cluster attempt's log from `log_chunks`, byte for byte; `-f` ends at the final offset
    the worker's `Completed` recorded, not at the run's end (SEMANTICS.md §13)."""
    from ..store.dispatch.log_chunks import LogChunks  # written beside this; imported when used

    run_view, attempt = pick_attempt(repo, args)
    chunks, out = LogChunks(repo.store), sys.stdout.buffer
    offset = 0

    def drain() -> None:
        nonlocal offset
        while data := chunks.read(attempt.id, offset, LOG_READ_LIMIT):
            out.write(data)
            offset += len(data)
        out.flush()

    def current():
        return next(a for a in repo.runs.get(run_view.id).attempts if a.id == attempt.id)

    if not args.follow:
        drain()
        final = chunks.final_offset(attempt.id)
        if offset == 0 and attempt.started_at_ms is None:
            say(not_started(run_view.id, attempt))
        elif final is not None and offset < final:
            say(f"run {run_view.id}: {offset} of the log's {final} bytes have reached the control side "
                f"so far; the worker is still shipping the rest (`qlactors logs -f {run_view.id}`)")
        elif final is None and AttemptStatus(attempt.state).terminal:
            say(_shortfall(run_view.id, attempt.state, offset))
        return 0
    while True:
        now = current()  # read before the final offset: a completion records both at once
        final = chunks.final_offset(attempt.id)
        drain()
        if final is not None and offset >= final:
            return 0
        if final is None and AttemptStatus(now.state).terminal:
            say(not_started(run_view.id, now) if offset == 0 and now.started_at_ms is None
                else _shortfall(run_view.id, now.state, offset))
            return 0
        time.sleep(FOLLOW_POLL_S)


def _shortfall(run_id: str, state: str, offset: int) -> str:
    return (f"run {run_id}: the attempt ended {state} with no final log offset from its worker: "
            f"the log shown ends at the last acknowledged offset {offset}; the rest is unknown")
