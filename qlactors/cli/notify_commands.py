"""CLI: `notify add|list|rm`, where to tell about runs that end in some states (delivered by
`qlactors web`: docs/web.md "Notifications"), on the edge home or a cluster database alike."""

from __future__ import annotations

import argparse
import sys

from ..errors import BadInput
from ..store.admin.notifications import Notifications, RuleView
from ..store.repository import Repository
from .common import operator_name
from .render import dump_json, table, when

RULE_HEADER = ("ID", "TASK", "ON", "KIND", "CREATED", "BY")


def notify_add(repo: Repository, args: argparse.Namespace) -> int:
    given = {"webhook": args.webhook, "apprise": args.apprise, "command": args.run_command}
    kind, target = next((k, v) for k, v in given.items() if v is not None)
    secret = None if args.secret_file is None else _read_secret(args.secret_file)
    rule = Notifications(repo.store).add_rule(task=args.task, on=args.on, kind=kind, target=target,
                                              actor_name=operator_name(), secret=secret)
    print(rule.id)
    return 0


def _read_secret(path: str) -> str:
    """A webhook's signing secret from a file, or stdin for `-` (never from the command line, which
    other users can read in `ps`), without its one trailing newline."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except (OSError, UnicodeDecodeError) as err:
        raise BadInput(f"--secret-file {path}: cannot read it ({getattr(err, 'strerror', None) or type(err).__name__}); "
                       "nothing was written") from None
    return text.removesuffix("\n").removesuffix("\r")


def notify_list(repo: Repository, args: argparse.Namespace) -> int:
    rules = Notifications(repo.store).rules()
    if args.json:
        dump_json([r.to_json() for r in rules])
    else:
        table([_row(r) for r in rules], RULE_HEADER)
    return 0


def _row(r: RuleView) -> tuple[str, ...]:
    kind = f"{r.kind} (signed)" if r.signed else r.kind
    return (r.id, r.task or "(every task)", ",".join(r.on_states), kind, when(r.created_at_ms), r.actor_name)


def notify_rm(repo: Repository, args: argparse.Namespace) -> int:
    Notifications(repo.store).remove_rule(args.rule_id)
    print(f"notification rule {args.rule_id} removed (notifications already queued are still delivered)")
    return 0
