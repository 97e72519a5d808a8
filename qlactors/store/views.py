"""Store: read models returned by the repositories, with the stable `--json` field names of ARCHITECTURE.md."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..domain import posix
from ..domain.model import Command, TaskSpec, env_from_json, env_names_json, env_to_json
from ..domain.retention import RetentionPolicy, TaskRetention
from ..domain.retry import RetryPolicy
from ..domain.states import RUN_CANCEL_REQUESTED, RunStatus


@dataclass(frozen=True, slots=True)
class TriggerEventView:
    """An occurrence that did not become a run: `skipped` (overlap) or `missed` (folded into a catch-up)."""

    type: str
    scheduled_for_ms: int  # the first occurrence the event covers
    count: int  # how many occurrences it covers (`trigger_events.occurrences`)
    trigger_revision: int
    run_id: str | None  # the run the missed occurrences were folded into, if any
    at_ms: int

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "scheduled_for_ms": self.scheduled_for_ms, "count": self.count,
                "trigger_revision": self.trigger_revision, "run_id": self.run_id, "at_ms": self.at_ms}


@dataclass(frozen=True, slots=True)
class TriggerView:
    """A task's live cron trigger, its schedule cursor, and (detail only) its recent events."""

    id: str
    revision: int
    cron: str
    tz: str
    misfire: str
    grace_ms: int
    overlap: str
    # When it fires next, for display: the stored cursor; when the cursor is not initialised yet,
    # the first occurrence at or after the time of reading (never written); None while disabled.
    next_fire_at_ms: int | None
    last_scheduled_at_ms: int | None
    updated_at_ms: int
    events: tuple[TriggerEventView, ...] | None = None  # None: not read (task list)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id, "revision": self.revision, "cron": self.cron, "tz": self.tz,
            "misfire": self.misfire, "grace_ms": self.grace_ms, "overlap": self.overlap,
            "next_fire_at_ms": self.next_fire_at_ms, "last_scheduled_at_ms": self.last_scheduled_at_ms,
            "updated_at_ms": self.updated_at_ms,
        }
        if self.events is not None:
            data["events"] = [e.to_json() for e in self.events]
        return data


@dataclass(frozen=True, slots=True)
class TaskView:
    id: str
    revision: int
    enabled: bool
    spec: TaskSpec
    created_at_ms: int
    updated_at_ms: int
    active_runs: int = 0
    trigger: TriggerView | None = None  # its cron schedule, if it has one
    retention: TaskRetention = TaskRetention()  # its own bounds; None fields: the global ones

    @property
    def name(self) -> str:
        return self.spec.name

    def retention_json(self, default: RetentionPolicy | None) -> dict[str, Any]:
        """The bounds in force and where each comes from: `task` (its own) or `global` (the config's;
        null when `default` is not known)."""
        data: dict[str, Any] = {}
        for bound in ("max_age_ms", "max_runs"):
            own = getattr(self.retention, bound)
            data[bound] = own if own is not None else None if default is None else getattr(default, bound)
            data[bound.removesuffix("_ms") + "_from"] = "global" if own is None else "task"
        return data

    def to_json(self, retention_default: RetentionPolicy | None = None) -> dict[str, Any]:
        s = self.spec
        return {
            "id": self.id, "name": s.name, "revision": self.revision, "enabled": self.enabled,
            "command": s.command.to_json(), "cwd": None if s.cwd is None else posix.to_json(s.cwd),
            "env": env_names_json(s.env),  # names and sizes, never the values
            "timeout_ms": s.timeout_ms, "stop_grace_ms": s.stop_grace_ms,
            "keep_leftovers": s.keep_leftovers,
            "max_concurrent": s.max_concurrent,
            "retry": {"retry_on_lost": s.retry.retry_on_lost, "max_attempts": s.retry.max_attempts,
                      "safety": s.retry.safety.value, "backoff_base_ms": s.retry.backoff_base_ms,
                      "backoff_max_ms": s.retry.backoff_max_ms},
            "max_queued": s.max_queued, "random_delay_ms": s.random_delay_ms,
            "labels": list(s.labels), "active_runs": self.active_runs,
            "created_at_ms": self.created_at_ms, "updated_at_ms": self.updated_at_ms,
            "trigger": None if self.trigger is None else self.trigger.to_json(),
            "retention": self.retention_json(retention_default),
        }


@dataclass(frozen=True, slots=True)
class TaskEventView:
    """One change to a task (`task_events`): what it was, the revision after it, who made it, and
    for an update the names of the fields it changed (never their values)."""

    type: str  # TaskEventType: added, updated, enabled, disabled, removed
    revision: int
    actor_name: str
    at_ms: int
    changed: tuple[str, ...] = ()  # an update's changed fields, sorted; () for the other types

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "revision": self.revision, "actor_name": self.actor_name,
                "at_ms": self.at_ms, "changed": list(self.changed)}


def spec_from_revision(name: str, row: Any) -> TaskSpec:
    """Rebuild the pinned TaskSpec from a `task_revisions` row."""
    return TaskSpec(
        name=name,
        command=Command.from_json(json.loads(row.command_json)),
        cwd=cwd_from_column(row.cwd),
        env=env_from_json(json.loads(row.env_json)),
        timeout_ms=row.timeout_ms,
        stop_grace_ms=row.stop_grace_ms,
        max_concurrent=row.max_concurrent,
        retry=RetryPolicy(retry_on_lost=bool(row.retry_on_lost), max_attempts=row.max_attempts,
                            safety=row.safety, backoff_base_ms=row.backoff_base_ms,
                            backoff_max_ms=row.backoff_max_ms),
        labels=tuple(json.loads(row.labels_json)),
        keep_leftovers=bool(row.keep_leftovers),
        max_queued=row.max_queued,
        random_delay_ms=row.random_delay_ms,
    )


def cwd_from_column(value: str | None) -> str | None:
    """A revision's working directory from its text column (`posix.to_column`'s form)."""
    return None if value is None else posix.from_column(value)


def revision_values(spec: TaskSpec) -> dict[str, Any]:
    """The `task_revisions` columns for a spec (the inverse of `spec_from_revision`)."""
    return {
        "command_json": json.dumps(spec.command.to_json()),
        "cwd": None if spec.cwd is None else posix.to_column(spec.cwd),
        "env_json": json.dumps(env_to_json(spec.env), sort_keys=True),
        "timeout_ms": spec.timeout_ms,
        "stop_grace_ms": spec.stop_grace_ms,
        "max_concurrent": spec.max_concurrent,
        "retry_on_lost": spec.retry.retry_on_lost,
        "max_attempts": spec.retry.max_attempts,
        "safety": spec.retry.safety.value,
        "backoff_base_ms": spec.retry.backoff_base_ms,
        "backoff_max_ms": spec.retry.backoff_max_ms,
        "labels_json": json.dumps(list(spec.labels)),
        "keep_leftovers": spec.keep_leftovers,
        "max_queued": spec.max_queued,
        "random_delay_ms": spec.random_delay_ms,
    }


@dataclass(frozen=True, slots=True)
class AttemptView:
    id: str
    number: int
    state: str
    exit_code: int | None
    signal: int | None
    error_code: str | None
    log_dropped_bytes: int | None
    deadline_at_ms: int | None
    created_at_ms: int
    started_at_ms: int | None
    finished_at_ms: int | None
    # Where it ran: the worker its lease went to (`local` on edge), that session's generation,
    # and the job's process id and its host's boot id once it started; None before.
    worker_id: str | None = None
    session_generation: int | None = None
    pid: int | None = None
    boot_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "number": self.number, "state": self.state, "exit_code": self.exit_code,
                "signal": self.signal, "error_code": self.error_code,
                "log_dropped_bytes": self.log_dropped_bytes, "deadline_at_ms": self.deadline_at_ms,
                "created_at_ms": self.created_at_ms, "started_at_ms": self.started_at_ms,
                "finished_at_ms": self.finished_at_ms, "worker_id": self.worker_id,
                "session_generation": self.session_generation, "pid": self.pid, "boot_id": self.boot_id}


@dataclass(frozen=True, slots=True)
class EventView:
    seq: int
    type: str
    at_ms: int
    actor_type: str
    attempt_id: str | None
    payload: dict[str, Any]
    actor_name: str | None = None  # the person behind it (a token's name, the CLI's user); None: the runtime

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "type": self.type, "at_ms": self.at_ms, "actor_type": self.actor_type,
                "actor_name": self.actor_name, "attempt_id": self.attempt_id, "payload": self.payload}


@dataclass(frozen=True, slots=True)
class RunView:
    id: str
    task: str
    task_revision: int
    state: str
    version: int
    trigger_type: str
    scheduled_for_ms: int | None
    idempotency_key: str | None
    cancel_reason: str | None
    error_code: str | None
    retry_of_run_id: str | None
    created_at_ms: int
    started_at_ms: int | None
    finished_at_ms: int | None
    attempts: tuple[AttemptView, ...] = field(default=())
    events: tuple[EventView, ...] = field(default=())
    not_before_ms: int | None = None  # a cron run's random delay: not offered before this time
    last_attempt: AttemptView | None = None  # its newest attempt (read for lists too, unlike `attempts`)

    def to_json(self, *, detail: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id, "task": self.task, "task_revision": self.task_revision, "state": self.state,
            "version": self.version, "trigger_type": self.trigger_type,
            "scheduled_for_ms": self.scheduled_for_ms, "created_at_ms": self.created_at_ms,
            "started_at_ms": self.started_at_ms, "finished_at_ms": self.finished_at_ms,
            "error_code": self.error_code, "cancel_reason": self.cancel_reason,
            "retry_of_run_id": self.retry_of_run_id, "not_before_ms": self.not_before_ms,
        }
        if detail:
            data["attempts"] = [a.to_json() for a in self.attempts]
            data["events"] = [e.to_json() for e in self.events]
            pending = self.stop_pending
            if pending is not None:
                data["stop_pending"] = {"reason": pending[0], "requested_at_ms": pending[1]}
        else:
            data["last_attempt"] = None if self.last_attempt is None else self.last_attempt.to_json()
        return data

    @property
    def stop_pending(self) -> tuple[str, int | None] | None:
        """A committed cancel intent (user, policy, timeout, shutdown) whose stop has not ended the
        run yet: its job still runs until its worker stops it, e.g. a worker frozen or cut off.
        (reason, when it was committed: its `run.cancel_requested` event), else None."""
        if self.cancel_reason is None or RunStatus(self.state).terminal:
            return None
        at = next((e.at_ms for e in reversed(self.events) if e.type == RUN_CANCEL_REQUESTED), None)
        return self.cancel_reason, at


@dataclass(frozen=True, slots=True)
class RunPage:
    runs: tuple[RunView, ...]
    next_cursor: str | None
