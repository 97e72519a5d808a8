#!/usr/bin/env python3
"""Idle runtime: RSS, CPU time and wake-ups of `qlactors edge` over 60 s (15 s quick) of idleness.

The runtime: the default `edge` profile on a fresh home with one task and no runs, started,
waited for (`event=edge_started`), then left 3 s to settle before the window opens. Over the
window, from /proc only:
  * RSS: VmRSS of /proc/PID/status, sampled every second (the maximum is reported);
  * CPU: utime + stime of /proc/PID/stat (the whole process, every thread), window delta,
    cross-checked with the sum of /proc/PID/task/*/schedstat run times (ns);
  * wake-ups: voluntary + nonvoluntary context switches summed over /proc/PID/task/*/status,
    window delta, per second (each switch is a thread going to sleep or being preempted: the
    wake-up count of an idle thread); per-thread counts are kept in the JSON details;
  * disk: write_bytes of /proc/PID/io over the window.
Baselines, measured the same way in the same window (they run side by side with the runtime):
  * `python3 -c "import time; time.sleep(N)"` (a bare sleeping interpreter);
  * a bare interpreter that imports sqlalchemy, zmq, pykka (and qlactors.profiles.edge) and sleeps:
    the floor that the runtime's own state sits on.
Requirements: RSS at most 56 MiB, CPU under 1% of one core, at most 2 wake-ups per second.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402

IMPORTS = "import sqlalchemy, zmq, pykka, qlactors.profiles.edge, time; time.sleep({n})"


class Sampler:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.rss_max = 0
        self.rss_samples: list[int] = []

    def begin(self) -> None:
        self.t0 = time.monotonic()
        self.cpu0 = c.cpu_seconds(self.pid)
        self.threads0 = c.thread_counters(self.pid)
        self.io0 = c.io_counters(self.pid)
        self.sample()

    def sample(self) -> None:
        rss = c.rss_kib(self.pid)
        self.rss_samples.append(rss)
        self.rss_max = max(self.rss_max, rss)

    def end(self) -> dict:
        self.sample()
        elapsed = time.monotonic() - self.t0
        cpu = c.cpu_seconds(self.pid) - self.cpu0
        threads1 = c.thread_counters(self.pid)
        io1 = c.io_counters(self.pid)
        per_thread = {}
        switches = run_ns = 0
        for tid, t1 in threads1.items():
            t0 = self.threads0.get(tid, {"voluntary": 0, "nonvoluntary": 0, "run_ns": 0})
            d = (t1["voluntary"] - t0["voluntary"]) + (t1["nonvoluntary"] - t0["nonvoluntary"])
            r = t1["run_ns"] - t0["run_ns"]
            switches += d
            run_ns += r
            per_thread[tid] = {"comm": t1["comm"], "switches": d, "run_ms": round(r / 1e6, 2)}
        return {"seconds": round(elapsed, 2), "rss_kib_max": self.rss_max,
                "rss_kib_last": self.rss_samples[-1], "cpu_s": round(cpu, 3),
                "cpu_pct": 100 * cpu / elapsed, "schedstat_cpu_pct": 100 * run_ns / 1e9 / elapsed,
                "wakeups": switches, "wakeups_per_s": switches / elapsed,
                "threads": len(threads1), "threads_at_start": len(self.threads0),
                "write_bytes": io1.get("write_bytes", 0) - self.io0.get("write_bytes", 0),
                "per_thread": per_thread}


def main(argv: list[str] | None = None) -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, help="window length (default 60, quick 15)")
    args = p.parse_args(argv)
    window = args.seconds or (15.0 if args.quick else 60.0)
    result = c.Result("idle", args.quick)

    home = c.temp_home("idle", args.keep)
    c.add_task(home, "noop", ["true"])
    edge = c.Edge(home).start()
    sleep_n = int(window + 30)
    bare = c.track(subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({sleep_n})"]))
    heavy = c.track(subprocess.Popen([sys.executable, "-c", IMPORTS.format(n=sleep_n)]))
    try:
        up_s = edge.wait_up()
        time.sleep(3.0)
        samplers = {name: Sampler(pid) for name, pid in
                    (("edge", edge.pid), ("bare", bare.pid), ("imports", heavy.pid))}
        for s in samplers.values():
            s.begin()
        deadline = time.monotonic() + window
        while time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            for s in samplers.values():
                s.sample()
        stats = {name: s.end() for name, s in samplers.items()}
    finally:
        edge.stop()
        for proc in (bare, heavy):
            proc.kill()
            proc.wait(5)
            c.untrack(proc)

    e, b, h = stats["edge"], stats["bare"], stats["imports"]
    result.add("idle RSS (max over window)", c.mib(e["rss_kib_max"]), "MiB", c.mib(h["rss_kib_max"]),
               "interpreter importing sqlalchemy+zmq+pykka+qlactors.profiles.edge", requirement="<= 56 MiB",
               passed=c.mib(e["rss_kib_max"]) <= 56)
    result.add("idle RSS vs bare sleeping python", c.mib(e["rss_kib_max"]), "MiB", c.mib(b["rss_kib_max"]),
               "python3 -c time.sleep")
    result.add("idle CPU (utime+stime, all threads)", e["cpu_pct"], "% of one core", b["cpu_pct"],
               "python3 -c time.sleep", requirement="< 1%", passed=e["cpu_pct"] < 1.0,
               note=f"schedstat cross-check: {e['schedstat_cpu_pct']:.3f}%")
    result.add("idle wake-ups (context switches, all threads)", e["wakeups_per_s"], "per s",
               h["wakeups_per_s"], "interpreter importing sqlalchemy+zmq+pykka+qlactors.profiles.edge",
               requirement="<= 2 per s", passed=e["wakeups_per_s"] <= 2.0,
               note=f"{e['threads']} threads; busiest: " + ", ".join(
                   f"{v['comm']}/{tid}={v['switches']}" for tid, v in sorted(
                       e["per_thread"].items(), key=lambda kv: -kv[1]["switches"])[:4]))
    result.add("idle disk writes (write_bytes)", e["write_bytes"] / window, "bytes/s",
               b["write_bytes"] / window, "python3 -c time.sleep")
    result.details = {"window_s": window, "edge_up_s": round(up_s, 3), "stats": stats,
                      "machine": c.machine_notes()}
    return c.report(result, args.json)


if __name__ == "__main__":
    sys.exit(main())
