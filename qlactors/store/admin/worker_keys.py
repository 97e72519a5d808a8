"""Store: the allow-list of worker keys (SEMANTICS.md §9 Identity): which CurveZMQ public key speaks for
which worker id. `allow` binds one key to one worker id; `revoke` removes the binding and ends
the worker's sessions in the same transaction (revoking fences); `all` is what a replica caches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlalchemy import delete, or_, select

from ...errors import BadInput, NotFound
from ..dispatch.session_rows import end_live_sessions
from ..engine import Store
from ..schema import worker_keys

_WORKER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_Z85 = re.compile(r"^[0-9A-Za-z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$")


def check_worker_id(worker_id: object) -> str:
    if not isinstance(worker_id, str) or not _WORKER_ID.match(worker_id):
        raise BadInput(f"worker id {worker_id!r}: use 1-128 letters, digits, '.', '_' or '-', "
                       "starting with a letter or digit")
    return worker_id


@dataclass(frozen=True, slots=True)
class Revocation:
    worker_id: str
    sessions_ended: int  # sessions that were live or resumable (drained) and are ended by it now


class WorkerKeys:
    """Every method is one short transaction."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def allow(self, worker_id: str, public_key_z85: str) -> bool:
        """Bind `public_key_z85` to `worker_id`; False when exactly this binding already exists.

        One key per worker id and one worker id per key: any other existing binding of either
        is refused (BadInput), nothing written.
        """
        check_worker_id(worker_id)
        if not isinstance(public_key_z85, str) or not _Z85.match(public_key_z85):
            raise BadInput("the public key must be the 40-character Z85 text of a CURVE key")
        with self.store.write() as conn:
            now = self.store.now_ms(conn)
            if self.store.insert_new(conn, worker_keys, dict(
                    worker_id=worker_id, public_key=public_key_z85, created_at_ms=now)):
                return True
            found = conn.execute(select(worker_keys).where(or_(
                worker_keys.c.worker_id == worker_id,
                worker_keys.c.public_key == public_key_z85))).all()
        for row in found:
            if row.worker_id == worker_id and row.public_key == public_key_z85:
                return False
        for row in found:
            if row.worker_id == worker_id:
                raise BadInput(f"worker {worker_id} is already allowed with another key; nothing was "
                               f"changed: `qlactors worker revoke {worker_id}` first to replace it")
            raise BadInput(f"this key is already allowed for worker {row.worker_id}; nothing was "
                           "changed: a key speaks for one worker id only (make another pair with "
                           "`qlactors keys new NAME`)")
        raise BadInput(f"worker {worker_id}: the binding changed meanwhile; nothing was changed, "
                       "try again")

    def revoke(self, worker_id: str) -> Revocation:
        """Remove the worker's key and end its sessions (`session_rows.end_live_sessions`: drained
        ones included, none of them ever resumed), in one transaction: every report from them is
        fenced from then on."""
        check_worker_id(worker_id)
        with self.store.write() as conn:
            # The same serialisation as a registration of this worker (store/dispatch/sessions.py).
            self.store.advisory_lock(conn, f"worker:{worker_id}")
            ended = end_live_sessions(conn, worker_id, self.store.now_ms(conn), "revoked")
            removed = conn.execute(delete(worker_keys).where(worker_keys.c.worker_id == worker_id)).rowcount
            if not removed and not ended:
                raise NotFound(f"worker {worker_id} is not on the allow-list; nothing to revoke")
        return Revocation(worker_id, ended)

    def all(self) -> dict[str, str]:
        """public key (Z85 text) -> worker id, for a replica's cache."""
        with self.store.read() as conn:
            return {row.public_key: row.worker_id
                    for row in conn.execute(select(worker_keys.c.public_key, worker_keys.c.worker_id))}
