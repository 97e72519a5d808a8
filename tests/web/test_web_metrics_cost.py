"""What one `/metrics` scrape and one `/api/v1/status` read cost the database (issue 28): with
2,000 active runs the same as with 200, apart from the counts by state (one GROUP BY over the
status index); and `/metrics` builds no list of runs. Measured in SQLite virtual-machine steps
(a progress handler), not in time: the count is the same on any machine."""

from __future__ import annotations

from types import SimpleNamespace

from edge_harness import Home

COUNTS = "count(*)"  # the GROUP BY counts: one index entry per run, by design


def _admit(repo, total: int) -> None:
    from qlactors.store.intent.runs import _LIVE_TASK

    with repo.store.write() as conn:
        head = conn.execute(_LIVE_TASK, {"name": "t"}).first()
        for _ in range(total):
            repo.runs.admit_in(conn, head, head.current_revision)


class Steps:
    """SQLite VM steps (in tens) and rows fetched, per statement, on every connection of a store."""

    def __init__(self, repo) -> None:
        from sqlalchemy import event

        self.ticks, self.statements = 0, []
        event.listen(repo.store.engine, "connect",
                     lambda dbapi_conn, _rec: dbapi_conn.set_progress_handler(self._tick, 10))
        event.listen(repo.store.engine, "before_cursor_execute", self._before)
        repo.store.engine.dispose()  # connections made from now on are counted

    def _tick(self) -> int:
        self.ticks += 1
        return 0

    def _before(self, _conn, _cursor, statement, _params, _context, _many) -> None:
        self.statements.append([" ".join(statement.split()), self.ticks])

    def per_statement(self, since: int) -> dict[str, int]:
        """Steps (x10) of each statement run since `since`, counted up to the next one."""
        marks = self.statements[since:] + [["", self.ticks]]
        return {text: marks[i + 1][1] - ticks for i, (text, ticks) in enumerate(marks[:-1]) if text}


def _costs(home: Home, active: int) -> tuple[dict[str, int], dict[str, int], dict]:
    from qlactors.config.home import load
    from qlactors.store.repository import Repository
    from qlactors.web.api_status import status_report
    from qlactors.web.backend import EdgeBackend
    from qlactors.web.metrics import _scrape

    repo = Repository.open(f"sqlite:///{home.db_path}")
    try:
        _admit(repo, active)
        steps = Steps(repo)
        request = SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(
            backend=EdgeBackend(repo, load(str(home.path))))))
        _scrape(request)  # warm
        mark = len(steps.statements)
        scrape = _scrape(request)
        metrics = steps.per_statement(mark)
        mark = len(steps.statements)
        report = status_report(request)
        status = steps.per_statement(mark)
    finally:
        repo.close()
    assert f'qlactors_runs_active{{state="queued"}} {float(active)}'.encode() in scrape
    assert report["active_runs"] == {"queued": active} and len(report["active_run_list"]) == 20
    return metrics, status, report


def _beyond_counts(costs: dict[str, int]) -> int:
    return sum(n for text, n in costs.items() if COUNTS not in text)


def test_metrics_and_status_cost_the_same_with_2000_active_runs_as_with_200(tmp_path):
    found = {}
    for active in (200, 2000):
        home = Home(tmp_path / str(active))
        try:
            home.main("task", "add", "t", "--", "true")
            found[active] = _costs(home, active)
        finally:
            home.close()
    (m_small, s_small, few), (m_big, s_big, many) = found[200], found[2000]
    # The oldest 20 are listed either way; what grew is only the counts.
    assert [r["run_id"] for r in few["active_run_list"]] != [r["run_id"] for r in many["active_run_list"]]
    assert _beyond_counts(m_big) <= _beyond_counts(m_small) + 200, (m_small, m_big)
    assert _beyond_counts(s_big) <= _beyond_counts(s_small) + 200, (s_small, s_big)
    # `/metrics` lists no runs (it never showed them): no statement reads a run's attempt's pid.
    assert not [text for text in m_big if "run_attempts.pid" in text], m_big
    # Every statement that grows with the runs is a GROUP BY count.
    assert all("GROUP BY" in text for text in m_big if COUNTS in text)
