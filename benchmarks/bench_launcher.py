#!/usr/bin/env python3
"""Launcher tree memory: PSS and RSS of one launcher's process group while its job sleeps.

For each shell (dash as /bin/sh, and `/bin/busybox sh` via `[launcher] shell`), a fresh home on
the default `edge` profile (so the log cap, and with it the FIFO reader, is on), a task
`sleep 30`, one run. Once the job runs, the launcher is found among the runtime's children
(its argv ends in launcher.sh), and every process of its process group is read from
/proc/PID/smaps_rollup: that is the launcher tree (the job, `sleep`, runs in a process group of
its own below the launcher, and is not counted).
SEMANTICS.md §11: the tree's memory is the sum of PSS (shared libc pages are not its cost).
Private (Private_Clean + Private_Dirty, the memory that would be freed if the tree exited) and
RSS are reported too. Samples: 3 runs per shell (quick: 1), median of the sums.
Baseline (same run): PSS of a bare `sleep 30` started from this process.
Requirement: the launcher tree at most 2 MiB PSS.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402

SHELLS = (("dash", None), ("busybox", "/bin/busybox sh"))


def tree_of(edge_pid: int, timeout: float = 20) -> tuple[int, list[int], int]:
    """(launcher pid, tree pids without the job, job pid), once the job (`sleep`) runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for launcher in c.launchers_of(edge_pid):
            jobs = [p for p in c.all_pids()
                    if c.ppid_of(p) == launcher and c.cmdline(p)[:1] == ["sleep"]]
            if jobs and len(c.group_members(launcher)) > 1:
                time.sleep(0.3)  # let the reader's `dd` settle into its read
                members = c.group_members(launcher)
                return launcher, [p for p in members if p != jobs[0]], jobs[0]
        time.sleep(0.05)
    raise TimeoutError("no launcher with a running job appeared")


def measure(pids: list[int]) -> dict:
    total = {"Pss": 0, "Rss": 0, "Private": 0}
    procs = []
    for pid in pids:
        s = c.smaps(pid)
        private = s.get("Private_Clean", 0) + s.get("Private_Dirty", 0)
        total["Pss"] += s.get("Pss", 0)
        total["Rss"] += s.get("Rss", 0)
        total["Private"] += private
        procs.append({"pid": pid, "argv": " ".join(c.cmdline(pid))[:80], "pss_kib": s.get("Pss", 0),
                      "rss_kib": s.get("Rss", 0), "private_kib": private})
    return {**total, "processes": procs}


def one_shell(label: str, shell: str | None, samples: int, keep: bool) -> list[dict]:
    from qlactors.runtime.home import nudge
    from qlactors.store.repository import Repository

    home = c.temp_home(f"launcher-{label}", keep)
    if shell:
        c.write_config(home, shell=shell)
    c.add_task(home, "sleeper", ["sleep", "30"])
    edge = c.Edge(home).start()
    out = []
    try:
        edge.wait_up()
        repo = Repository.open(c.database_url(home))
        try:
            for _ in range(samples):
                run_id = repo.runs.request("sleeper").run.id
                nudge(home)
                launcher, tree, job = tree_of(edge.pid)
                m = measure(tree)
                m["job"] = measure([job])
                m["launcher_argv"] = " ".join(c.cmdline(launcher))[:120]
                out.append(m)
                repo.runs.cancel(run_id)  # stops the group by identity (TERM, then KILL)
                nudge(home)
                c.wait_until(lambda: repo.runs.get(run_id).state in c.TERMINAL, 30, what="cancel")
        finally:
            repo.close()
    finally:
        edge.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, help="runs per shell (default 3, quick 1)")
    args = p.parse_args(argv)
    samples = args.samples or (1 if args.quick else 3)
    result = c.Result("launcher", args.quick)

    sleeper = c.track(subprocess.Popen(["sleep", "60"]))
    try:
        time.sleep(0.3)
        base = c.smaps(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait(5)
        c.untrack(sleeper)
    base_pss = base["Pss"]
    details = {"bare_sleep": base, "machine": c.machine_notes()}
    for label, shell in SHELLS:
        if shell and not os.access(shell.split()[0], os.X_OK):
            print(f"skipping {label}: {shell} is not installed")
            continue
        data = one_shell(label, shell, samples, args.keep)
        details[label] = data
        pss = c.median(d["Pss"] for d in data)
        rss = c.median(d["Rss"] for d in data)
        private = c.median(d["Private"] for d in data)
        n = len(data[0]["processes"])
        result.add(f"{label} launcher tree PSS ({n} processes, job excluded)", c.mib(pss), "MiB",
                   c.mib(base_pss), "bare `sleep` PSS", requirement="<= 2 MiB", passed=c.mib(pss) <= 2.0,
                   note="; ".join(f"{q['argv'][:40]!r} pss={q['pss_kib']}k" for q in data[0]["processes"]))
        result.add(f"{label} launcher tree Private (clean+dirty)", c.mib(private), "MiB",
                   c.mib(base.get("Private_Clean", 0) + base.get("Private_Dirty", 0)), "bare `sleep` Private")
        result.add(f"{label} launcher tree RSS", c.mib(rss), "MiB", c.mib(base["Rss"]), "bare `sleep` RSS")
    result.details = details
    return c.report(result, args.json)


if __name__ == "__main__":
    sys.exit(main())
