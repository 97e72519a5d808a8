"""Web: `/metrics`, the Prometheus text format (`prometheus_client`), from one bounded read of the
store per scrape (store/metrics_reads.py). Finished runs are counters that survive retention:
they come from `run_outcome_counts`, written in each run's terminal transition, never from
counting the runs that are left."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ..domain.metrics import DURATION_BUCKETS_S
from ..domain.states import RUN_TERMINAL, RunStatus
from ..store.metrics_reads import Figures, read_figures
from .api_status import status_report
from .requests import backend, blocking


FINISHED_STATES = [s.value for s in RunStatus if s in RUN_TERMINAL]
ACTIVE_STATES = [s.value for s in RunStatus if s not in RUN_TERMINAL]


def families(figures: Figures, *, cluster: bool) -> list:
    """The metric families of one scrape. Each task's finished and lost counters exist from the
    first scrape, at 0 (a rate over them is defined at once)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    finished = CounterMetricFamily("qlactors_runs_finished", "Runs that reached a terminal state, by task and state",
                                   labels=["task", "state"])
    duration = HistogramMetricFamily("qlactors_run_duration_seconds",
                                     "Run time of finished runs that started (start to end), by task and state",
                                     labels=["task", "state"])
    lost = CounterMetricFamily("qlactors_runs_lost", "Runs that became lost (a recovery outcome: each is then "
                               "retried or ends failed), by task", labels=["task"])
    counts = {(f.task, f.state): f.count for f in figures.finished}
    for task in sorted(set(figures.task_names) | {f.task for f in figures.finished}):
        lost.add_metric([task], counts.get((task, "lost"), 0))
        for state in FINISHED_STATES:
            finished.add_metric([task, state], counts.get((task, state), 0))
    for f in figures.finished:
        if f.state == "lost":
            continue
        buckets = [(str(float(b)), n) for b, n in zip(DURATION_BUCKETS_S, f.buckets)] + [("+Inf", f.timed)]
        duration.add_metric([f.task, f.state], buckets, f.duration_ms_sum / 1000)
    oldest = GaugeMetricFamily("qlactors_oldest_queued_age_seconds", "Age of the oldest queued run (0: none)",
                               value=0 if figures.oldest_queued_at_ms is None
                               else max(0, figures.now_ms - figures.oldest_queued_at_ms) / 1000)
    late = GaugeMetricFamily("qlactors_cron_lateness_seconds",
                             "How far the most overdue enabled schedule's next fire is behind now (0: none)",
                             value=figures.cron_late_ms / 1000)
    found = [finished, duration, lost, oldest, late]
    if cluster:  # edge's one local session is no worker's
        sessions = GaugeMetricFamily("qlactors_worker_sessions", "Worker sessions by state (cluster)",
                                     labels=["state"])
        for state, count in sorted(figures.sessions.items()):
            sessions.add_metric([state], count)
        found.append(sessions)
    outbox = GaugeMetricFamily("qlactors_notifications", "Notification outbox rows by status", labels=["status"])
    for status, count in sorted(figures.notifications.items()):
        outbox.add_metric([status], count)
    return found + [outbox]


def status_families(report: dict) -> list:
    """What `status` says that a dashboard watches: the runs not finished, by state, and how many
    wait queued; is the runtime (edge) or a replica (cluster) up; recoveries waiting for a verdict;
    quarantined receipts (edge)."""
    from prometheus_client.core import GaugeMetricFamily

    active = GaugeMetricFamily("qlactors_runs_active", "Runs not finished, by state (every one, 0 included)",
                               labels=["state"])
    for state in ACTIVE_STATES:
        active.add_metric([state], report["active_runs"].get(state, 0))
    queued = GaugeMetricFamily("qlactors_queue_depth", "Runs waiting queued",
                               value=report["active_runs"].get("queued", 0))
    found = [active, queued, GaugeMetricFamily("qlactors_up", "1 when the edge runtime, or at least one control replica, is up",
                               value=1 if report["up"] else 0),
             GaugeMetricFamily("qlactors_recoveries_waiting", "Attempts whose recovery waits for a verdict",
                               value=len(report["unresolved_recoveries"]))]
    if "quarantined_receipts" in report:
        found.append(GaugeMetricFamily("qlactors_quarantined_receipts", "Receipt files set aside as unreadable",
                                       value=report["quarantined_receipts"]))
    if "replicas" in report:
        found.append(GaugeMetricFamily("qlactors_replicas_up", "Control replicas up",
                                       value=sum(1 for r in report["replicas"] if r.get("up"))))
    return found


def _scrape(request: Request) -> bytes:
    from prometheus_client.exposition import generate_latest

    items = families(read_figures(backend(request).repo.store), cluster=backend(request).profile == "cluster") \
        + status_families(status_report(request, listed=False))

    class _Once:  # a registry of one collection: generate_latest asks it once
        def collect(self):
            return items

    return generate_latest(_Once())  # type: ignore[arg-type]


async def metrics(request: Request) -> Response:
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    return Response(await blocking(_scrape, request), media_type=CONTENT_TYPE_LATEST)
