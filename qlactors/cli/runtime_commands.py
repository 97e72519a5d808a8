"""CLI: the commands that need the runtime's side of the home: `edge`, `status`, `run --wait`, `logs`,
`audit`."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path

from ..clock import wall_ms
from ..domain.model import seconds_to_ms
from ..domain.states import RUN_TERMINAL, RunStatus
from ..errors import BadInput
from ..ids import new_id
from ..runtime.home import (holder_pid, nudge, read_cycle_failure, read_disk_hold, read_recovery_status,
                            read_store_outage, runtime_is_up)
from ..errors import StoreUnavailable
from ..store.repository import Repository
from .common import (EXIT_CANCELLED, EXIT_DOWN, EXIT_FAILED_NO_CODE, EXIT_TIMED_OUT, EXIT_WAIT_TIMEOUT, not_started,
                     operator_name, pick_attempt, say)
from .render import active_runs, cycle_failure_line, dump_json, seconds, when

WAIT_POLL_S = 0.1
TERMINAL_STATES = frozenset(s.value for s in RUN_TERMINAL)


def edge(repo: Repository, args: argparse.Namespace) -> int:
    from ..profiles.edge import EdgeRuntime  # the actor stack loads only for the runtime itself
    from .target import DATABASE_URL_VARIABLE

    repo.close()  # the runtime opens its own connections
    if os.environ.get(DATABASE_URL_VARIABLE):  # set for the commands of a cluster, perhaps
        say(f"warning: ${DATABASE_URL_VARIABLE} is ignored: `qlactors edge` runs on the home "
            f"{args.cfg.home} and its own database (a cluster's replicas run `qlactors control "
            "--config control.toml`)")
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, args.log_level),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return EdgeRuntime(args.cfg, cancel_running=args.cancel_running,
                       launcher_shell=args.cfg.launcher_shell).run()


def exit_status_of(state: str, exit_code: int | None) -> int:
    """`run --wait`'s exit status for a terminal run (ARCHITECTURE.md: command line)."""
    if state == RunStatus.SUCCEEDED.value:
        return 0
    if state == RunStatus.TIMED_OUT.value:
        return EXIT_TIMED_OUT
    if state == RunStatus.CANCELLED.value:
        return EXIT_CANCELLED
    return EXIT_FAILED_NO_CODE if exit_code is None else exit_code


def wait_options(args: argparse.Namespace) -> int | None:
    """`--wait-timeout SEC` in ms (None: wait as long as it takes); checked before any write."""
    text = getattr(args, "wait_timeout", None)
    if text is None:
        return None
    if not args.wait:
        raise BadInput("--wait-timeout needs --wait; nothing was written")
    ms = seconds_to_ms("--wait-timeout", text)
    if ms == 0:
        raise BadInput("--wait-timeout: give a number of seconds above 0 (without it, --wait waits "
                       "as long as the run takes); nothing was written")
    return ms


# How often a request whose commit outcome is unknown is tried again, with the same key.
REQUEST_TRIES = 5
FIRST_RETRY_S = 0.2


def exactly_once(request, what: str, hint: str):
    """Run `request(key)` with an idempotency key chosen before its first try (ARCHITECTURE.md):
    a try whose outcome is unknown (the connection failed during the commit) is repeated with
    the same key, so a run that was committed is re-read, never admitted twice. When every try
    fails, the error says the request may have been applied and how to see whether it was."""
    key = f"request:{new_id()}"
    delay = FIRST_RETRY_S
    for attempt in range(1, REQUEST_TRIES + 1):
        try:
            return request(key)
        except StoreUnavailable as err:
            if attempt == REQUEST_TRIES:
                raise StoreUnavailable(f"{err}; {what} may have been applied: {hint} shows whether "
                                       "it was; request it again only if it was not") from err
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def run(repo: Repository, args: argparse.Namespace) -> int:
    timeout_ms = wait_options(args)
    actor_name = operator_name()
    admission = exactly_once(lambda key: repo.runs.request(args.name, idempotency_key=key, actor_name=actor_name),
                             f"the run of {args.name}", f"`qlactors runs --task {args.name} --limit 1`")
    return announce_and_follow(repo, args, admission.run.id, timeout_ms)


def announce_and_follow(repo: Repository, args: argparse.Namespace, run_id: str,
                        timeout_ms: int | None) -> int:
    """Print a new run's id, nudge the runtime, and with `--wait` follow it to its exit status."""
    print(run_id, flush=True)
    if args.cluster is None:
        nudge(args.cfg.home)
    if not args.wait:
        return 0
    if args.cluster is None:
        watch = HomeWatch(args.cfg.home)
    else:
        watch = ReplicaWatch(repo, args.cluster.settings.cadence_tick_ms)
    from .placement import PlacementNotice

    return Follow(repo, watch, run_id, timeout_ms, placement=PlacementNotice(repo, args, run_id)).exit_status()


class HomeWatch:
    """For `run --wait` on edge: is a runtime up for the home?"""

    def __init__(self, home: Path) -> None:
        self.home = home

    def up(self) -> bool:
        return runtime_is_up(self.home)

    def up_line(self, run_id: str) -> str:
        return f"a runtime is up for {self.home} (pid {holder_pid(self.home) or '?'}): following run {run_id}"

    def down_line(self, run_id: str, state: str) -> str:
        return (f"no runtime is up for {self.home}: run {run_id} stays {state} until one starts "
                "(`qlactors edge`); still waiting")


class ReplicaWatch:
    """For `run --wait` on a cluster: is any control replica up to run the job?"""

    def __init__(self, repo: Repository, cadence_tick_ms: int) -> None:
        self.repo, self.tick = repo, cadence_tick_ms

    def up(self) -> bool:
        from ..store.cadence.cluster_status import replicas_up

        return replicas_up(self.repo.store, self.tick) > 0

    def up_line(self, run_id: str) -> str:
        return f"a control replica is up: following run {run_id}"

    def down_line(self, run_id: str, state: str) -> str:
        return (f"no control replica is up for the cluster database: run {run_id} stays {state} until "
                "one starts (`qlactors control --config FILE`); still waiting")


class Follow:
    """`--wait`: poll the run (a read transaction each time) until it ends, the wait times out,
    or SIGINT arrives. Stderr says when no runtime is up to run it (once per change), and why
    the exit status is 75, 124, 125 or 130; the run itself is never touched. `watch` tells
    whether something is up to run it (HomeWatch on edge, ReplicaWatch on a cluster)."""

    def __init__(self, repo: Repository, watch, run_id: str, timeout_ms: int | None,
                 poll_s: float = WAIT_POLL_S, placement=None) -> None:
        self.repo, self.watch, self.run_id = repo, watch, run_id
        self.placement = placement  # a PlacementNotice: why no worker can take the queued run
        self.timeout_ms, self.poll_s = timeout_ms, poll_s
        self.runtime_up: bool | None = None  # as last said on stderr; None: nothing said yet
        self.interrupted = False

    def exit_status(self) -> int:
        previous = signal.signal(signal.SIGINT, self._on_sigint)  # a flag, not KeyboardInterrupt
        try:                                                      # inside a database read
            return self._follow()
        finally:
            signal.signal(signal.SIGINT, previous)

    def _on_sigint(self, _signum, _frame) -> None:
        self.interrupted = True

    def _follow(self) -> int:
        started = time.monotonic()
        while True:
            run = self.repo.runs.get(self.run_id)
            if run.state in TERMINAL_STATES:
                if self.runtime_up is False:  # it started and ran the job within one poll: said so
                    self._say_runtime(run.state)
                return self._ended(run)
            if self.interrupted:
                say(f"interrupted: run {run.id} goes on ({run.state}); follow it with "
                    f"`qlactors logs -f {run.id}`, stop it with `qlactors cancel {run.id}`")
                return EXIT_CANCELLED
            if self.timeout_ms is not None and (time.monotonic() - started) * 1000 >= self.timeout_ms:
                say(f"run {run.id} is still {run.state} after --wait-timeout "
                    f"{seconds(self.timeout_ms)}; it goes on: follow it with "
                    f"`qlactors show {run.id}`")
                return EXIT_WAIT_TIMEOUT
            self._say_runtime(run.state)
            if self.placement is not None and self.runtime_up:
                line = self.placement.line(run.state, time.monotonic())
                if line is not None:
                    say(line)
            time.sleep(self.poll_s)

    def _say_runtime(self, state: str) -> None:
        up = self.watch.up()
        if up == self.runtime_up or (up and self.runtime_up is None):
            self.runtime_up = up
            return
        say(self.watch.up_line(self.run_id) if up else self.watch.down_line(self.run_id, state))
        self.runtime_up = up

    def _ended(self, run) -> int:
        last = run.attempts[-1] if run.attempts else None
        status = exit_status_of(run.state, last.exit_code if last else None)
        if run.state == RunStatus.CANCELLED.value:
            say(f"run {run.id} was cancelled ({run.cancel_reason or 'no reason recorded'})")
        elif run.state == RunStatus.TIMED_OUT.value:
            say(f"run {run.id} timed out")
        elif status == EXIT_FAILED_NO_CODE and (last is None or last.exit_code is None):
            say(f"run {run.id} failed without an exit code ({run.error_code or 'no error code'})")
        return status


def edge_status(repo: Repository, cfg, *, listed: bool = True) -> tuple[dict, list, dict]:
    """The edge `status --json` report (also `GET /api/v1/status`), with the active runs and why
    each waits, for the text form (`listed` False: no `active_run_list`, as `/metrics` needs none)."""
    home = cfg.home
    up = runtime_is_up(home)
    from ..store.cadence.control import Control
    from .placement import active_with_reasons

    counts = {k: v for k, v in Control.open(repo.store).status.run_counts().items() if v}
    active = {k: v for k, v in sorted(counts.items()) if not RunStatus(k).terminal}
    listing, reasons = active_with_reasons(repo, None) if listed else ([], {})
    report = {"up": up, "pid": holder_pid(home) if up else None, "home": str(home),
              "runs": counts, "active_runs": active,
              **({"active_run_list": [r.to_json(reasons[r.run_id]) for r in listing]} if listed else {}),
              "unresolved_recoveries": read_recovery_status(home) if up else [],
              "quarantined_receipts": _count_quarantined(cfg.receipts_dir),
              # a file left by a runtime that died says nothing
              "disk_reserve_hold": read_disk_hold(home) if up else None,
              "store_outage": read_store_outage(home) if up else None,
              "cycle_failure": read_cycle_failure(home) if up else None}
    return report, listing, reasons


def status(repo: Repository, args: argparse.Namespace) -> int:
    home = args.cfg.home
    report, listing, reasons = edge_status(repo, args.cfg)
    up, active, unresolved = report["up"], report["active_runs"], report["unresolved_recoveries"]
    quarantined, hold = report["quarantined_receipts"], report["disk_reserve_hold"]
    outage, cycle = report["store_outage"], report["cycle_failure"]
    if args.json:
        dump_json(report)
    else:
        print(f"runtime: {'up (pid ' + str(report['pid']) + ')' if up else 'down'}  home: {home}")
        print("active runs: " + (", ".join(f"{k} {v}" for k, v in active.items()) or "none"))
        active_runs(listing, reasons, sum(active.values()))
        print(f"unresolved recoveries: {len(unresolved)}")
        for item in unresolved:
            print(f"  attempt {item.get('attempt_id')}: {item.get('why')}")
        print(f"quarantined receipts: {quarantined}")
        if hold is not None:
            print(f"disk reserve: holding new attempts since {when(hold.get('since_ms'))}: "
                  f"{_mib(hold.get('free_bytes'))} free on {hold.get('path')}, below the reserve of "
                  f"{_mib(hold.get('reserve_bytes'))}; queued runs start when space is freed")
        if outage is not None:
            print(f"database: failing since {when(outage.get('since_ms'))} ({outage.get('failures')} "
                  f"failed transactions, last: {outage.get('error')}); retrying, the runtime stops if it "
                  f"lasts {_seconds(outage.get('stop_after_ms'))}")
        if cycle is not None:
            print(cycle_failure_line(cycle))
    return 0 if up else EXIT_DOWN


def _seconds(ms: int | None) -> str:
    return "?" if not isinstance(ms, int) else f"{ms / 1000:g} s"


def _mib(n: int | None) -> str:
    return "?" if not isinstance(n, int) else f"{n / (1024 * 1024):.1f} MiB"


def _count_quarantined(receipts_dir: Path, limit: int = 10_000) -> int:
    """Bounded count of files under `.quarantine` (status must stay cheap on a huge tree)."""
    root = receipts_dir / ".quarantine"
    count = 0
    if not root.is_dir():
        return 0
    for shard in root.iterdir():
        if shard.is_dir() and not shard.is_symlink():
            for _ in shard.iterdir():
                count += 1
                if count >= limit:
                    return count
    return count


def logs(repo: Repository, args: argparse.Namespace) -> int:
    from ..process.logs import LogStore, follow, read

    run_view, attempt = pick_attempt(repo, args)
    path = LogStore(args.cfg.logs_dir).path_for(run_view.id, attempt.id)
    out = sys.stdout.buffer

    def current():
        return next(a for a in repo.runs.get(run_view.id).attempts if a.id == attempt.id)

    def done() -> bool:
        return repo.runs.get(run_view.id).state in TERMINAL_STATES

    if args.follow:
        if not path.exists() and attempt.started_at_ms is None:
            say(f"run {run_view.id} has not started yet ({attempt.state}); waiting for it")
        while not path.exists():  # not started yet: wait for the log or the end of the run
            if done():
                say(not_started(run_view.id, current()))
                return 0
            time.sleep(0.2)
        follow(path, 0, done, out=out)
        return 0
    if attempt.started_at_ms is None and (not path.exists() or path.stat().st_size == 0):
        say(not_started(run_view.id, attempt))  # nothing to print, and the reason is no failure
        return 0
    if not path.exists():
        raise BadInput(f"no log file for run {run_view.id} attempt {attempt.number} (expected {path})")
    offset = 0
    while True:
        chunk = read(path, offset)
        if not chunk:
            break
        out.write(chunk)
        offset += len(chunk)
    out.flush()
    return 0


def audit_receipts(repo: Repository | None, args: argparse.Namespace) -> int:
    """`audit receipts`; `repo` is None when the home has no database (it is never created here)."""
    from ..executor.journal.journal import Journal
    from ..process.audit import DEFAULT_MIN_AGE_MS, audit

    if repo is None:
        if args.quarantine:
            raise BadInput("audit receipts --quarantine: the home has no database, so nothing can "
                           "tell an orphan from a receipt it still needs; nothing was moved: restore "
                           "the database first, or move receipts/ aside yourself")
        print(f"qlactors: the home has no database: no journal or run knows any receipt, so every "
              f"receipt older than {DEFAULT_MIN_AGE_MS // 60_000} minutes is listed as an orphan; "
              "nothing was created", file=sys.stderr)

        def is_registered(_attempt_id: str) -> bool:
            return False
        is_active = is_registered
    else:
        journal = Journal(repo.store)

        def is_registered(attempt_id: str) -> bool:
            return journal.get(attempt_id) is not None

        def is_active(attempt_id: str) -> bool:
            return repo.runs.attempt_state(attempt_id) not in (None, *TERMINAL_STATES)
    try:
        report = audit(args.cfg.receipts_dir, is_registered=is_registered, is_active=is_active,
                       now_ms=wall_ms(), start_shard=args.shard, shards=args.shards,
                       per_shard=args.per_shard, quarantine=args.quarantine)
    except ValueError as err:
        raise BadInput(f"audit receipts: {err}") from None
    data = report.to_dict()
    if args.json:
        dump_json(data)
    else:
        print(" ".join(f"{k}={v}" for k, v in sorted(data["counts"].items())))
        for orphan in data["orphans"]:
            print(f"orphan {orphan}")
        for item in data["unsafe"]:
            print(f"unsafe {item['path']}: {item['reason']}")
        for shard in data["overflow"]:
            print(f"overflow shard {shard}: nothing in it was moved")
        for moved in data["quarantined"]:
            print(f"quarantined {moved['from']} -> {moved['to']}")
        print(f"next: --shard {data['next_shard']}" if data["next_shard"] else "next: done (last shard read)")
    return 0
