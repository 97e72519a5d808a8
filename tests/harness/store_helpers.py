"""Helpers the store and actor tests share: a task spec, a fresh token hash, a run's full state."""

from __future__ import annotations

import secrets

from sqlalchemy import func, select

from qlactors.domain.model import Command, TaskSpec
from qlactors.domain.receipt import token_hash
from qlactors.store.schema import run_attempts, run_dispatch_leases, run_events, runs


def spec(name: str = "job", **kw) -> TaskSpec:
    """A valid task (`echo hi` unless `command` is given)."""
    kw.setdefault("command", Command.from_words(["echo", "hi"]))
    return TaskSpec(name=name, **kw)


def new_hash() -> str:
    """The hash of a fresh random token, as a lease or callback token hash."""
    return token_hash(secrets.token_urlsafe(32))


def db_state(repo, run_id: str) -> tuple:
    """Everything a report could change about a run (rows and event count), for "nothing changed"."""
    with repo.store.read() as conn:
        run = dict(conn.execute(select(runs).where(runs.c.id == run_id)).one()._mapping)
        attempts = [dict(r._mapping) for r in conn.execute(
            select(run_attempts).where(run_attempts.c.run_id == run_id).order_by(run_attempts.c.number))]
        leases = [dict(r._mapping) for r in conn.execute(
            select(run_dispatch_leases).where(run_dispatch_leases.c.run_id == run_id)
            .order_by(run_dispatch_leases.c.attempt_id, run_dispatch_leases.c.lease_generation))]
        events = conn.execute(select(func.count()).select_from(run_events)
                              .where(run_events.c.run_id == run_id)).scalar_one()
    return run, attempts, leases, events
