"""What the chaos tests do on a real cluster: add a task, request runs, and check every run ran once
and no actor failed."""

from __future__ import annotations

import re

from actor_harness import wait_until


# `begin`, the sleep, then a token unique to this execution, in the ledger and in the log.
JOB = 'echo begin; sleep {sleep}; t="$$-$(date +%s%N)"; echo "$t" >> {ledger}; echo "$t"'


LOG = re.compile(rb"begin\n(\d+-\d+)\n")


def _task(c, name: str, ledger, sleep: float, max_concurrent: int) -> None:
    c.cli("task", "add", name, "--max-concurrent", str(max_concurrent), "--",
          "sh", "-c", JOB.format(sleep=sleep, ledger=ledger))


def _request(c, task: str, n: int) -> list[str]:
    from qlactors.store.engine import Store
    from qlactors.store.repository import Repository

    store = Store(c.database_url)
    try:
        repo = Repository(store)
        return [repo.runs.request(task).run.id for _ in range(n)]
    finally:
        store.close()


def _count(c, sql: str, run_ids: list[str]) -> int:
    return c.sql(sql, run_ids)[0][0]


def _logs(c, run_ids: list[str]) -> dict[str, bytes]:
    rows = c.sql("SELECT run_id, string_agg(data, ''::bytea ORDER BY start_offset) FROM log_chunks "
                 "WHERE run_id = ANY(%s) GROUP BY run_id", run_ids)
    return {run_id: bytes(data) for run_id, data in rows}


def _assert_each_ran_once(c, run_ids: list[str], ledger, timeout: float) -> None:
    """Every run succeeded with exit 0 in attempt 1 (no attempt 2), its log is exactly its own
    `begin` + token, and the ledger holds each run's token once and nothing else."""
    states = c.wait_terminal(run_ids, timeout=timeout)
    assert {s["state"] for s in states.values()} == {"succeeded"}, \
        {r: s["state"] for r, s in states.items() if s["state"] != "succeeded"}
    attempts = c.sql("SELECT run_id, number, status, exit_code, error_code FROM run_attempts "
                     "WHERE run_id = ANY(%s) ORDER BY run_id", run_ids)
    assert attempts == [(r, 1, "succeeded", 0, None) for r in sorted(run_ids)]

    def logs_whole() -> bool:
        logs = _logs(c, run_ids)
        return len(logs) == len(run_ids) and all(LOG.fullmatch(v) for v in logs.values())

    wait_until(logs_whole, 60, "every run's whole log")
    tokens = {r: LOG.fullmatch(v).group(1).decode() for r, v in _logs(c, run_ids).items()}
    lines = ledger.read_text().splitlines()
    assert len(lines) == len(set(lines)), "a job ran twice"
    assert sorted(lines) == sorted(tokens.values()), "the ledger and the runs' logs differ"


def _assert_no_actor_failed(c, killed=()) -> None:
    """No actor of any process failed on the way (a restart is the Supervisor's last resort);
    `killed`: processes killed on purpose (nothing to judge in a log cut short)."""
    for proc in [p for p in [*c.replicas, *c.workers.values()] if p not in killed]:
        log = proc.log()
        assert "event=actor_failed" not in log and "Traceback" not in log, f"{proc.name}:\n{log[-4000:]}"


def _running(c, run_ids: list[str]) -> int:
    return _count(c, "SELECT count(*) FROM runs WHERE id = ANY(%s) AND status = 'running'", run_ids)
