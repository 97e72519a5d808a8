"""Commands that need the runtime's side of the home: `edge`, `status`, `run --wait`, `logs`, `audit`."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from ..domain.states import RUN_TERMINAL, RunStatus
from ..errors import BadInput, NotFound
from ..home import holder_pid, nudge, read_disk_hold, read_recovery_status, read_store_outage, runtime_is_up
from ..store.repository import Repository
from . import render

EXIT_TIMED_OUT, EXIT_CANCELLED, EXIT_FAILED_NO_CODE, EXIT_DOWN = 124, 130, 125, 3
WAIT_POLL_S = 0.1
TERMINAL_STATES = frozenset(s.value for s in RUN_TERMINAL)


def edge(repo: Repository, args: argparse.Namespace) -> int:
    from ..edge import EdgeRuntime  # the actor stack loads only for the runtime itself

    repo.close()  # the runtime opens its own connections
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


def wait_for(repo: Repository, run_id: str, poll_s: float = WAIT_POLL_S):
    """Poll the database (a read transaction each time) until the run is terminal."""
    while True:
        run = repo.runs.get(run_id)
        if run.state in TERMINAL_STATES:
            return run
        time.sleep(poll_s)


def run(repo: Repository, args: argparse.Namespace) -> int:
    admission = repo.runs.request(args.name)
    return announce_and_follow(repo, args, admission.run.id)


def announce_and_follow(repo: Repository, args: argparse.Namespace, run_id: str) -> int:
    """Print a new run's id, nudge the runtime, and with `--wait` follow it to its exit status."""
    print(run_id, flush=True)
    nudge(args.cfg.home)
    if not args.wait:
        return 0
    final = wait_for(repo, run_id)
    last = final.attempts[-1] if final.attempts else None
    return exit_status_of(final.state, last.exit_code if last else None)


def status(repo: Repository, args: argparse.Namespace) -> int:
    home = args.cfg.home
    up = runtime_is_up(home)
    from ..store.control import Control

    counts = {k: v for k, v in Control(repo.store).status_counts().runs.items() if v}
    unresolved = read_recovery_status(home) if up else []
    hold = read_disk_hold(home) if up else None  # a file left by a runtime that died says nothing
    outage = read_store_outage(home) if up else None
    quarantined = _count_quarantined(args.cfg.receipts_dir)
    report = {"up": up, "pid": holder_pid(home) if up else None, "home": str(home),
              "runs": counts, "unresolved_recoveries": unresolved, "quarantined_receipts": quarantined,
              "disk_reserve_hold": hold, "store_outage": outage}
    if args.json:
        render.dump_json(report)
    else:
        print(f"runtime: {'up (pid ' + str(report['pid']) + ')' if up else 'down'}  home: {home}")
        active = {k: v for k, v in counts.items() if not RunStatus(k).terminal}
        print("active runs: " + (", ".join(f"{k} {v}" for k, v in sorted(active.items())) or "none"))
        print(f"unresolved recoveries: {len(unresolved)}")
        for item in unresolved:
            print(f"  attempt {item.get('attempt_id')}: {item.get('why')}")
        print(f"quarantined receipts: {quarantined}")
        if hold is not None:
            print(f"disk reserve: holding new attempts since {render.when(hold.get('since_ms'))}: "
                  f"{_mib(hold.get('free_bytes'))} free on {hold.get('path')}, below the reserve of "
                  f"{_mib(hold.get('reserve_bytes'))}; queued runs start when space is freed")
        if outage is not None:
            print(f"database: failing since {render.when(outage.get('since_ms'))} ({outage.get('failures')} "
                  f"failed transactions, last: {outage.get('error')}); retrying, the runtime stops if it "
                  f"lasts {_seconds(outage.get('stop_after_ms'))}")
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

    run_view = repo.runs.get(args.run_id)
    attempts = run_view.attempts
    if args.attempt is not None:
        attempts = tuple(a for a in attempts if a.number == args.attempt)
        if not attempts:
            raise NotFound(f"run {args.run_id} has no attempt {args.attempt}")
    attempt = attempts[-1]
    path = LogStore(args.cfg.logs_dir).path_for(run_view.id, attempt.id)
    out = sys.stdout.buffer

    def done() -> bool:
        return repo.runs.get(run_view.id).state in TERMINAL_STATES

    if args.follow:
        while not path.exists():  # not started yet: wait for the log or the end of the run
            if done():
                return 0
            time.sleep(0.2)
        follow(path, 0, done, out=out)
        return 0
    if not path.exists():
        if attempt.state in ("claimed",):
            return 0  # nothing written yet
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


def audit_receipts(repo: Repository, args: argparse.Namespace) -> int:
    from ..process.audit import audit
    from ..store.journal import Journal

    journal = Journal(repo.store)
    try:
        report = audit(args.cfg.receipts_dir,
                       is_registered=lambda aid: journal.get(aid) is not None,
                       is_active=lambda aid: repo.runs.attempt_state(aid) not in (None, *TERMINAL_STATES),
                       now_ms=time.time_ns() // 1_000_000, start_shard=args.shard, shards=args.shards,
                       per_shard=args.per_shard, quarantine=args.quarantine)
    except ValueError as err:
        raise BadInput(f"audit receipts: {err}") from None
    data = report.to_dict()
    if args.json:
        render.dump_json(data)
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
