"""Store: the HTTP API's bearer tokens (issue 20): `qlactors token new|revoke|list` make, end and
list them, and the web server asks `check` on every request. Only the SHA-256 of a secret is
kept; the secret itself is shown once, by `new`, and never written anywhere.

Nothing is cached: every `check` reads the table, so a revoke takes effect on the next request.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update

from ...errors import AlreadyExists, BadInput, Conflict, NotFound
from ...ids import new_id
from ..engine import Store
from ..schema import api_tokens

SECRET_PREFIX = "qlt_"  # says what a leaked string is (secret scanners key on such prefixes)
MAX_SECRET_CHARS = 256  # longer is no secret `new` made: refused before it is hashed
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


def secret_hash(secret: str) -> str:
    """The SHA-256 hex of a secret: the only form of it the table holds (64 characters).

    `surrogatepass`: any str hashes (a lone surrogate, from undecodable bytes, included) and
    simply matches nothing, since the secrets `new` makes are ASCII."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def check_token_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise BadInput(f"token name {name!r}: use 1-64 letters, digits, '.', '_' or '-'; "
                       "nothing was written")
    return name


@dataclass(frozen=True, slots=True)
class TokenView:
    name: str
    read_only: bool  # may read everything, change nothing
    created_at_ms: int  # database time
    revoked_at_ms: int | None  # None: live

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "read_only": self.read_only, "created_at_ms": self.created_at_ms,
                "revoked_at_ms": self.revoked_at_ms}


def _view(row) -> TokenView:
    return TokenView(name=row.name, read_only=bool(row.read_only), created_at_ms=row.created_at_ms,
                     revoked_at_ms=row.revoked_at_ms)


_LIVE = api_tokens.c.revoked_at_ms.is_(None)


class ApiTokens:
    """Every method is one short transaction; no method caches anything."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def new(self, name: str, *, read_only: bool = False) -> tuple[TokenView, str]:
        """A new live token NAME and its secret, which the caller shows once: only its hash is
        written. A live token of that name already is refused (AlreadyExists), nothing written;
        a revoked one's name may be used again."""
        check_token_name(name)
        if type(read_only) is not bool:
            raise BadInput(f"read_only must be true or false, not {read_only!r}; nothing was written")
        secret = SECRET_PREFIX + secrets.token_urlsafe(32)
        with self.store.write() as conn:
            now = self.store.now_ms(conn)
            # The partial unique index (one live token per name) decides a race between two `new`.
            added = self.store.insert_new(conn, api_tokens, dict(
                id=new_id(), name=name, secret_hash=secret_hash(secret), read_only=read_only,
                created_at_ms=now, revoked_at_ms=None))
            taken = None if added else conn.execute(select(api_tokens.c.id).where(
                api_tokens.c.name == name, _LIVE)).first()
        if not added:
            if taken is not None:
                raise AlreadyExists(f"a live token named {name} already exists; nothing was written: "
                                    f"revoke it first (`qlactors token revoke {name}`), or pick another name")
            raise Conflict(f"token {name}: the new secret collided with a stored one; nothing was "
                           "written, try again")
        return TokenView(name, read_only, now, None), secret

    def revoke(self, name: str) -> TokenView:
        """End the live token NAME: from the next request on, its secret checks as nothing."""
        check_token_name(name)
        with self.store.write() as conn:
            row = conn.execute(
                update(api_tokens).where(api_tokens.c.name == name, _LIVE)
                .values(revoked_at_ms=self.store.now_ms(conn))
                .returning(api_tokens.c.name, api_tokens.c.read_only, api_tokens.c.created_at_ms,
                           api_tokens.c.revoked_at_ms)).first()
        if row is None:
            raise NotFound(f"no live token named {name}; nothing to revoke (`qlactors token list` "
                           "shows them)")
        return _view(row)

    def list(self) -> list[TokenView]:
        """The live tokens by name, then the revoked ones by name, each name's oldest revoke first."""
        with self.store.read() as conn:
            rows = conn.execute(select(api_tokens).order_by(
                api_tokens.c.revoked_at_ms.is_not(None), api_tokens.c.name,
                api_tokens.c.revoked_at_ms, api_tokens.c.id)).all()
        return [_view(row) for row in rows]

    def check(self, secret: object) -> TokenView | None:
        """The live token whose secret this is, else None (wrong, revoked, not a str, longer than
        any secret `new` makes).

        The row is found by the secret's hash, so what a lookup's timing could leak is about the
        hash, never the secret; the stored hash is then compared in constant time all the same."""
        if not isinstance(secret, str) or not secret or len(secret) > MAX_SECRET_CHARS:
            return None
        wanted = secret_hash(secret)
        with self.store.read() as conn:
            row = conn.execute(select(api_tokens).where(api_tokens.c.secret_hash == wanted, _LIVE)).first()
        if row is None or not hmac.compare_digest(row.secret_hash.encode("ascii"), wanted.encode("ascii")):
            return None
        return _view(row)
