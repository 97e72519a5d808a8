"""What each `qlactors` command does: turn parsed arguments into repository calls and output."""

from __future__ import annotations

import argparse
import os
import shlex
import stat
import sys
from typing import Any

from ..domain.cron import grace_ms_from_seconds
from ..domain import posix
from ..domain.labels import check_labels
from ..domain.model import Command, TaskSpec, parse_env_pairs, seconds_to_ms
from ..domain.numbers import parse_whole
from ..domain.retention import RetentionPolicy, TaskRetention, parse_keep_days, parse_keep_runs
from ..domain.results import Result
from ..domain.retry import RetryPolicy
from ..domain.times import parse_when_ms
from ..errors import BadInput
from ..store.repository import Repository
from ..store.intent.triggers import TriggerOptions
from ..wire.offers import check_revision_fits
from .common import operator_name
from .render import (RUN_HEADER, TASK_HEADER, dump_json, notification_lines, placement as placement_line,
                     retention_line, run_detail, run_rows, schedule_line, table, task_detail, task_history, task_rows)


def _whole(option: str, text: str) -> int:
    return parse_whole(option, text)


def _directory(text: str) -> str:
    if not text:
        raise BadInput("--cwd needs a directory")
    return os.path.abspath(text)


def _check_cwd(repo: Repository, changes: dict[str, Any]) -> None:
    """Refuse a `--cwd` that this box can tell is no directory (edge: the jobs run here).

    Only a definite answer refuses (no such path, not a directory): a path this user may not
    look into is kept, and so is any path of a cluster task, whose jobs run on the workers; the
    job's start is the final judge there (`EXECUTOR_START_FAILED`).
    """
    path = changes.get("cwd")
    if path is None or repo.store.is_postgres:
        return
    try:
        found = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise BadInput(f"--cwd {path}: no such directory; nothing was written: create it first "
                       "or give another one") from None
    except OSError:
        return  # cannot be checked from here (permissions, a stale mount): the start decides
    if not stat.S_ISDIR(found.st_mode):
        raise BadInput(f"--cwd {path}: not a directory; nothing was written: give a directory")


def _timeout(text: str) -> int | None:
    ms = seconds_to_ms("--timeout", text)
    return None if ms == 0 else ms


def _backoff(text: str) -> dict[str, int]:
    base, _, top = text.partition(",")
    values = {"backoff_base_ms": seconds_to_ms("--backoff", base)}
    if top:
        values["backoff_max_ms"] = seconds_to_ms("--backoff", top)
    return values


# option name -> (TaskSpec field, parser of the user's text)
_SIMPLE = {
    "timeout": ("timeout_ms", _timeout),
    "stop_grace": ("stop_grace_ms", lambda t: seconds_to_ms("--stop-grace", t)),
    "max_concurrent": ("max_concurrent", lambda t: _whole("--max-concurrent", t)),
    "max_queued": ("max_queued", lambda t: _whole("--max-queued", t)),
    "random_delay": ("random_delay_ms", lambda t: seconds_to_ms("--random-delay", t)),
    "cwd": ("cwd", _directory),
    "env": ("env", parse_env_pairs),
    "keep_leftovers": ("keep_leftovers", bool),
    "require_label": ("labels", lambda given: check_labels("--require-label", given)),
}
_RETRY = {
    "retry_on_lost": lambda v: {"retry_on_lost": bool(v)},
    "max_attempts": lambda t: {"max_attempts": _whole("--max-attempts", t)},
    "safety": lambda t: {"safety": t},
    "backoff": _backoff,
}


def _changes(args: argparse.Namespace, base_retry: RetryPolicy) -> dict[str, Any]:
    """The TaskSpec fields the user set (options not given are absent from `args` on update)."""
    given = vars(args)
    changes = {field: parse(given[opt]) for opt, (field, parse) in _SIMPLE.items()
               if given.get(opt) is not None}
    retry: dict[str, Any] = {}
    for opt, parse in _RETRY.items():
        if given.get(opt) is not None:
            retry.update(parse(given[opt]))
    if given.get("no_require_label"):
        if "labels" in changes:
            raise BadInput("--no-require-label removes every required label: it takes no --require-label")
        changes["labels"] = ()
    if retry:
        current = {f: getattr(base_retry, f) for f in RetryPolicy.__dataclass_fields__}
        changes["retry"] = RetryPolicy(**{**current, **retry})
    return changes


def _trigger(args: argparse.Namespace) -> TriggerOptions | None:
    """The schedule options the user gave (--cron, --tz, --misfire, --grace, --overlap), or None."""
    given = vars(args)
    grace = given.get("grace")
    options = TriggerOptions(
        cron=given.get("cron"), tz=given.get("tz"), misfire=given.get("misfire"),
        grace_ms=None if grace is None else grace_ms_from_seconds(_whole("--grace", grace)),
        overlap=given.get("overlap"))
    return None if options == TriggerOptions() else options


def _retention(args: argparse.Namespace) -> dict[str, int | None]:
    """The retention bounds the user gave (--keep-days, --keep-runs; None: back to the global one)."""
    given = vars(args)
    found: dict[str, int | None] = {}
    if given.get("keep_days") is not None:
        found["max_age_ms"] = parse_keep_days(given["keep_days"])
    if given.get("keep_runs") is not None:
        found["max_runs"] = parse_keep_runs(given["keep_runs"])
    return found


def _global_retention(args: argparse.Namespace) -> RetentionPolicy:
    if args.cluster is not None:
        return args.cluster.retention
    rt = args.cfg.runtime
    return RetentionPolicy(max_age_ms=rt.retention_max_age_ms, max_runs=rt.retention_max_runs)


def _schedule_key(view) -> tuple | None:
    return None if view.trigger is None else (view.trigger.id, view.trigger.revision)


def task_add(repo: Repository, args: argparse.Namespace, words: list[str] | None) -> int:
    if not words:
        raise BadInput("no command given: put it after `--`, e.g. "
                       f"`qlactors task add {args.name} -- echo hello`")
    changes = _changes(args, RetryPolicy())
    _check_cwd(repo, changes)
    spec = TaskSpec(name=args.name, command=Command.from_words(words), **changes)
    view = repo.tasks.add(spec, trigger=_trigger(args), retention=TaskRetention(**_retention(args)),
                          check=check_revision_fits, actor_name=operator_name())
    print(f"task {view.name} added (revision {view.revision})")
    if view.trigger is not None:
        print(schedule_line(view))
    if not view.retention.is_default:
        print(retention_line(view, _global_retention(args)))
    _warn_unplaced(repo, args, view)
    return 0


def _warn_unplaced(repo: Repository, args: argparse.Namespace, view) -> None:
    from .placement import warn_unplaced

    warning = warn_unplaced(repo, args, view.name, view.spec.labels)
    if warning is not None:
        print(f"qlactors: {warning}", file=sys.stderr)


def task_update(repo: Repository, args: argparse.Namespace, words: list[str] | None) -> int:
    current = repo.tasks.get(args.name)
    changes = _changes(args, current.spec.retry)
    _check_cwd(repo, changes)
    if words:
        changes["command"] = Command.from_words(words)
    trigger, remove = _trigger(args), bool(getattr(args, "no_cron", False))
    if remove and trigger is not None:
        raise BadInput("--no-cron removes the schedule: it takes no --tz, --misfire, --grace or --overlap")
    view = repo.tasks.update(args.name, trigger=trigger, remove_trigger=remove, retention=_retention(args),
                             check=check_revision_fits, actor_name=operator_name(), **changes)
    rescheduled = _schedule_key(view) != _schedule_key(current)
    retained = view.retention != current.retention
    print(f"task {view.name} at revision {view.revision}"
          + ("" if view.revision != current.revision or rescheduled or retained else " (nothing changed)"))
    if rescheduled:
        print(schedule_line(view) if view.trigger is not None else "schedule removed")
    if retained:
        print(retention_line(view, _global_retention(args)))
    if "labels" in changes:
        _warn_unplaced(repo, args, view)
    return 0


def task_enable(repo: Repository, args: argparse.Namespace, enabled: bool) -> int:
    view = repo.tasks.set_enabled(args.name, enabled, actor_name=operator_name())
    print(f"task {view.name} {'enabled' if view.enabled else 'disabled'}")
    return 0


def task_list(repo: Repository, args: argparse.Namespace) -> int:
    views = repo.tasks.list()
    if args.json:
        default = _global_retention(args)
        dump_json([v.to_json(default) for v in views])
    else:
        table(task_rows(views), TASK_HEADER)
    return 0


def task_show(repo: Repository, args: argparse.Namespace) -> int:
    view = repo.tasks.get(args.name)
    if args.reveal is not None:
        return _reveal(view.spec.env, args)
    history = repo.tasks.history(args.name)
    qualifying = _qualifying(repo, args, view.spec.labels)
    if args.json:
        dump_json({**view.to_json(_global_retention(args)), "qualifying_workers": qualifying,
                   "history": [e.to_json() for e in history]})
    else:
        task_detail(view, _global_retention(args))
        placement_line(view.spec.labels, qualifying)
        task_history(history)
    return 0


def _reveal(env: dict[str, str], args: argparse.Namespace) -> int:
    """`task show NAME --reveal KEY`: one environment value, to a terminal (else only with
    `--force`: a value piped or redirected lands in a file or another program)."""
    if args.reveal not in env:
        names = ", ".join(sorted(env)) or "none"
        raise BadInput(f"task {args.name!r} has no environment variable {args.reveal!r} (it has: {names})")
    if not sys.stdout.isatty() and not args.force:
        raise BadInput(f"--reveal prints a secret value to a terminal only; stdout is not one (add --force to "
                       f"write {args.reveal!r} of task {args.name!r} to it anyway)")
    sys.stdout.flush()
    sys.stdout.buffer.write(posix.posix_bytes(env[args.reveal]) + b"\n")
    sys.stdout.flush()
    return 0


def _qualifying(repo: Repository, args: argparse.Namespace, labels: tuple[str, ...]) -> list[str] | None:
    """The workers a task's offers may go to now (cluster); None on edge, where the local runtime
    has no labels and runs the task only if it requires none."""
    if args.cluster is None:
        return None
    from ..store.admin.workers import Workers

    return [w.worker_id for w in Workers(repo.store).list().qualifying(labels)]


def task_rm(repo: Repository, args: argparse.Namespace) -> int:
    removal = repo.remove_task(args.name, force=args.force, actor_name=operator_name())
    for run_id in removal.cancelled:
        print(f"run {run_id} cancelled")
    for run_id in removal.requested:
        print(f"run {run_id}: cancel requested, the runtime stops it")
    print(f"task {removal.task} removed (its runs stay readable)")
    return 0


def runs(repo: Repository, args: argparse.Namespace) -> int:
    since = None if args.since is None else parse_when_ms("--since", args.since)
    until = None if args.until is None else parse_when_ms("--until", args.until)
    page = repo.runs.list(task=args.task, state=args.state, limit=args.limit, cursor=args.after,
                          created_since_ms=since, created_before_ms=until)
    if args.json:
        dump_json([r.to_json(detail=False) for r in page.runs])
    else:
        table(run_rows(page.runs), RUN_HEADER)
    if page.next_cursor:
        print(f"more: qlactors runs{_filters(args)} --after {page.next_cursor}", file=sys.stderr)
    return 0


def _filters(args: argparse.Namespace) -> str:
    """The filters of a `runs` page, as options to repeat with the next page's cursor."""
    given = (("--task", args.task), ("--state", args.state), ("--since", args.since), ("--until", args.until))
    return "".join(f" {option} {shlex.quote(value)}" for option, value in given if value is not None)


def show(repo: Repository, args: argparse.Namespace) -> int:
    view = repo.runs.get(args.run_id)
    waiting = _recovery_waiting(repo, args, view)
    placement = _placement_wait(repo, args, view)
    from ..store.admin.notifications import Notifications

    notifications = Notifications(repo.store).of_run(view.id)
    if args.json:
        data = {**view.to_json(), "waiting": placement, "notifications": notifications}
        boot_id, host = this_host()
        for attempt in data["attempts"]:
            # Known only when the attempt ran on the host reading it: the database holds the job's
            # boot id, not its host's name.
            attempt["host"] = host if attempt["boot_id"] is not None and attempt["boot_id"] == boot_id else None
            if waiting is not None and attempt["id"] == waiting.attempt_id:
                attempt["recovery"] = {"waiting": waiting.reason, "eligible_at_ms": waiting.eligible_at_ms}
        dump_json(data)
    else:
        run_detail(view)
        if placement is not None:
            print(f"\nwaiting: {placement}")
        if waiting is not None:
            print(f"\nrecovery: attempt {view.attempts[-1].number} waits: {waiting.reason}")
        notification_lines(notifications)
    return 0


def _placement_wait(repo: Repository, args: argparse.Namespace, view) -> str | None:
    """Why the queued run waits for a worker (its labels, or no worker online), else None."""
    if view.state != "queued":
        return None
    from ..store.intent.active_runs import required_labels
    from .placement import queued_reason, serving

    return queued_reason(view.state, required_labels(repo.store, view.id), serving(repo, args))


def this_host() -> tuple[str | None, str]:
    """This host's boot id (None when it cannot be read) and name."""
    import socket

    from ..process.identity import boot_id_source

    try:
        boot_id: str | None = boot_id_source()()
    except (OSError, ValueError):
        boot_id = None
    return boot_id, socket.gethostname()


def _recovery_waiting(repo: Repository, args: argparse.Namespace, view) -> Any:
    """On a cluster, why recovery has not judged the run's live attempt whose lease is missing or
    expired yet (SEMANTICS.md §10 step 1); None otherwise, and always on edge."""
    if args.cluster is None or not view.attempts or view.attempts[-1].state not in ("starting", "running"):
        return None
    from ..store.cadence.cluster_recovery import ClusterRecoveryCases

    settings = args.cluster.settings
    return ClusterRecoveryCases(repo.store, recovery_grace_ms=settings.recovery_grace_ms,
                                drain_grace_ms=settings.drain_grace_ms).waiting_for(view.attempts[-1].id)


_CANCEL_TEXT = {
    Result.CANCELLED: "cancelled",
    Result.REQUESTED: "cancel requested: the runtime stops the job and the run ends cancelled",
    Result.ALREADY_REQUESTED: "cancel already requested",
    Result.ALREADY_TERMINAL: "already finished ({state}): nothing to cancel",
}


def cancel(repo: Repository, args: argparse.Namespace) -> int:
    outcome = repo.runs.cancel(args.run_id, actor_name=operator_name())
    print(f"run {outcome.value.id}: " + _CANCEL_TEXT[outcome.result].format(state=outcome.run_state))
    return 0


def retry(repo: Repository, args: argparse.Namespace) -> int:
    """`retry RUN_ID [--wait]`: a new run of the same revision; stdout is its id, as for `run`."""
    from .runtime_commands import announce_and_follow, exactly_once, wait_options

    timeout_ms = wait_options(args)
    actor_name = operator_name()
    admission = exactly_once(lambda key: repo.runs.retry(args.run_id, idempotency_key=key, actor_name=actor_name),
                             f"the retry of {args.run_id}", "`qlactors runs --limit 5`")
    return announce_and_follow(repo, args, admission.run.id, timeout_ms)
