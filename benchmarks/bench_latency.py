#!/usr/bin/env python3
"""Latency from `qlactors run` to the job's first instruction (p50, p95), against a direct spawn.

The task is `date +%s%N`: its first (and only) instruction prints the wall clock in ns, which
lands in the run's log. The latency of one run is that timestamp minus `time.time_ns()` taken
just before the request. The runtime is the default `edge` profile (slots 1, 5 s cadence: the
nudge is what makes it act), up and idle between runs (each run is awaited to its terminal state,
then 0.3 s of quiet).

Two ways in, each over N runs (default 30, quick 10):
  * cli: `qlactors --home H run date` as a subprocess (what a user types; it includes the CLI's
    own Python start-up, imports and the database open);
  * api: `Repository.runs.request()` + `qlactors.runtime.home.nudge()` from this already warm process.
Baseline (same run, same N): `subprocess.Popen(["date", "+%s%N"])` from this Python process,
the same clock comparison. No requirement is set: the figures are reported.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402

JOB = ["date", "+%s%N"]


def direct(n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.time_ns()
        stamp = subprocess.run(JOB, capture_output=True, text=True, check=True).stdout
        out.append((int(stamp.strip()) - t0) / 1e6)
        time.sleep(0.05)
    return out


def first_instruction_ms(home: Path, repo, logs, run_id: str, t0: int, timeout: float = 30) -> float:
    c.wait_until(lambda: repo.runs.get(run_id).state in c.TERMINAL, timeout, poll=0.01, what=f"run {run_id}")
    view = repo.runs.get(run_id)
    if view.state != "succeeded":
        raise RuntimeError(f"run {run_id} ended {view.state}")
    text = logs.path_for(run_id, view.attempts[-1].id).read_text().strip()
    return (int(text) - t0) / 1e6


def main(argv: list[str] | None = None) -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, help="runs per way in (default 30, quick 10)")
    args = p.parse_args(argv)
    n = args.runs or (10 if args.quick else 30)
    result = c.Result("latency", args.quick)

    from qlactors.runtime.home import nudge
    from qlactors.process.logs import LogStore
    from qlactors.store.repository import Repository

    base = direct(n)
    home = c.temp_home("latency", args.keep)
    c.add_task(home, "date", JOB)
    edge = c.Edge(home).start()
    cli_ms, api_ms = [], []
    try:
        edge.wait_up()
        time.sleep(1.0)
        repo = Repository.open(c.database_url(home))
        logs = LogStore(home / "logs")
        try:
            for i in range(2 * n):  # alternate the two ways so drift hits both alike
                if i % 2 == 0:
                    t0 = time.time_ns()
                    run_id = c.cli(home, "run", "date").strip()
                    cli_ms.append(first_instruction_ms(home, repo, logs, run_id, t0))
                else:
                    t0 = time.time_ns()
                    run_id = repo.runs.request("date").run.id
                    nudge(home)
                    api_ms.append(first_instruction_ms(home, repo, logs, run_id, t0))
                time.sleep(0.3)
        finally:
            repo.close()
    finally:
        edge.stop()

    b50, b95 = c.percentile(base, 50), c.percentile(base, 95)
    for way, values in (("`qlactors run` (CLI)", cli_ms), ("API request + nudge", api_ms)):
        result.add(f"{way} -> first instruction, p50", c.percentile(values, 50), "ms", b50,
                   "direct subprocess spawn, p50")
        result.add(f"{way} -> first instruction, p95", c.percentile(values, 95), "ms", b95,
                   "direct subprocess spawn, p95")
    result.details = {"runs": n, "cli_ms": [round(v, 2) for v in cli_ms],
                      "api_ms": [round(v, 2) for v in api_ms], "direct_ms": [round(v, 2) for v in base],
                      "machine": c.machine_notes()}
    return c.report(result, args.json)


if __name__ == "__main__":
    sys.exit(main())
