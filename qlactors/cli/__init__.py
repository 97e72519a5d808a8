"""The `qlactors` command: parse, open the home's store, dispatch, and map errors to exit codes."""

from __future__ import annotations

import os
import sys
from typing import Callable

from .. import config as config_mod
from ..errors import BadInput, QlactorsError
from .common import EXIT_OK, EXIT_RUNTIME
from .parser import build

# The commands that act on a cluster database when one is named (ARCHITECTURE.md "Command line").
CLUSTER_COMMANDS = frozenset({"task", "run", "runs", "show", "logs", "cancel", "retry", "status",
                              "workers", "worker", "confirm-stopped", "token", "notify", "web"})
# ...and those that mean nothing on an edge home: refused there, before the home is touched.
CLUSTER_ONLY = frozenset({"workers", "worker"})
NO_CLUSTER_DATABASE = "no cluster database: pass --config control.toml or set QLACTORS_DATABASE_URL"


def _dashed_name(own: list[str]) -> QlactorsError | None:
    """`task add -dash ...`: argparse would take `-dash` for an option and say that a name is
    missing; the word meant as the name is named instead (a task name starts with a letter or digit)."""
    at = next((i for i in range(len(own) - 2) if own[i] == "task" and own[i + 1] in _NAMED), None)
    word = None if at is None else own[at + 2]
    if word is None or not word.startswith("-") or word.startswith("--") or word == "-h":
        return None
    from ..domain.model import validate_name

    try:
        validate_name(word)
    except QlactorsError as err:
        return err
    return None


_NAMED = ("add", "update", "enable", "disable", "show", "rm")


def _split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """Everything after the first `--` is the job's command, never qlactors' options."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, None


def _handler(args) -> Callable:
    if args.command == "notify":
        from . import notify_commands

        return {"add": notify_commands.notify_add, "list": notify_commands.notify_list,
                "rm": notify_commands.notify_rm}[args.notify_command]
    if args.command == "web":
        from . import web_commands

        return web_commands.web
    if args.command == "token":  # changes no intent: nothing to nudge (`_changes_intent`)
        from . import token_commands

        return {"new": token_commands.token_new, "revoke": token_commands.token_revoke,
                "list": token_commands.token_list}[args.token_command]
    from . import cluster_commands, commands, runtime_commands  # the store loads only when a command runs

    on_cluster = args.cluster is not None
    if args.command == "audit":
        return runtime_commands.audit_receipts
    if args.command == "worker":
        return {"allow": cluster_commands.worker_allow, "revoke": cluster_commands.worker_revoke,
                "retire": cluster_commands.worker_retire}[
            args.worker_command]
    if args.command != "task":
        return {"run": runtime_commands.run, "runs": commands.runs, "show": commands.show,
                "cancel": commands.cancel, "retry": commands.retry, "edge": runtime_commands.edge,
                "workers": cluster_commands.workers, "confirm-stopped": cluster_commands.confirm_stopped,
                "status": cluster_commands.status if on_cluster else runtime_commands.status,
                "logs": cluster_commands.logs if on_cluster else runtime_commands.logs}[args.command]
    return {
        "add": lambda repo, a: commands.task_add(repo, a, a.words),
        "update": lambda repo, a: commands.task_update(repo, a, a.words),
        "enable": lambda repo, a: commands.task_enable(repo, a, True),
        "disable": lambda repo, a: commands.task_enable(repo, a, False),
        "list": commands.task_list,
        "show": commands.task_show,
        "rm": commands.task_rm,
    }[args.task_command]


def _changes_intent(args) -> bool:
    return args.command == "cancel" or (args.command == "task" and args.task_command != "list"
                                         and args.task_command != "show")


def main(argv: list[str] | None = None) -> int:
    own, words = _split_command(list(sys.argv[1:] if argv is None else argv))
    dashed = _dashed_name(own)
    if dashed is not None:
        print(f"qlactors: {dashed}", file=sys.stderr)
        return dashed.exit_status
    parser = build()
    args = parser.parse_args(own)
    if words is not None and not (args.command == "task" and args.task_command in ("add", "update")):
        parser.error("`-- COMMAND` belongs to `task add` and `task update` only")
    args.words = words
    try:
        if _without_store(args):
            from . import cluster_commands

            return {"keys": cluster_commands.keys_new, "control": cluster_commands.control,
                    "worker": cluster_commands.worker}[args.command](args)
        return _on_store(args)
    except QlactorsError as err:
        if err.exit_status is None:  # a bug, not an answer: its traceback says where
            raise
        print(f"qlactors: {err}", file=sys.stderr)
        return err.exit_status
    except BrokenPipeError:  # the reader went away (`| head`): nothing is wrong, say nothing
        _silence_stdout()
        return EXIT_OK
    except OSError as err:  # the file system refused something no check above foresaw
        where = f" ({err.filename})" if err.filename else ""
        print(f"qlactors: {err.strerror or err}{where}; the command stopped there", file=sys.stderr)
        return EXIT_RUNTIME
    except KeyboardInterrupt:
        print("qlactors: interrupted", file=sys.stderr)
        return 130


def _without_store(args) -> bool:
    """`keys new` touches files only; `control` and `worker` (to run) open what their runtime opens."""
    return args.command in ("keys", "control") or (args.command == "worker" and args.worker_command is None)


def _on_store(args) -> int:
    """Every other command: on the cluster database (`--config control.toml` or
    $QLACTORS_DATABASE_URL) when one is named, else on the edge home as always."""
    from .target import cluster_target

    args.cluster = cluster_target(args.config) if args.command in CLUSTER_COMMANDS else None
    if args.cluster is not None:
        args.cfg = None
        handler = _handler(args)
        repo = args.cluster.open()
        try:
            return handler(repo, args)  # no runtime socket to nudge: replicas act on their tick
        finally:
            repo.close()
    if args.command in CLUSTER_ONLY:
        what = args.command if args.command == "workers" else f"worker {args.worker_command}"
        raise BadInput(f"{NO_CLUSTER_DATABASE} (`{what}` acts on a cluster; nothing was created)")
    if args.command == "confirm-stopped":
        raise BadInput("`confirm-stopped` is for a cluster (give --config control.toml or set "
                       "$QLACTORS_DATABASE_URL): on edge, recovery reads the process itself; nothing was changed")
    return _on_home(args)


def _on_home(args) -> int:
    from ..runtime.home import check_home
    from ..store.repository import Repository

    cfg = config_mod.load(args.home, args.config, profile=getattr(args, "profile", None))
    config_mod.ensure_home(cfg)
    args.cfg = cfg
    handler = _handler(args)
    if check_home(cfg.home, cfg.database_url, audit=args.command == "audit") is not None:
        return handler(None, args)  # `audit` without a database: it never creates one
    repo = Repository.open(cfg.database_url)
    try:
        status = handler(repo, args)
    finally:
        repo.close()
    if status == EXIT_OK and _changes_intent(args):
        from ..runtime.home import nudge

        nudge(cfg.home)  # a running runtime acts at once instead of at its next tick
    return status


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the flush at exit does not fail again on the closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def entry() -> None:
    try:
        status = main()
        sys.stdout.flush()  # buffered output meets a closed pipe here, not in main
    except BrokenPipeError:
        _silence_stdout()
        status = EXIT_OK
    sys.exit(status)
