"""Human-readable output for the CLI: times in UTC, one fact per column, no job output."""

from __future__ import annotations

import json
import signal
import sys
from datetime import datetime, timezone
from typing import Any, Iterable, TextIO

from ..domain import posix
from ..domain.cron import CronError, load_zone
from ..domain.retention import DAY_MS, HOUR_MS, RetentionPolicy
from ..domain.times import utc_second
from ..store.views import AttemptView, EventView, RunView, TaskEventView, TaskView, TriggerView


def when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def when_in_zone(ms: int | None, zone: str) -> str:
    """ISO 8601 with the zone's offset (a schedule's times read as its zone's wall clock)."""
    if ms is None:
        return "-"
    try:
        tz = load_zone(zone)
    except CronError:  # the zone database went away since the trigger was written
        return when(ms)
    at = datetime.fromtimestamp(ms // 1000, tz=tz).replace(microsecond=(ms % 1000) * 1000)
    return at.isoformat(timespec="milliseconds" if ms % 1000 else "seconds")


def next_fire(v: TaskView) -> str:
    t = v.trigger
    if t is None:
        return "-"
    if not v.enabled:
        return "- (task disabled)"
    return when_in_zone(t.next_fire_at_ms, t.tz)


def schedule_line(v: TaskView) -> str:
    """One line for `task add/update`: the schedule now in force and when it fires next."""
    t = v.trigger
    assert t is not None
    return f"schedule: {t.cron} in {t.tz} (trigger revision {t.revision}), next fire {next_fire(v)}"


def seconds(ms: int | None) -> str:
    return "-" if ms is None else f"{ms / 1000:g}s"


def age(ms: int) -> str:
    """A retention age: whole days or hours when it is one, else fractional days."""
    if ms % DAY_MS == 0:
        n = ms // DAY_MS
        return f"{n} day" + ("" if n == 1 else "s")
    if ms % HOUR_MS == 0:
        n = ms // HOUR_MS
        return f"{n} hour" + ("" if n == 1 else "s")
    return f"{ms / DAY_MS:g} days"


def retention_parts(v: TaskView, default: RetentionPolicy) -> tuple[str, str]:
    """The age and count bounds in force for the task, each saying whose it is."""
    own = v.retention
    kept_for = (f"{age(own.max_age_ms)} (task)" if own.max_age_ms is not None
                else f"{age(default.max_age_ms)} (global default)")
    kept_runs = (f"{own.max_runs} (task)" if own.max_runs is not None
                 else f"{default.max_runs} (global default)")
    return kept_for, kept_runs


def retention_line(v: TaskView, default: RetentionPolicy) -> str:
    """One line for `task add/update`: the retention now in force."""
    kept_for, kept_runs = retention_parts(v, default)
    return f"retention: finished runs kept {kept_for}, newest {kept_runs}"


def dump_json(data: Any, out: TextIO = sys.stdout) -> None:
    json.dump(data, out, indent=2, sort_keys=False)
    out.write("\n")


def table(rows: Iterable[tuple[str, ...]], header: tuple[str, ...], out: TextIO = sys.stdout,
          indent: str = "") -> None:
    rows = [header, *rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        out.write(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")


def task_rows(views: Iterable[TaskView]) -> list[tuple[str, ...]]:
    return [(v.name, str(v.revision), "yes" if v.enabled else "no", str(v.spec.max_concurrent),
             seconds(v.spec.timeout_ms), str(v.active_runs), v.trigger.cron if v.trigger else "-",
             next_fire(v), v.spec.command.display()[:60]) for v in views]


TASK_HEADER = ("NAME", "REV", "ENABLED", "MAX", "TIMEOUT", "ACTIVE", "CRON", "NEXT FIRE", "COMMAND")


def task_detail(v: TaskView, default: RetentionPolicy, out: TextIO = sys.stdout) -> None:
    s = v.spec
    r = s.retry
    kept_for, kept_runs = retention_parts(v, default)
    lines = [
        ("name", s.name), ("id", v.id), ("revision", str(v.revision)),
        ("enabled", "yes" if v.enabled else "no"),
        ("command", s.command.display() if s.command.shell is not None
         else json.dumps(s.command.to_json()["argv"])),
        ("shell", "yes" if s.command.shell is not None else "no"),
        ("cwd", "-" if s.cwd is None else posix.display(s.cwd)), ("env", ", ".join(sorted(s.env)) or "-"),
        ("timeout", seconds(s.timeout_ms)), ("stop grace", seconds(s.stop_grace_ms)),
        ("keep leftovers", "yes" if s.keep_leftovers else "no"),
        ("max concurrent", str(s.max_concurrent)),
        ("retry on lost", f"yes, {r.max_attempts} attempts, {r.safety.value}, backoff "
                          f"{seconds(r.backoff_base_ms)}..{seconds(r.backoff_max_ms)}" if r.retry_on_lost else "no"),
        ("keep for", kept_for), ("keep runs", kept_runs),
        ("active runs", str(v.active_runs)), ("updated", when(v.updated_at_ms)),
    ]
    t = v.trigger
    if t is None:
        lines.append(("schedule", "-"))
    else:
        lines += [
            ("schedule", f"{t.cron} in {t.tz} (trigger revision {t.revision})"),
            ("misfire", t.misfire + (f", grace {seconds(t.grace_ms)}" if t.misfire == "skip" else "")),
            ("overlap", f"{t.overlap} (limit: max concurrent {s.max_concurrent}"
                        + (f", max queued {s.max_queued})" if t.overlap == "queue" else ")")),
            ("random delay", f"up to {seconds(s.random_delay_ms)}" if s.random_delay_ms else "none"),
            ("next fire", next_fire(v)),
            ("last scheduled", when_in_zone(t.last_scheduled_at_ms, t.tz)),
        ]
    for k, val in lines:
        out.write(f"{k + ':':<16}{val}\n")
    if t is not None:
        _trigger_events(t, out)


def _trigger_events(t: TriggerView, out: TextIO) -> None:
    out.write("\ntrigger events:\n")
    if not t.events:
        out.write("  (none)\n")
        return
    table([(e.type, when_in_zone(e.scheduled_for_ms, t.tz), str(e.count), str(e.trigger_revision),
            when(e.at_ms), e.run_id or "-") for e in t.events],
          ("TYPE", "SCHEDULED FOR", "COUNT", "REV", "AT", "RUN"), out, indent="  ")


def task_history(events: Iterable[TaskEventView], out: TextIO = sys.stdout) -> None:
    """`task show`'s last part: each change to the task, newest first, and who made it."""
    out.write("\nhistory:\n")
    lines = [f"  {utc_second(e.at_ms)}  {e.type:<8}  rev {e.revision}  by {e.actor_name}"
             + (f"  ({', '.join(e.changed)})" if e.changed else "") for e in events]
    out.write("\n".join(lines) + "\n" if lines else "  (none)\n")


def actor_of(e: EventView) -> str:
    """A run event's actor: its type, and the person behind it when one asked (`user (alice)`)."""
    return e.actor_type if e.actor_name is None else f"{e.actor_type} ({e.actor_name})"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal, say: no name of its own
        return f"signal {number}"


def exit_text(a: AttemptView | None) -> str:
    """An attempt's exit code, with the signal the runtime's stop killed it with, if any."""
    if a is None or a.exit_code is None:
        return "-"
    return str(a.exit_code) if a.signal is None else f"{a.exit_code} ({signal_name(a.signal)})"


def exit_of(run: RunView) -> str:
    """`show`'s exit code line: the code, and for a stopped job what the database holds of the
    stop: the signal that killed it (`signal`) and why it was sent (the run's cancel reason).
    A code of 128 + N with no signal recorded was the job's own exit status (a shell reports a
    child killed by signal N so, or the job caught the stop and exited with it)."""
    last = run.last_attempt
    if last is None or last.exit_code is None:
        return "-"
    stop = f" (stop: {run.cancel_reason})" if run.cancel_reason else ""
    if last.signal is not None:
        return f"{last.exit_code}, killed by {signal_name(last.signal)}{stop}"
    if 128 < last.exit_code <= 128 + 64 and run.cancel_reason:
        return f"{last.exit_code} = 128 + {signal_name(last.exit_code - 128)}{stop}"
    return str(last.exit_code)


def worker_of(a) -> str:
    """Which worker ran an attempt (an AttemptView, an ActiveRun's newest attempt): its id
    (`local` on edge), session generation and job pid."""
    if a is None or a.worker_id is None:
        return "-"
    parts = [f"gen {a.session_generation}"] if a.session_generation is not None else []
    if a.pid is not None:
        parts.append(f"pid {a.pid}")
    return a.worker_id + (f" ({', '.join(parts)})" if parts else "")


def run_rows(runs: Iterable[RunView]) -> list[tuple[str, ...]]:
    return [(r.id, r.task, r.state, r.trigger_type, when(r.created_at_ms), when(r.finished_at_ms),
             exit_text(r.last_attempt), r.error_code or "-", worker_of(r.last_attempt)) for r in runs]


RUN_HEADER = ("ID", "TASK", "STATE", "TRIGGER", "CREATED", "FINISHED", "EXIT", "ERROR", "WORKER")


def run_detail(run: RunView, out: TextIO = sys.stdout) -> None:
    for k, val in (("run", run.id), ("task", f"{run.task} (revision {run.task_revision})"),
                   ("state", run.state), ("trigger", run.trigger_type),
                   ("scheduled for", when(run.scheduled_for_ms)),
                   *((("not before", when(run.not_before_ms)),) if run.not_before_ms is not None else ()),
                   ("created", when(run.created_at_ms)),
                   ("started", when(run.started_at_ms)), ("finished", when(run.finished_at_ms)),
                   ("exit code", exit_of(run)), ("error", run.error_code or "-"),
                   ("cancel", run.cancel_reason or "-"), ("retry of", run.retry_of_run_id or "-")):
        out.write(f"{k + ':':<15}{val}\n")
    pending = run.stop_pending
    if pending is not None:
        out.write(f"{'stop pending:':<15}{pending[0]} (requested at {when(pending[1])}): "
                  "the job runs until its worker stops it\n")
    out.write("\nattempts:\n")
    table([(str(a.number), a.state, exit_text(a), when(a.started_at_ms), when(a.finished_at_ms),
            a.error_code or "-", worker_of(a)) for a in run.attempts],
          ("#", "STATE", "EXIT", "STARTED", "FINISHED", "ERROR", "WORKER"), out, indent="  ")
    out.write("\nevents:\n")
    table([(str(e.seq), e.type, when(e.at_ms), actor_of(e),
            json.dumps(e.payload, sort_keys=True) if e.payload else "") for e in run.events],
          ("SEQ", "TYPE", "AT", "ACTOR", "PAYLOAD"), out, indent="  ")


ACTIVE_HEADER = ("RUN", "TASK", "STATE", "CREATED", "WORKER", "WAITING")


def active_runs(active, reasons: dict[str, str | None], total: int, out: TextIO = sys.stdout) -> None:
    """`status`: the oldest active runs (store/intent/active_runs.py), each with its newest attempt's
    worker and why a queued one waits; then how many more there are."""
    if not active:
        return
    table([(r.run_id, r.task, r.state, when(r.created_at_ms), worker_of(r), reasons.get(r.run_id) or "-")
           for r in active], ACTIVE_HEADER, out, indent="  ")
    if total > len(active):
        out.write(f"  ... and {total - len(active)} more (`qlactors runs --state STATE` lists them)\n")


def age_of(now_ms: int, at_ms: int | None) -> str:
    """How long before `now_ms` something happened, in seconds ("-" when it never did)."""
    return "-" if at_ms is None else f"{max(0, now_ms - at_ms) / 1000:.1f}s ago"


def _lease(w) -> str:
    if w.status in ("never", "offline") or w.session_id is None:  # no session, or it has ended
        return "-"
    if w.lease_expires_at_ms is None:
        return "process lifetime"
    return ("expired " if w.lease_expired else "until ") + when(w.lease_expires_at_ms)


def worker_rows(workers) -> list[tuple[str, ...]]:
    return [(w.worker_id, "-" if w.generation is None else str(w.generation),
             w.state + ("" if w.allowed or w.state == "never" else " (not allowed)"),
             "-" if w.capacity is None else f"{'-' if w.free_slots is None else w.free_slots}/{w.capacity}",
             "-" if w.heartbeat_age_ms is None else f"{w.heartbeat_age_ms / 1000:.1f}s ago",
             _lease(w), "-" if w.clock_skew_ms is None else f"{w.clock_skew_ms:+d}ms",
             ",".join(w.labels) or "-") for w in workers]


WORKER_HEADER = ("WORKER", "GEN", "STATUS", "FREE/SLOTS", "HEARTBEAT", "SESSION LEASE", "SKEW", "LABELS")


def placement(labels: tuple[str, ...], qualifying: list[str] | None, out: TextIO = sys.stdout) -> None:
    """`task show`: the labels a task requires and who qualifies now (None: edge)."""
    out.write(f"{'labels:':<16}{', '.join(labels) or '-'}\n")
    if qualifying is None:
        verdict = "no: it requires labels" if labels else "yes"
        out.write(f"{'workers:':<16}edge: runs here only if the task requires no label ({verdict})\n")
    else:
        out.write(f"{'workers now:':<16}{', '.join(qualifying) or 'none online qualifies'}\n")


def cycle_failure_line(failure: dict, prefix: str = "cadence") -> str:
    """`status`'s line for a cadence whose cycles fail (a home's file or a replica's row, as JSON)."""
    return (f"{prefix}: failing since {when(failure.get('since_ms'))} at step {failure.get('step')}: "
            f"{failure.get('error')}; nothing is offered until a cycle gets through")


def confirm_line(outcome) -> str:
    """`confirm-stopped`: what was recorded (its applied Outcome, the value a store/dispatch/evidence.py Found)."""
    c = outcome.value
    attempt = f"run {c.run_id} attempt {c.attempt_number} ({c.attempt_id})"
    if outcome.detail is not None and outcome.detail.startswith("already_"):
        fact = outcome.detail.removeprefix("already_")
        who = f" by {c.by}" if c.by else ""
        return (f"{attempt}: already recorded as `{fact}`{who} for lease generation {c.lease_generation}; "
                "nothing written: recovery ends it `lost` on its next page")
    return (f"{attempt}: recorded as stopped by {c.by} for lease generation {c.lease_generation}; recovery "
            "ends it `lost` (RECOVERY_CONFIRMED_STOPPED) on its next page, then its retry policy applies")


def confirm_refusal(outcome) -> str:
    """`confirm-stopped` refused (nothing written): why, and what to do instead, in one line."""
    c, detail = outcome.value, outcome.detail
    run = f"run {c.run_id}"
    attempt = f"attempt {c.attempt_number}" if c.attempt_number is not None else "its attempt"
    if detail == "lease_live":
        until = "never expires" if c.lease_expires_at_ms is None else f"expires {when(c.lease_expires_at_ms)}"
        return (f"{run}: {attempt} holds a live lease (worker {c.worker_id or '?'} renews it; it {until}), so its "
                f"worker still runs it: stop it there, or `qlactors cancel {c.run_id}`; nothing was changed")
    if detail == "attempt_changed":
        return f"{run}: its current attempt changed meanwhile; look again (`qlactors show {c.run_id}`); nothing was changed"
    if detail is not None and detail.startswith("attempt_"):
        state = detail.removeprefix("attempt_")
        why = ("never activated: nothing of it runs, and recovery offers it again once its offer expires"
               if state == "claimed" else f"{state}: no live attempt to confirm")
        return f"{run} ({outcome.run_state}): {attempt} is {why}; nothing was changed"
    return f"{run} is {outcome.run_state}: no live attempt to confirm; nothing was changed"


def notification_lines(notifications: list[dict], out: TextIO = sys.stdout) -> None:
    """`show`: each notification of the run (by rule), its status and every try."""
    if not notifications:
        return
    out.write("\nnotifications:\n")
    for n in notifications:
        out.write(f"  {n['kind']} {n['target']} (rule {n['rule_id']}): {n['status']}"
                  + (f", next try {when(n['next_try_at_ms'])}" if n["next_try_at_ms"] else "") + "\n")
        for t in n["tries"]:
            out.write(f"    try {t['number']} {when(t['at_ms'])}: {'ok' if t['ok'] else 'failed'} ({t['detail']})\n")
