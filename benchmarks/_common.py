"""Shared helpers of the qlactors benchmarks: temporary homes, the edge process, /proc readers,
and the result format that `run_all.py` collects.

Plain stdlib (plus qlactors itself where a script needs its API). Every process a benchmark
starts is recorded here and stopped by its own pid (never by name); every wait is bounded.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024

# Every child we start, by pid, so an interrupted benchmark still cleans up after itself.
_STARTED: dict[int, subprocess.Popen] = {}
_TEMP_DIRS: list[Path] = []


def qlactors_argv() -> list[str]:
    """The `qlactors` console script when installed, else `python -m qlactors`."""
    exe = shutil.which("qlactors")
    return [exe] if exe else [sys.executable, "-m", "qlactors"]


# -- command line and results -------------------------------------------------------------------

def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="a smaller, faster run")
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON (used by run_all.py)")
    p.add_argument("--keep", action="store_true", help="keep the temporary home(s) for inspection")
    return p


@dataclass
class Metric:
    """One measured figure, its same-run baseline, the ratio, and the requirement (if any)."""

    name: str
    value: float
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    requirement: str = ""  # e.g. "<= 56 MiB"; empty: reported, not judged
    passed: bool | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.baseline is None or self.baseline == 0:
            return None
        return self.value / self.baseline


@dataclass
class Result:
    benchmark: str
    quick: bool
    metrics: list[Metric] = field(default_factory=list)
    details: dict = field(default_factory=dict)

    def add(self, *args, **kwargs) -> Metric:
        metric = Metric(*args, **kwargs)
        self.metrics.append(metric)
        return metric


def fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}" if abs(value) < 1 else f"{value:.{digits}f}".rstrip("0").rstrip(".")


def verdict(metric: Metric) -> str:
    if metric.passed is None:
        return "info"
    return "PASS" if metric.passed else "FAIL"


def report(result: Result, json_path: str | None) -> int:
    """Print every figure with its baseline, ratio and verdict; exit status 1 if one FAILs."""
    print(f"\n== {result.benchmark}{' (quick)' if result.quick else ''} ==")
    for m in result.metrics:
        ratio = m.ratio
        line = f"{m.name}: {fmt(m.value)} {m.unit}"
        if m.baseline is not None:
            line += f" | baseline ({m.baseline_name}): {fmt(m.baseline)} {m.unit}"
            line += f" | ratio: {fmt(ratio) if ratio is not None else 'n/a (baseline 0)'}"
        if m.requirement:
            line += f" | requirement: {m.requirement}"
        line += f" | {verdict(m)}"
        print(line)
        if m.note:
            print(f"    note: {m.note}")
    if json_path:
        data = asdict(result)
        for m, d in zip(result.metrics, data["metrics"]):
            d["ratio"] = m.ratio
            d["verdict"] = verdict(m)
        Path(json_path).write_text(json.dumps(data, indent=2, default=str))
    return 1 if any(m.passed is False for m in result.metrics) else 0


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (p50 of 30 values is the 15th smallest)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), int(-(-pct * len(ordered) // 100))))
    return ordered[rank - 1]


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def machine_notes() -> dict:
    load = os.getloadavg()
    return {"cpus": os.cpu_count(), "loadavg_1m": round(load[0], 2), "kernel": os.uname().release,
            "python": sys.version.split()[0]}


# -- homes and processes --------------------------------------------------------------------------

def temp_home(prefix: str, keep: bool = False) -> Path:
    """A fresh directory under $TMPDIR (ext4 here, not tmpfs: write_bytes needs a real disk)."""
    root = Path(tempfile.mkdtemp(prefix=f"qlbench-{prefix}-"))
    if not keep:
        _TEMP_DIRS.append(root)
    return root / "home"


def write_config(home: Path, *, profile: str | None = None, runtime: dict | None = None,
                 shell: str | None = None) -> Path:
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    lines = []
    if profile:
        lines.append(f'profile = "{profile}"')
    # Benchmarks count finished runs in the database: retention (edge keeps 100 per task) must
    # not retire them under the count, unless a benchmark sets its own bound.
    runtime = {"retention_max_runs": 1_000_000, **(runtime or {})}
    lines.append("[runtime]")
    lines += [f"{k} = {v}" for k, v in runtime.items()]
    if shell:
        lines += ["[launcher]", f'shell = "{shell}"']
    path = home / "qlactors.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def cli(home: Path, *args: str, timeout: float = 60) -> str:
    out = subprocess.run([*qlactors_argv(), "--home", str(home), *args], capture_output=True, text=True,
                         timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"qlactors {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout


def add_task(home: Path, name: str, words: list[str], *, max_concurrent: int = 1) -> None:
    cli(home, "task", "add", name, "--max-concurrent", str(max_concurrent), "--", *words)


def database_path(home: Path) -> Path:
    return home / "qlactors.db"


def database_url(home: Path) -> str:
    return f"sqlite:///{database_path(home)}"


def run_counts(home: Path) -> dict[str, int]:
    """Runs per status, read straight from the SQLite file (a short read transaction)."""
    conn = sqlite3.connect(f"file:{database_path(home)}?mode=ro", uri=True, timeout=5)
    try:
        return dict(conn.execute("SELECT status, COUNT(*) FROM runs GROUP BY status").fetchall())
    finally:
        conn.close()


TERMINAL = ("succeeded", "failed", "cancelled", "timed_out", "lost")


def terminal_count(counts: dict[str, int]) -> int:
    return sum(counts.get(s, 0) for s in TERMINAL)


def wait_until(predicate: Callable[[], bool], timeout: float, poll: float = 0.02, what: str = "") -> float:
    """Poll `predicate` until true; returns the elapsed seconds, raises TimeoutError past `timeout`."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what or predicate}")
        time.sleep(poll)


class Edge:
    """One `qlactors --home H edge` process: started, watched through its stderr log, stopped by pid."""

    def __init__(self, home: Path, *extra: str, log_name: str = "edge.log") -> None:
        self.home = home
        self.extra = extra
        self.log_path = home.parent / log_name
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0  # time.monotonic() just before the spawn

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> "Edge":
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen([*qlactors_argv(), "--home", str(self.home), "edge", *self.extra],
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        _STARTED[self.proc.pid] = self.proc
        return self

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for_line(self, needle: str, timeout: float = 60, after: int = 0) -> tuple[float, str]:
        """Wait until the log holds `needle` (past byte `after`); returns (seconds since start, line)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_text()[after:]
            for line in text.splitlines():
                if needle in line:
                    return time.monotonic() - self.started_at, line
            if self.proc.poll() is not None:
                raise RuntimeError(f"edge exited ({self.proc.returncode}) before {needle!r}:\n{text[-2000:]}")
            time.sleep(0.005)
        raise TimeoutError(f"edge did not log {needle!r} within {timeout:g} s")

    def wait_up(self, timeout: float = 60) -> float:
        return self.wait_for_line("event=edge_started", timeout)[0]

    def stop(self, timeout: float = 15) -> int | None:
        """SIGTERM by pid, then SIGKILL by pid if it has not exited within `timeout`."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait(5)
        _STARTED.pop(self.proc.pid, None)
        return rc

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        _STARTED.pop(self.proc.pid, None)


def track(proc: subprocess.Popen) -> subprocess.Popen:
    _STARTED[proc.pid] = proc
    return proc


def untrack(proc: subprocess.Popen) -> None:
    _STARTED.pop(proc.pid, None)


def _cleanup() -> None:
    for pid, proc in list(_STARTED.items()):
        if proc.poll() is None:
            try:
                proc.kill()  # by pid: our own child only
                proc.wait(5)
            except Exception:
                pass
    for root in _TEMP_DIRS:
        shutil.rmtree(root, ignore_errors=True)


atexit.register(_cleanup)


def _on_signal(signum, _frame):
    raise SystemExit(128 + signum)


signal.signal(signal.SIGTERM, _on_signal)


# -- /proc readers ----------------------------------------------------------------------------

def read_kv(path: str) -> dict[str, int]:
    """`Key: 123 kB` files (status, smaps_rollup, io) -> {key: first integer}."""
    out: dict[str, int] = {}
    with open(path) as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            words = rest.split()
            if words and words[0].isdigit():
                out[key.strip()] = int(words[0])
    return out


def rss_kib(pid: int) -> int:
    return read_kv(f"/proc/{pid}/status").get("VmRSS", 0)


def smaps(pid: int) -> dict[str, int]:
    """Pss, Rss, Private_* (KiB) from /proc/PID/smaps_rollup."""
    return read_kv(f"/proc/{pid}/smaps_rollup")


def io_counters(pid: int | str = "self") -> dict[str, int]:
    return read_kv(f"/proc/{pid}/io")


def stat_fields(pid: int | str) -> list[str]:
    """/proc/PID/stat fields after the comm, numbered so that index 0 is field 3 (state)."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        text = fh.read().decode("utf-8", "replace")
    return text.rpartition(")")[2].split()


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (every thread), from /proc/PID/stat fields 14 and 15."""
    f = stat_fields(pid)
    return (int(f[11]) + int(f[12])) / CLK_TCK


def children_cpu_seconds(pid: int) -> float:
    """cutime + cstime: CPU of the children the process has reaped (fields 16 and 17)."""
    f = stat_fields(pid)
    return (int(f[13]) + int(f[14])) / CLK_TCK


def threads(pid: int) -> list[str]:
    try:
        return sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except FileNotFoundError:
        return []


def thread_counters(pid: int) -> dict[str, dict]:
    """Per thread: name, context switches (voluntary + involuntary) and run time in ns (schedstat)."""
    out = {}
    for tid in threads(pid):
        base = f"/proc/{pid}/task/{tid}"
        try:
            status = read_kv(f"{base}/status")
            with open(f"{base}/comm") as fh:
                comm = fh.read().strip()
            with open(f"{base}/schedstat") as fh:
                run_ns = int(fh.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[tid] = {"comm": comm, "voluntary": status.get("voluntary_ctxt_switches", 0),
                    "nonvoluntary": status.get("nonvoluntary_ctxt_switches", 0), "run_ns": run_ns}
    return out


def all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [w.decode("utf-8", "replace") for w in fh.read().split(b"\0") if w]
    except (FileNotFoundError, ProcessLookupError):
        return []


def ppid_of(pid: int) -> int | None:
    try:
        return int(stat_fields(pid)[1])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


def pgid_of(pid: int) -> int | None:
    try:
        return int(stat_fields(pid)[2])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


def group_members(pgid: int) -> list[int]:
    return [pid for pid in all_pids() if pgid_of(pid) == pgid]


def launchers_of(runtime_pid: int) -> list[int]:
    """Children of the runtime that run launcher.sh."""
    return [pid for pid in all_pids()
            if ppid_of(pid) == runtime_pid and any(w.endswith("launcher.sh") for w in cmdline(pid))]


def mib(kib: float) -> float:
    return kib / 1024
