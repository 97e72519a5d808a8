"""Store: notification rules (where to tell about runs that end in some states), the outbox rows a
run's end queued for them (store/run_endings.py), claiming the due ones for delivery, and the
record of every try (`show` prints them).

A claim names its deliverer (a `qlactors web` process: `notification_deliverers`), which refreshes
its row every few seconds (`heartbeat`) and releases its claims when it stops (`release`); a claim
holds while its deliverer was seen within `alive_ms` (database time), so the rows of one that died
are taken again 30 s later, not at some fixed claim's end."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, exists, or_, select, update

from ...domain.notify import (DEFAULT_ON, RunFacts, check_on_states, check_secret, check_target, lane,
                              next_try_delay_ms, shown_target)
from ...errors import NotFound
from ...ids import new_id
from ..engine import Store
from ..schema import notification_deliverers, notification_deliveries, notification_outbox, notification_rules, tasks

# A claim is free once its deliverer has not been seen for this long: it refreshes every few
# seconds (web/notifier.py REFRESH_S), so a live one survives a database hiccup of some 25 s.
ALIVE_MS = 30_000
PRUNE_MS = 3_600_000  # a deliverer row unseen for this long is deleted (it died; its claims are long free)
CANDIDATES_PER_SLOT = 4  # rows read per slot to fill: enough to step over rows of busy lanes
DETAIL_CHARS = 500


@dataclass(frozen=True, slots=True)
class RuleView:
    id: str
    task: str | None  # None: every task
    on_states: tuple[str, ...]
    kind: str
    target: str
    actor_name: str
    created_at_ms: int
    signed: bool = False  # a webhook with a signing secret (the secret itself is never read back)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "task": self.task, "on": list(self.on_states), "kind": self.kind,
                "target": self.target, "signed": self.signed, "actor_name": self.actor_name,
                "created_at_ms": self.created_at_ms}


@dataclass(frozen=True, slots=True)
class Due:
    """One claimed outbox row: the rule to deliver by, the run's facts, and the claim's fence (a
    try is recorded only while the row is still claimed by `owner` with `tries` tries behind it)."""

    id: str
    owner: str
    run_id: str
    rule_id: str
    kind: str
    target: str
    tries: int
    facts: RunFacts
    secret: str | None = field(default=None, repr=False)  # the rule's webhook signing key: never shown


class Notifications:
    def __init__(self, store: Store, *, alive_ms: int = ALIVE_MS) -> None:
        """`alive_ms`: how long a deliverer unseen still holds its claims (shorter in tests)."""
        self.store, self.alive_ms = store, alive_ms

    # -- rules -------------------------------------------------------------------------------

    def add_rule(self, *, task: str | None, on: str | None, kind: str, target: str, actor_name: str,
                 secret: str | None = None) -> RuleView:
        """A new rule; `secret` (a webhook's only) signs each POST (docs/web.md "Signed webhooks")."""
        states = check_on_states(on) if on is not None else DEFAULT_ON
        check_target(kind, target)
        if secret is not None:
            check_secret(kind, secret)
        with self.store.write() as conn:
            task_id = None
            if task is not None:
                task_id = conn.execute(select(tasks.c.id).where(and_(
                    tasks.c.name == task, tasks.c.deleted_at_ms.is_(None)))).scalar()
                if task_id is None:
                    raise NotFound(f"no task named {task!r}: see `qlactors task list`; nothing was written")
            rule_id, now = new_id(), self.store.now_ms(conn)
            conn.execute(notification_rules.insert().values(
                id=rule_id, task_id=task_id, on_states=",".join(states), kind=kind, target=target,
                actor_name=actor_name, created_at_ms=now, secret=secret))
            return RuleView(rule_id, task, states, kind, target, actor_name, now, signed=secret is not None)

    def remove_rule(self, rule_id: str) -> None:
        """No more notifications by this rule; those already queued are still delivered."""
        with self.store.write() as conn:
            gone = conn.execute(update(notification_rules).where(and_(
                notification_rules.c.id == rule_id, notification_rules.c.removed_at_ms.is_(None)))
                .values(removed_at_ms=self.store.now_ms(conn)))
            if gone.rowcount != 1:
                raise NotFound(f"no notification rule {rule_id!r}: see `qlactors notify list`")

    def rules(self) -> list[RuleView]:
        query = (select(notification_rules, tasks.c.name.label("task_name"))
                 .outerjoin(tasks, tasks.c.id == notification_rules.c.task_id)
                 .where(notification_rules.c.removed_at_ms.is_(None))
                 .order_by(notification_rules.c.created_at_ms, notification_rules.c.id))
        with self.store.read() as conn:
            return [RuleView(r.id, r.task_name, tuple(r.on_states.split(",")), r.kind, r.target, r.actor_name,
                             r.created_at_ms, signed=r.secret is not None) for r in conn.execute(query)]

    # -- delivery ----------------------------------------------------------------------------

    # -- deliverers --------------------------------------------------------------------------

    def heartbeat(self, owner: str, *, host: str, pid: int) -> bool:
        """Say deliverer `owner` is alive (database time), and delete the rows of deliverers long
        dead. False when its row was missing: first seen, or presumed dead meanwhile (unseen for
        PRUNE_MS) — a claim it held may then have passed to another deliverer, whose record wins."""
        with self.store.write() as conn:
            now = self.store.now_ms(conn)
            seen = conn.execute(update(notification_deliverers).where(notification_deliverers.c.id == owner)
                                .values(seen_at_ms=now)).rowcount == 1
            if not seen:
                conn.execute(notification_deliverers.insert().values(
                    id=owner, host=host[:255], pid=pid, started_at_ms=now, seen_at_ms=now))
            conn.execute(notification_deliverers.delete().where(
                notification_deliverers.c.seen_at_ms < now - PRUNE_MS))
            return seen

    def release(self, owner: str) -> int:
        """A deliverer stops: its claims are free at once and its row goes; the rows released."""
        with self.store.write() as conn:
            released = conn.execute(update(notification_outbox).where(and_(
                notification_outbox.c.claimed_by == owner, notification_outbox.c.status == "pending"))
                .values(claimed_by=None)).rowcount
            conn.execute(notification_deliverers.delete().where(notification_deliverers.c.id == owner))
            return released

    # -- delivery ----------------------------------------------------------------------------

    def claim_due(self, *, owner: str, limit: int, page_url: str | None,
                  busy: frozenset[str] = frozenset()) -> list[Due]:
        """Claim for deliverer `owner` up to `limit` pending rows whose time has come and that no
        live claim holds (a claim holds while its deliverer was seen within `alive_ms`; one made
        under schema 17 until its `claimed_until_ms`), at most one per delivery lane (a target's
        host: `domain.notify.lane`) and none in a lane of `busy` (the ones this deliverer has a try
        in flight in): a dead endpoint holds its own lane, never the others'. Concurrent
        deliverers skip each other's rows (PostgreSQL: SKIP LOCKED)."""
        with self.store.write() as conn:
            now = self.store.now_ms(conn)
            box, d = notification_outbox.c, notification_deliverers.c
            holder_alive = exists().where(and_(d.id == box.claimed_by, d.seen_at_ms > now - self.alive_ms))
            free = or_(and_(box.claimed_by.is_(None), or_(box.claimed_until_ms.is_(None), box.claimed_until_ms <= now)),
                       and_(box.claimed_by.is_not(None), ~holder_alive))
            query = (select(notification_outbox, notification_rules.c.kind, notification_rules.c.target,
                            notification_rules.c.secret)
                     .join(notification_rules, notification_rules.c.id == notification_outbox.c.rule_id)
                     .where(and_(box.status == "pending", box.next_try_at_ms <= now, free))
                     .order_by(notification_outbox.c.next_try_at_ms).limit(limit * CANDIDATES_PER_SLOT)
                     .with_for_update(skip_locked=True, of=notification_outbox))
            rows, taken = [], set(busy)
            for row in conn.execute(query).all():
                way = lane(row.kind, row.target)
                if way not in taken and len(rows) < limit:
                    taken.add(way)
                    rows.append(row)
            if rows:
                conn.execute(update(notification_outbox).where(box.id.in_([row.id for row in rows]))
                             .values(claimed_by=owner, claimed_until_ms=None))
            return [Due(row.id, owner, row.run_id, row.rule_id, row.kind, row.target, row.tries,
                        _facts(conn, row, page_url), secret=row.secret) for row in rows]

    def record_try(self, due: Due, *, ok: bool, detail: str) -> str | None:
        """Record one try: `delivered`, else pending again after the backoff, or `gave_up` after
        the last try. Returns the row's status; None when the row no longer holds this claim
        (released, or taken by another deliverer that presumed this one dead): nothing is
        recorded then."""
        with self.store.write() as conn:
            now = self.store.now_ms(conn)
            tries = due.tries + 1
            delay = None if ok else next_try_delay_ms(tries)
            status = "delivered" if ok else ("pending" if delay is not None else "gave_up")
            values: dict[str, Any] = {"status": status, "tries": tries, "claimed_by": None}
            if ok:
                values["delivered_at_ms"] = now
            elif delay is not None:
                values["next_try_at_ms"] = now + delay
            held = conn.execute(update(notification_outbox).where(and_(
                notification_outbox.c.id == due.id, notification_outbox.c.status == "pending",
                notification_outbox.c.claimed_by == due.owner, notification_outbox.c.tries == due.tries))
                .values(**values))
            if held.rowcount != 1:
                return None
            conn.execute(notification_deliveries.insert().values(
                id=new_id(), outbox_id=due.id, run_id=due.run_id, try_number=tries, ok=ok,
                detail=detail[:DETAIL_CHARS], at_ms=now))
            return status

    def of_run(self, run_id: str) -> list[dict[str, Any]]:
        """A run's notifications with each try, for `show` and `show --json`."""
        with self.store.read() as conn:
            rows = conn.execute(
                select(notification_outbox, notification_rules.c.kind, notification_rules.c.target)
                .join(notification_rules, notification_rules.c.id == notification_outbox.c.rule_id)
                .where(notification_outbox.c.run_id == run_id).order_by(notification_outbox.c.created_at_ms)).all()
            tries = conn.execute(select(notification_deliveries).where(notification_deliveries.c.run_id == run_id)
                                 .order_by(notification_deliveries.c.try_number)).all()
        return [{"id": r.id, "rule_id": r.rule_id, "state": r.state, "kind": r.kind,
                 "target": shown_target(r.kind, r.target),
                 "status": r.status, "tries": [{"number": t.try_number, "ok": bool(t.ok), "detail": t.detail,
                                                 "at_ms": t.at_ms} for t in tries if t.outbox_id == r.id],
                 "next_try_at_ms": r.next_try_at_ms if r.status == "pending" else None,
                 "delivered_at_ms": r.delivered_at_ms} for r in rows]


def _facts(conn, row, page_url: str | None) -> RunFacts:
    """The run's facts as its transition copied them into the outbox row (store/run_endings.py):
    the same whether or not retention has deleted the run since, or a retry moved it on."""
    task = conn.execute(select(tasks.c.name).where(tasks.c.id == row.task_id)).scalar()
    return RunFacts(task=task or "?", run_id=row.run_id, state=row.state, exit_code=row.exit_code,
                    error_code=row.error_code, created_at_ms=row.run_created_at_ms,
                    started_at_ms=row.started_at_ms, finished_at_ms=row.finished_at_ms,
                    url=None if page_url is None else f"{page_url.rstrip('/')}/#run={row.run_id}",
                    attempt=row.attempt_number)
