"""Why a task's runs would wait, or wait now, for a worker with its labels: the warning of
`task add/update`, the reason `show` and `status` give beside a queued run, and `run --wait`'s
one line (domain/labels.py decides; this reads the workers)."""

from __future__ import annotations

import argparse

from ..domain.labels import placement_wait, unplaced_warning
from ..store.repository import Repository

QUEUED = "queued"


def _workers(repo: Repository):
    from ..store.admin.workers import Workers

    return Workers(repo.store).list().workers


def serving(repo: Repository, args: argparse.Namespace) -> list[tuple[str, tuple[str, ...]]] | None:
    """The workers offers may go to now, with their labels; None on edge."""
    if args.cluster is None:
        return None
    return [(w.worker_id, w.labels) for w in _workers(repo) if w.serving]


def warn_unplaced(repo: Repository, args: argparse.Namespace, task: str, labels: tuple[str, ...]) -> str | None:
    """The warning for a task whose labels no known worker has (stderr; the command succeeds)."""
    if not labels:
        return None
    known = None if args.cluster is None else [(w.worker_id, w.labels) for w in _workers(repo)
                                               if w.session_id is not None]
    return unplaced_warning(task, labels, known)


def queued_reason(state: str, labels: tuple[str, ...], workers: list | None) -> str | None:
    """Why a run in `state` waits for a worker (None: it does not, or it is not queued)."""
    return placement_wait(labels, workers) if state == QUEUED else None


class PlacementNotice:
    """For `run --wait`: says once on stderr why no worker can take the queued run, if none can
    (checked at most every `every_s` seconds, a read of the workers each time)."""

    def __init__(self, repo: Repository, args: argparse.Namespace, run_id: str, every_s: float = 1.0) -> None:
        from ..store.intent.active_runs import required_labels

        self.repo, self.args, self.run_id, self.every_s = repo, args, run_id, every_s
        self.labels = required_labels(repo.store, run_id)
        self.said = False
        self.checked_at: float | None = None

    def line(self, state: str, now_s: float) -> str | None:
        """The line to say now, at most once."""
        if self.said or state != QUEUED:
            return None
        if self.checked_at is not None and now_s - self.checked_at < self.every_s:
            return None
        self.checked_at = now_s
        why = placement_wait(self.labels, serving(self.repo, self.args))
        if why is None:
            return None
        self.said = True
        return f"run {self.run_id} stays queued: {why}; still waiting"


def active_with_reasons(repo: Repository, workers: list | None):
    """`status`: the oldest active runs and, by run id, why each queued one waits for a worker
    (`workers`: the serving workers with their labels, None on edge)."""
    from ..store.intent.active_runs import active_runs

    active = active_runs(repo.store)
    return active, {r.run_id: queued_reason(r.state, r.labels, workers) for r in active}
