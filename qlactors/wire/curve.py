"""CurveZMQ on the control side: the allow-list cache, the ZAP authenticator, the socket options.

The allow-list lives in the database (`worker_allow_list`); a control replica refreshes this
cache from it every cycle with `AllowList.replace`. The authenticator's thread consults only the
cache — a ZAP handler that waited on a database would stall every handshake of the process.
ZAP runs at handshake only, so the bridge also maps each message's `User-Id` through the cache:
a key removed from it stops being served at its next message, on a live connection too.

Traps this module exists for (SEMANTICS.md §9, STYLE.md): without a running ZAP handler libzmq
lets CURVE peers in (libzmq #2594) — the server socket therefore sets ZAP_ENFORCE_DOMAIN, and
the bridge refuses to serve while `Authenticator.is_alive()` is false; a ThreadAuthenticator
that is garbage collected stops (pyzmq #1520) — the caller keeps the `Authenticator`; there is
one ZAP endpoint per context — one `start_authenticator` per server context.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

import zmq
from zmq.utils import z85

from ..domain.results import Result
from ..errors import BadInput, QlactorsError
from .messages import Ack

log = logging.getLogger("qlactors.curve")

# The ZAP domain of every qlactors server socket; the authenticator answers for it alone.
ZAP_DOMAIN = "qlactors"
# A CURVE key in Z85 text: 32 bytes -> 40 characters of the Z85 alphabet.
_Z85_KEY = re.compile(r"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")
# The refusal's detail for a frame whose key the allow-list does not hold (any more).
REFUSED_KEY = "unknown or revoked key"


class AuthenticatorDown(QlactorsError, RuntimeError):
    """The CurveZMQ authenticator of a serving bridge is not running: the bridge stops serving."""


def is_z85_key(text: object) -> bool:
    """True for a 40-character Z85 text, the form `zmq.curve_keypair()` and key files use."""
    return isinstance(text, str) and _Z85_KEY.fullmatch(text) is not None


class AllowList:
    """The replica's cache {Z85 public key -> worker id}; read by the auth thread and the bridge.

    `replace` swaps in a new read-only mapping with one reference assignment, which is atomic in
    Python: a reader sees the old list or the new one, never a mix, and takes no lock.
    """

    def __init__(self, mapping: Mapping[str, str] | None = None) -> None:
        self._keys: Mapping[str, str] = MappingProxyType({})
        if mapping:
            self.replace(mapping)

    def replace(self, mapping: Mapping[str, str]) -> None:
        """Serve exactly `mapping` from now on (the keys the database allows and their worker ids)."""
        fresh: dict[str, str] = {}
        for key, worker_id in mapping.items():
            if not is_z85_key(key):
                raise BadInput(f"allow-list key {key!r:.60} is not a 40-character Z85 CURVE public key")
            if not isinstance(worker_id, str) or not worker_id:
                raise BadInput(f"allow-list key {key} maps to {worker_id!r}, not a worker id")
            fresh[key] = worker_id
        self._keys = MappingProxyType(fresh)

    def worker_for(self, public_key: str) -> str | None:
        """The worker id bound to `public_key` (Z85 text), or None when the key is not allowed."""
        return self._keys.get(public_key)

    def __len__(self) -> int:
        return len(self._keys)


def _cached_curve_authenticator(ctx: zmq.Context, allow_list: AllowList):
    """pyzmq's ZAP thread, answering CURVE requests from an AllowList only.

    Built on first use: zmq.auth.thread imports asyncio (several MiB), which edge never needs.
    """
    from zmq.auth.thread import ThreadAuthenticator

    class CachedCurveAuthenticator(ThreadAuthenticator):
        def callback(self, domain: str, key: bytes) -> bool:
            """The credentials provider pyzmq calls on its auth thread, with the Z85 key as bytes."""
            text = key.decode("ascii", "replace")
            allowed = allow_list.worker_for(text) is not None
            if not allowed:
                log.warning("event=curve_denied domain=%s key=%s reason=unknown_key", domain, text)
            return allowed

        def curve_user_id(self, client_public_key: bytes) -> str:
            """The ZAP User-Id of an accepted peer: its key in Z85 text (the bridge maps it per message)."""
            return z85.encode(client_public_key).decode("ascii")

    return CachedCurveAuthenticator(ctx, log=log)


class Authenticator:
    """A running ZAP handler on one context. Keep it referenced for the life of the server socket."""

    def __init__(self, impl: Any) -> None:  # a started CachedCurveAuthenticator
        self._impl = impl

    def is_alive(self) -> bool:
        return self._impl.is_alive()

    def stop(self) -> None:
        """Stop the ZAP thread; a server socket with ZAP_ENFORCE_DOMAIN then admits no one new."""
        self._impl.stop()


def start_authenticator(ctx: zmq.Context, allow_list: AllowList) -> Authenticator:
    """Start the ZAP handler of `ctx` (before the server socket binds) serving `allow_list`."""
    impl = _cached_curve_authenticator(ctx, allow_list)
    impl.start()  # binds inproc://zeromq.zap.01 on ctx; raises if ctx has one already
    impl.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=impl)
    if not impl.is_alive():
        impl.stop()
        raise RuntimeError("the CurveZMQ authenticator thread did not start")
    log.info("event=curve_authenticator_started domain=%s keys=%d", ZAP_DOMAIN, len(allow_list))
    return Authenticator(impl)


@dataclass(frozen=True, slots=True)
class CurveServer:
    """What a control side's bridge needs to serve tcp with CurveZMQ."""

    secret_key: bytes  # the replicas' shared server secret key, Z85 bytes
    allow_list: AllowList  # the cache the ZAP handler and the bridge read
    authenticator: Authenticator  # the running ZAP handler on the server socket's context

    def __post_init__(self) -> None:
        if not _is_key_bytes(self.secret_key):
            raise BadInput("the CURVE server secret key must be 40 bytes of Z85 text")

    def __repr__(self) -> str:  # never the secret key
        return f"CurveServer(keys={len(self.allow_list)}, authenticator_alive={self.authenticator.is_alive()})"

    def require_alive(self) -> None:
        """Raise AuthenticatorDown unless the ZAP handler runs (a dead one would admit anyone)."""
        if not self.authenticator.is_alive():
            log.error("event=curve_authenticator_down action=stop_serving")
            raise AuthenticatorDown("the CurveZMQ authenticator is not running, so no peer can be "
                                    "authenticated; restart the replica")

    def worker_of(self, frame: zmq.Frame) -> tuple[str | None, str | None]:
        """(the frame's ZAP User-Id, the worker id the allow-list binds it to now); None when absent."""
        try:
            key = frame.get("User-Id") or None
        except zmq.ZMQError:  # no ZAP metadata on this frame
            key = None
        return key, None if key is None else self.allow_list.worker_for(key)


def wrong_worker_claim(message: object, worker_id: str) -> Ack | None:
    """The refusal of a message that names a worker id other than its key's; None when it does not.

    An empty `worker_id` field names no one (a worker learns its id in Welcome) and passes.
    """
    claimed = getattr(message, "worker_id", "")
    if not claimed or claimed == worker_id:
        return None
    return Ack(answer_to=getattr(message, "request_id", ""), of=message.KIND, run_id=getattr(message, "run_id", ""), attempt_id=getattr(message, "attempt_id", ""),
               offer_id=getattr(message, "offer_id", ""), result=Result.REFUSED.value, detail=f"this key is bound to worker {worker_id!r}, not {claimed!r}"[:500])


def _is_key_bytes(value: object) -> bool:
    return isinstance(value, bytes) and is_z85_key(value.decode("ascii", "replace"))


def server_socket_options(secret_key: bytes) -> list[tuple[int, int | bytes]]:
    """Options of a CURVE server socket: the server key, our ZAP domain, ZAP enforced."""
    if not _is_key_bytes(secret_key):
        raise BadInput("the CURVE server secret key must be 40 bytes of Z85 text")
    return [(zmq.CURVE_SERVER, 1), (zmq.CURVE_SECRETKEY, secret_key),
            (zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode()),
            # Without a ZAP handler answering, libzmq would let every CURVE client in.
            (zmq.ZAP_ENFORCE_DOMAIN, 1)]


def client_socket_options(public: bytes, secret: bytes, server_public: bytes) -> list[tuple[int, int | bytes]]:
    """Options of a CURVE client socket: its own key pair and the server's public key."""
    for name, value in (("public", public), ("secret", secret), ("server public", server_public)):
        if not _is_key_bytes(value):
            raise BadInput(f"the CURVE {name} key must be 40 bytes of Z85 text")
    return [(zmq.CURVE_SERVERKEY, server_public), (zmq.CURVE_PUBLICKEY, public),
            (zmq.CURVE_SECRETKEY, secret)]
