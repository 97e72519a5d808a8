#!/usr/bin/env python3
"""Run every qlactors benchmark (each in its own process) and print a summary table.

    python3 benchmarks/run_all.py            # full runs (about 5 minutes on 2 cores)
    python3 benchmarks/run_all.py --quick    # smaller runs (about 2 minutes)
    python3 benchmarks/run_all.py --only idle,launcher --json results.json

Exit status: 0 when every judged figure PASSes, 1 when one FAILs, 2 when a benchmark crashed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = ("throughput", "latency", "idle", "launcher", "disk", "recovery", "cron", "cluster", "control_plane", "web",
              "web_status", "renewals", "host_death", "recovery_cluster")
TIMEOUT_S = {"throughput": 900, "latency": 600, "idle": 300, "launcher": 300, "disk": 600, "recovery": 900,
             "cron": 900, "cluster": 1200, "control_plane": 900, "renewals": 600, "host_death": 600,
             "recovery_cluster": 600, "web": 600, "web_status": 300}

sys.path.insert(0, str(HERE))
import _common as c  # noqa: E402


def run_one(name: str, quick: bool, out_dir: Path) -> tuple[dict | None, str, float]:
    json_path = out_dir / f"{name}.json"
    argv = [sys.executable, str(HERE / f"bench_{name}.py"), "--json", str(json_path)]
    if quick:
        argv.append("--quick")
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S[name])
    except subprocess.TimeoutExpired:
        proc.terminate()  # by pid: its atexit handler stops what it started
        try:
            output, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        output += f"\n(run_all: {name} timed out after {TIMEOUT_S[name]} s)"
    elapsed = time.monotonic() - start
    data = json.loads(json_path.read_text()) if json_path.exists() else None
    return data, output, elapsed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    p.add_argument("--only", help=f"comma-separated subset of {','.join(BENCHMARKS)}")
    p.add_argument("--json", metavar="FILE", help="write every result (and the machine notes) as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="print each benchmark's full output")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.only.split(",")] if args.only else list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        p.error(f"unknown benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}")

    results, crashed = {}, []
    with tempfile.TemporaryDirectory(prefix="qlbench-all-") as tmp:
        for name in names:
            print(f"-- {name}{' (quick)' if args.quick else ''} ...", flush=True)
            data, output, elapsed = run_one(name, args.quick, Path(tmp))
            if args.verbose or data is None:
                print(output)
            if data is None:
                crashed.append(name)
                continue
            data["elapsed_s"] = round(elapsed, 1)
            results[name] = data
            print(f"   done in {elapsed:.0f} s", flush=True)

    rows = [("benchmark", "figure", "value", "baseline", "ratio", "requirement", "verdict")]
    for name, data in results.items():
        for m in data["metrics"]:
            rows.append((name, m["name"][:78], f"{c.fmt(m['value'])} {m['unit']}",
                         "-" if m["baseline"] is None else f"{c.fmt(m['baseline'])} {m['unit']}",
                         "-" if m["ratio"] is None else c.fmt(m["ratio"]), m["requirement"] or "-",
                         m["verdict"]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print()
    for i, row in enumerate(rows):
        print("  ".join(cell.ljust(widths[j]) for j, cell in enumerate(row)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    notes = c.machine_notes()
    print(f"\nmachine: {notes['cpus']} cpus, load {notes['loadavg_1m']}, kernel {notes['kernel']}, "
          f"python {notes['python']}{'; QUICK mode' if args.quick else ''}")
    for name in crashed:
        print(f"CRASHED: {name} (output above)")
    if args.json:
        Path(args.json).write_text(json.dumps({"quick": args.quick, "machine": notes, "results": results,
                                               "crashed": crashed}, indent=2, default=str))
    failed = any(m["verdict"] == "FAIL" for d in results.values() for m in d["metrics"])
    return 2 if crashed else (1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
