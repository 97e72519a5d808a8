"""The log cap end to end through `qlactors edge` (SEMANTICS.md §4 step 4, §7, §11).

The issue: "Output beyond the log cap: the job completes with its own exit code, the log holds
exactly the cap, log_dropped_bytes records the rest; a job that writes while being stopped never
gets SIGPIPE." Every case runs under the launcher's default shell and under busybox sh
(`[launcher] shell = "/bin/busybox sh"`), since the launcher must behave the same under both.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from edge_harness import Home, wait_until
from requires import unavailable

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux /proc")

CAP = 65536  # the smallest cap a config may set
DEADLINE_S = 10.0
BUSYBOX = "/bin/busybox"
SIGPIPE_STATUS = 128 + signal.SIGPIPE  # 141: what a job killed by SIGPIPE would report
TOTAL = 200_000
LINE = b"0123456789abcde\n"
WRITERS = {  # task name -> (job, the exit status its receipt must carry after a cancel)
    "writer-plain": ("while :; do echo x; done", 128 + signal.SIGTERM),
    "writer-trap": ('trap "echo got-term >&2; exit 77" TERM; while :; do echo x; done', 77),
}
TASKS = {
    "big": ["--", f"yes {LINE.decode().strip()} | head -c {TOTAL}; exit 9"],
    "small": ["--", "printf 'out\\n'; echo err >&2; exit 3"],
    **{name: ["--stop-grace", "5", "--", job] for name, (job, _) in WRITERS.items()},
}


@pytest.fixture(scope="module", params=["/bin/sh", f"{BUSYBOX} sh"], ids=["sh", "busybox"])
def shell(request):
    if request.param.startswith(BUSYBOX) and not os.access(BUSYBOX, os.X_OK):
        unavailable(BUSYBOX, "not executable (apt-get install busybox)")
    return request.param


@pytest.fixture(scope="module")
def edge(shell, tmp_path_factory):
    """One home with the cap and the shell configured, and a running `qlactors edge`; on the way
    out the runtime and every launcher group it recorded are stopped, by pid."""
    home = Home(tmp_path_factory.mktemp("logcap"),
                config=f'[runtime]\nlog_cap_bytes = {CAP}\nslots = 4\n\n[launcher]\nshell = "{shell}"\n')
    try:
        home.add_tasks(*((name, *args) for name, args in TASKS.items()))
        home.start_edge()
        yield home
    finally:
        home.close()


def _logs_and_show(edge: Home, run_id: str) -> tuple[bytes, dict]:
    return tuple(edge.gather(lambda: edge.logs(run_id), lambda: edge.show(run_id)))


def test_output_beyond_the_cap_keeps_exactly_the_cap_counts_the_rest_and_keeps_the_exit_code(edge):
    waited = edge.ql("run", "big", "--wait")
    run_id = waited.stdout.strip()
    assert waited.returncode == 9, (waited, edge.edge_logs())  # the job's own exit code

    logs, run = _logs_and_show(edge, run_id)
    expected = (LINE * (TOTAL // len(LINE) + 1))[:TOTAL]
    assert len(logs) == CAP
    assert logs == expected[:CAP]

    [attempt] = run["attempts"]
    assert run["state"] == "failed" and attempt["state"] == "failed", run
    assert attempt["exit_code"] == 9
    assert attempt["log_dropped_bytes"] == TOTAL - CAP
    assert attempt["signal"] is None


def test_a_small_job_runs_end_to_end_with_its_output_and_exit_code(edge):
    waited = edge.ql("run", "small", "--wait")
    run_id = waited.stdout.strip()
    assert waited.returncode == 3, (waited, edge.edge_logs())
    logs, run = _logs_and_show(edge, run_id)
    assert logs == b"out\nerr\n"
    [attempt] = run["attempts"]
    assert attempt["exit_code"] == 3
    assert attempt["log_dropped_bytes"] == 0  # a cap applied and nothing was dropped


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_job_writing_while_it_is_cancelled_ends_by_term_never_by_sigpipe(edge, shell, name):
    expected_exit = WRITERS[name][1]
    run_id = edge.run(name)
    row = edge.wait_running(run_id)  # the launcher's identity is recorded: close() ends its group

    # The launcher runs under the configured shell.
    argv0 = Path(f"/proc/{row['pid']}/cmdline").read_bytes().split(b"\0")[0].decode()
    assert argv0 == shell.split()[0], argv0

    # Cancel once the cap is reached: the reader is then draining and counting, the job still writing.
    log = edge.log_path(run_id)
    wait_until(lambda: log.exists() and log.stat().st_size >= CAP, DEADLINE_S,
               lambda: f"the log to reach the cap\n{edge.edge_logs()}")
    edge.ok("cancel", run_id)
    edge.wait_terminal(run_id)

    data, run = _logs_and_show(edge, run_id)
    [attempt] = run["attempts"]
    what = (run, edge.edge_logs())
    assert run["state"] == "cancelled", what
    assert attempt["state"] == "cancelled", what
    # A receipt landed (the launcher survives TERM to publish it) and names TERM, not SIGPIPE.
    assert attempt["exit_code"] != SIGPIPE_STATUS, what
    assert attempt["exit_code"] == expected_exit, what
    assert attempt["log_dropped_bytes"] is not None and attempt["log_dropped_bytes"] > 0, what
    assert len(data) == CAP
    assert data == b"x\n" * (CAP // 2)
