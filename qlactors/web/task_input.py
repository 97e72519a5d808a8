"""Web: a task as an API body gives it, in the vocabulary `task show --json` writes (`command`
as `{"argv": [...]}` or `{"shell": "..."}`, `timeout_ms`, `env` as an object, `labels`, `retry`,
`trigger`, `retention`), turned into what `Tasks.add` and `Tasks.update` take. Pure: every check
a value needs beyond its JSON type is the domain's own (TaskSpec, RetryPolicy, TaskRetention),
so an API refusal says what the CLI says."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from ..domain import posix
from ..domain.model import Command, env_patched
from ..domain.retention import TaskRetention
from ..domain.retry import RetryPolicy
from ..errors import BadInput
from ..store.intent.triggers import TriggerOptions

# Spec fields a body may set directly, with the JSON type each takes (`None` allowed where listed).
_INTS = ("stop_grace_ms", "max_concurrent", "max_queued", "random_delay_ms")
_RETRY = ("retry_on_lost", "max_attempts", "safety", "backoff_base_ms", "backoff_max_ms")
_TRIGGER = ("cron", "tz", "misfire", "grace_ms", "overlap")
_RETENTION = ("max_age_ms", "max_runs")
# Read-only fields of `task show --json` that a body may carry back unchanged (a GET edited and
# sent again): they are ignored, never written.
_READ_ONLY = frozenset({"id", "revision", "active_runs", "created_at_ms", "updated_at_ms", "history",
                        "schedule", "last_run", "qualifying_workers"})
_KNOWN = frozenset({"name", "command", "cwd", "env", "timeout_ms", "keep_leftovers", "labels", "retry",
                    "trigger", "retention", "enabled", *_INTS}) | _READ_ONLY


@dataclass(frozen=True, slots=True)
class TaskInput:
    """What a body asks for: spec changes (TaskSpec fields), and the schedule, retention and
    enabled flag beside them."""

    changes: dict[str, Any] = field(default_factory=dict)
    trigger: TriggerOptions | None = None
    remove_trigger: bool = False
    retention: dict[str, int | None] = field(default_factory=dict)
    enabled: bool | None = None


def read_task(body: Any, *, base_retry: RetryPolicy, creating: bool,
              current_env: Mapping[str, str] | None = None) -> TaskInput:
    """Check a body's shape and types; the domain checks the values when the spec is built.
    `env` is applied to `current_env` (an update's: the names it does not give are kept). A
    refusal names the field it is about (`BadInput.field`)."""
    if type(body) is not dict:
        raise BadInput("the body must be a JSON object with the task's fields (as `task show --json` writes them)")
    unknown = set(body) - _KNOWN
    if unknown:
        raise BadInput(f"unknown field(s) {sorted(unknown)}; nothing was written")
    if creating and "command" not in body:
        with _about("command"):
            raise BadInput("no command given: send `command` as {\"argv\": [...]} or {\"shell\": \"...\"}")
    changes: dict[str, Any] = {}
    for name, read in _readers(body, base_retry, creating, current_env):
        if name in body:
            with _about(name):
                changes[name] = read(body[name])
    with _about("trigger"):
        trigger, remove = _trigger(body)
        if creating and remove:
            raise BadInput("trigger: null removes a schedule: leave it out to add a task without one")
    with _about("retention"):
        retention = _retention(body.get("retention"))
    with _about("enabled"):
        enabled = None if "enabled" not in body else _bool("enabled", body["enabled"])
    return TaskInput(changes=changes, trigger=trigger, remove_trigger=remove, retention=retention, enabled=enabled)


@contextmanager
def _about(name: str) -> Iterator[None]:
    """A refusal raised while reading `name` names it, unless it names a field of its own."""
    try:
        yield
    except BadInput as err:
        if err.field is None:
            err.field = name
        raise


def _readers(body: Mapping[str, Any], base_retry: RetryPolicy, creating: bool,
             current_env: Mapping[str, str] | None) -> list[tuple[str, Callable[[Any], Any]]]:
    """Each spec field a body may give, and how its value is read."""
    def env(value: Any) -> dict[str, str]:
        try:
            return env_patched(value, None if creating else dict(current_env or {}))
        except ValueError as err:
            raise BadInput(f"env: {err}") from None

    def timeout(value: Any) -> int | None:
        ms = _int_or_none("timeout_ms", value)
        return None if ms == 0 else ms  # as `--timeout 0`: no timeout

    def labels(value: Any) -> tuple[str, ...]:
        if type(value) is not list or any(type(x) is not str for x in value):
            raise BadInput("labels must be a list of strings")
        from ..domain.labels import check_labels

        return check_labels("labels", value) if value else ()

    return [("command", _command), ("cwd", lambda v: None if v is None else _posix("cwd", v)), ("env", env),
            ("timeout_ms", timeout), *((name, lambda v, n=name: _int(n, v)) for name in _INTS),
            ("keep_leftovers", lambda v: _bool("keep_leftovers", v)), ("labels", labels),
            ("retry", lambda v: _retry(v, base_retry))]


def _command(value: Any) -> Command:
    if type(value) is not dict or len(value) != 1 or not ({"argv"} >= set(value) or {"shell"} >= set(value)):
        raise BadInput('command must be {"argv": ["word", ...]} or {"shell": "a shell string"}')
    if "shell" in value:
        return Command(shell=_posix("command shell", value["shell"]))
    words = value["argv"]
    if type(words) is not list or not words:
        raise BadInput("command argv must be a non-empty list of words")
    return Command(argv=tuple(_posix(f"command argv item {i}", w) for i, w in enumerate(words)))


def _posix(what: str, value: Any) -> str:
    """A string, or `{"base64": ...}` for bytes that are no UTF-8 (as `--json` writes them)."""
    try:
        return posix.from_json(value)
    except ValueError as err:
        raise BadInput(f"{what}: {err}") from None


def _int(what: str, value: Any) -> int:
    if type(value) is not int:
        raise BadInput(f"{what} must be a whole number, got {value!r}")
    return value


def _int_or_none(what: str, value: Any) -> int | None:
    return None if value is None else _int(what, value)


def _bool(what: str, value: Any) -> bool:
    if type(value) is not bool:
        raise BadInput(f"{what} must be true or false, got {value!r}")
    return value


def _retry(value: Any, base: RetryPolicy) -> RetryPolicy:
    if type(value) is not dict or set(value) - set(_RETRY):
        raise BadInput(f"retry must be an object with some of {', '.join(_RETRY)}")
    current = {f: getattr(base, f) for f in _RETRY}
    return RetryPolicy(**{**current, **value})


def _trigger(body: Mapping[str, Any]) -> tuple[TriggerOptions | None, bool]:
    if "trigger" not in body:
        return None, False
    value = body["trigger"]
    if value is None:
        return None, True
    if type(value) is not dict or set(value) - set(_TRIGGER):
        raise BadInput(f"trigger must be null or an object with some of {', '.join(_TRIGGER)}")
    for key in ("cron", "tz", "misfire", "overlap"):
        if key in value and value[key] is not None and type(value[key]) is not str:
            raise BadInput(f"trigger {key} must be a string")
    grace = _int_or_none("trigger grace_ms", value.get("grace_ms"))
    options = TriggerOptions(cron=value.get("cron"), tz=value.get("tz"), misfire=value.get("misfire"),
                             grace_ms=grace, overlap=value.get("overlap"))
    return (None if options == TriggerOptions() else options), False


def _retention(value: Any) -> dict[str, int | None]:
    if value is None:
        return {}
    if type(value) is not dict:
        raise BadInput(f"retention must be an object with some of {', '.join(_RETENTION)}")
    # `task show --json` also writes where each bound comes from: those keys are read-only.
    # A bound whose `_from` says `global` is the config's, not the task's own: not taken as one.
    given = {k: value[k] for k in _RETENTION
             if k in value and value.get(k.removesuffix("_ms") + "_from") != "global"}
    unknown = set(value) - set(_RETENTION) - {"max_age_from", "max_runs_from"}
    if unknown:
        raise BadInput(f"unknown retention field(s) {sorted(unknown)}")
    for key, v in given.items():
        _int_or_none(f"retention {key}", v)
    TaskRetention(**given)  # the domain's range checks, before anything is written
    return given
