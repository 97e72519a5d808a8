"""The `qlactors` command: parse, open the home's store, dispatch, and map errors to exit codes."""

from __future__ import annotations

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
    from . import commands  # loads the store (sqlalchemy) only when a command really runs

    if args.command != "task":
        return {"run": commands.run, "runs": commands.runs, "show": commands.show,
                "cancel": commands.cancel}[args.command]
    return {
        "add": lambda repo, a: commands.task_add(repo, a, a.words),
        "update": lambda repo, a: commands.task_update(repo, a, a.words),
        "enable": lambda repo, a: commands.task_enable(repo, a, True),
        "disable": lambda repo, a: commands.task_enable(repo, a, False),
        "list": commands.task_list,
        "show": commands.task_show,
        "rm": commands.task_rm,
    }[args.task_command]


def main(argv: list[str] | None = None) -> int:
    own, words = _split_command(list(sys.argv[1:] if argv is None else argv))
    parser = build()
    args = parser.parse_args(own)
    if words is not None and not (args.command == "task" and args.task_command in ("add", "update")):
        parser.error("`-- COMMAND` belongs to `task add` and `task update` only")
    args.words = words
    try:
        from ..store.repository import Repository

        cfg = config_mod.load(args.home, args.config)
        config_mod.ensure_home(cfg)
        handler = _handler(args)
        repo = Repository.open(cfg.database_url)
        try:
            return handler(repo, args)
        finally:
            repo.close()
    except QlactorsError as err:
        print(f"qlactors: {err}", file=sys.stderr)
        return err.exit_status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK


def entry() -> None:
    sys.exit(main())
