"""The soak's job and its ledger: each job appends `start NS PGID FD1` and `end NS PGID FD1` to
the ledger file (NS its wall clock in ns, PGID its process group, FD1 where its output goes:
the attempt's log FIFO, whose name is the attempt id, in its worker's state directory
`state-NAME`) and writes `begin PGID` and `done PGID` to its log. `parse` turns the ledger's text back into executions (pure, unit-tested)."""

from __future__ import annotations

import re

from invariants import Execution

JOB = ('read -r _p _c _s _pp g _r < /proc/$$/stat; a=$(readlink /proc/$$/fd/1); '
       'echo "start $(date +%s%N) $g $a" >> {ledger}; echo "begin $g"; sleep {sleep}; '
       'echo "end $(date +%s%N) $g $a" >> {ledger}; echo "done $g"')
LINE = re.compile(r"^(start|end) (\d+) (\d+) (.*)$")
WORKER = re.compile(r"/state-([^/]+)/")  # the harness's state directory of each worker
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def parse(text: str) -> tuple[list[Execution], list[str]]:
    """The executions the ledger tells of, and its lines that name no attempt. Two starts of one
    attempt in one process group are two executions (the last one owns the end line)."""
    starts: dict[tuple[str, int], list[int]] = {}
    workers: dict[tuple[str, int], str] = {}
    ends: dict[tuple[str, int], int] = {}
    bad = []
    for line in text.splitlines():
        m = LINE.match(line)
        ids = UUID.findall(m.group(4)) if m else []
        if not ids:
            bad.append(line)
            continue
        key = (ids[-1], int(m.group(3)))
        worker = WORKER.search(m.group(4))
        if worker:
            workers[key] = worker.group(1)
        ms = int(m.group(2)) // 1_000_000
        if m.group(1) == "start":
            starts.setdefault(key, []).append(ms)
        else:
            ends[key] = ms
    executions = []
    for (attempt_id, pgid), times in starts.items():
        times = sorted(times)
        for i, ms in enumerate(times):
            end = ends.get((attempt_id, pgid)) if i == len(times) - 1 else None
            executions.append(Execution(attempt_id, ms, end, pgid, workers.get((attempt_id, pgid))))
    return executions, bad
