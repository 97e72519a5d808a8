"""CLI: `token new|revoke|list`, the HTTP API's bearer tokens, on the edge home or a cluster
database alike. `token new` prints the secret alone on stdout (`T=$(qlactors token new ci)`);
what to know about it goes to stderr."""

from __future__ import annotations

import argparse

from ..store.admin.api_tokens import ApiTokens, TokenView
from ..store.repository import Repository
from .common import say
from .render import dump_json, table, when

TOKEN_HEADER = ("NAME", "ACCESS", "CREATED", "REVOKED")


def access(view: TokenView) -> str:
    return "read-only" if view.read_only else "read-write"


def token_new(repo: Repository, args: argparse.Namespace) -> int:
    view, secret = ApiTokens(repo.store).new(args.name, read_only=args.read_only)
    print(secret, flush=True)
    what = "read-only: it can read everything and change nothing" if view.read_only else "read-write"
    say(f"token {view.name} made ({what}); this secret is shown only once and only its hash is "
        "stored: keep it now (if it is lost, revoke the token and make another)")
    return 0


def token_revoke(repo: Repository, args: argparse.Namespace) -> int:
    view = ApiTokens(repo.store).revoke(args.name)
    print(f"token {view.name} revoked: its secret is refused from the next request on")
    return 0


def token_list(repo: Repository, args: argparse.Namespace) -> int:
    views = ApiTokens(repo.store).list()
    if args.json:
        dump_json([v.to_json() for v in views])
    else:
        table([(v.name, access(v), when(v.created_at_ms), when(v.revoked_at_ms)) for v in views],
              TOKEN_HEADER)
    return 0
