"""Store: the rows retention bounds besides runs — settled notifications whose run is gone, revoked
API tokens, old task history — one bounded batch of each per call.

A run's settled notifications go with the run (retention.py); one that was still pending when its
run was retired is settled later, by `qlactors web`, and would then be kept for ever: this sweep
deletes it, with its tries, once it is delivered or given up. A pending row is never deleted: it
carries what it tells, and the run's facts are no longer anywhere else. A revoked token's row is
kept `revoked_tokens_ms` after its revocation (`token list` shows it meanwhile), then deleted
(nothing references it: run and task events name the token, not its row). Each task keeps its
newest `task_events` history entries (what `task show` and the API read, newest first).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, exists, func, or_, select
from sqlalchemy.engine import Connection

from ..engine import Store
from ..schema import api_tokens, notification_deliveries, notification_outbox, runs, task_events

SETTLED = ("delivered", "gave_up")


@dataclass(frozen=True, slots=True)
class SweepReport:
    """What one sweep deleted; `more`: a batch was full, so more may be due at once."""

    notifications: int = 0
    tokens: int = 0
    task_events: int = 0
    more: bool = False


def sweep(store: Store, now_ms: int, *, revoked_tokens_ms: int, task_events_kept: int, page: int) -> SweepReport:
    """Delete at most `page` rows of each kind that is due: one read finds them, one write (only
    when something is due) deletes them. Safe across the gap: a settled row never goes back to
    pending nor its run comes back, a revoke is never undone, and history is only appended to."""
    with store.read() as conn:
        notes = _settled_orphan_notifications(conn, page)
        tokens = _revoked_tokens(conn, now_ms - revoked_tokens_ms, page)
        events, more_events = _old_task_events(conn, task_events_kept, page)
    if not (notes or tokens or events):
        return SweepReport()
    o, t, e = notification_outbox, api_tokens, task_events
    with store.write() as conn:
        if notes:
            conn.execute(notification_deliveries.delete().where(notification_deliveries.c.outbox_id.in_(notes)))
            conn.execute(o.delete().where(and_(o.c.id.in_(notes), o.c.status.in_(SETTLED))))
        if tokens:
            conn.execute(t.delete().where(and_(t.c.id.in_(tokens), t.c.revoked_at_ms.is_not(None))))
        if events:
            conn.execute(e.delete().where(e.c.id.in_(events)))
    return SweepReport(notifications=len(notes), tokens=len(tokens), task_events=len(events),
                       more=len(notes) >= page or len(tokens) >= page or more_events)


def _settled_orphan_notifications(conn: Connection, page: int) -> list[str]:
    """Settled outbox rows whose run retention deleted (they were pending then), oldest first."""
    o = notification_outbox
    return list(conn.execute(
        select(o.c.id).where(and_(o.c.status.in_(SETTLED), ~exists().where(runs.c.id == o.c.run_id)))
        .order_by(o.c.created_at_ms, o.c.id).limit(page)).scalars())


def _revoked_tokens(conn: Connection, cutoff_ms: int, page: int) -> list[str]:
    """Tokens revoked at or before `cutoff_ms`, oldest revoke first; a live token never."""
    t = api_tokens
    return list(conn.execute(
        select(t.c.id).where(and_(t.c.revoked_at_ms.is_not(None), t.c.revoked_at_ms <= cutoff_ms))
        .order_by(t.c.revoked_at_ms, t.c.id).limit(page)).scalars())


def _old_task_events(conn: Connection, keep: int, page: int) -> tuple[list[str], bool]:
    """Each task's history entries beyond its newest `keep` (by time, then id: the order `task
    show` reads them in), the tasks furthest over first, at most `page`; (ids, more due)."""
    e = task_events
    over = conn.execute(select(e.c.task_id, func.count()).group_by(e.c.task_id)
                        .having(func.count() > keep).order_by(func.count().desc(), e.c.task_id)).all()
    ids: list[str] = []
    for task_id, _n in over:
        if len(ids) >= page:
            break
        cut = conn.execute(select(e.c.created_at_ms, e.c.id).where(e.c.task_id == task_id)
                           .order_by(e.c.created_at_ms.desc(), e.c.id.desc()).limit(1).offset(keep)).one()
        older = or_(e.c.created_at_ms < cut[0], and_(e.c.created_at_ms == cut[0], e.c.id <= cut[1]))
        ids += conn.execute(select(e.c.id).where(and_(e.c.task_id == task_id, older))
                            .order_by(e.c.created_at_ms, e.c.id).limit(page - len(ids))).scalars()
    return ids, sum(n - keep for _, n in over) > len(ids)
