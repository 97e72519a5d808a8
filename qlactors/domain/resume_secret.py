"""The resume secret a Welcome carries, derived instead of drawn (SEMANTICS.md §9 Register once).

A Register repeated with the same `register_id` — a re-sent copy, or the same Register reaching
another replica — must get the same secret as the first copy, yet the database keeps only the
secret's hash. So the control side derives it: HMAC-SHA256 keyed with the replicas' shared CURVE
server secret key (every replica loads the same key pair, docs/cluster.md) over the worker id and
the register id. Only a replica can compute it; one worker's register ids never give another
worker's secret; every register id gives its own.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

_DOMAIN = b"qlactors resume secret 1\n"


def resume_secret(server_secret_key: bytes, worker_id: str, register_id: str) -> str:
    """The secret for the session that the Register `register_id` of `worker_id` opened or
    resumed: 43 base64url characters (256 bits), like `secrets.token_urlsafe(32)`."""
    if not isinstance(server_secret_key, bytes) or len(server_secret_key) < 32:
        raise ValueError("the resume secret is keyed with the replica's secret key (at least 32 bytes)")
    if not worker_id or not register_id:
        raise ValueError("a resume secret needs the worker id and the register id")
    message = _DOMAIN + json.dumps([worker_id, register_id], ensure_ascii=True).encode("ascii")
    digest = hmac.new(server_secret_key, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")
