"""The `qlactors` command: parse, open the home's store, dispatch, and map errors to exit codes."""

from __future__ import annotations

import os
import sys
from typing import Callable

from .. import config as config_mod
from ..errors import QlactorsError
from .parser import build

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE = 0, 1, 2


def _split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """Everything after the first `--` is the job's command, never qlactors' options."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, None


def _handler(args) -> Callable:
    from . import commands, runtime_commands  # loads the store only when a command really runs

    if args.command == "audit":
        return runtime_commands.audit_receipts
    if args.command != "task":
        return {"run": runtime_commands.run, "runs": commands.runs, "show": commands.show,
                "cancel": commands.cancel, "retry": commands.retry, "edge": runtime_commands.edge,
                "status": runtime_commands.status, "logs": runtime_commands.logs}[args.command]
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
    parser = build()
    args = parser.parse_args(own)
    if words is not None and not (args.command == "task" and args.task_command in ("add", "update")):
        parser.error("`-- COMMAND` belongs to `task add` and `task update` only")
    args.words = words
    try:
        from ..home import check_home
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
            from ..home import nudge

            nudge(cfg.home)  # a running runtime acts at once instead of at its next tick
        return status
    except QlactorsError as err:
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
