"""The control ROUTER's failed sends to a peer, logged at most once per peer per interval: a peer
that left (its worker stopped, its session ended) is no reason to log every nudge."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("qlactors.bridge")

PEER_FAILURE_LOG_S = 60.0  # `peer_send_failed` is logged once per peer per this long, with a count
_PEERS_REMEMBERED = 1024  # peers whose last log line is remembered (older ones are dropped)


class PeerFailures:
    def __init__(self) -> None:
        self._seen: dict[bytes, tuple[float, int]] = {}  # peer -> (last logged, failures unlogged since)

    def failed(self, peer: bytes, err: Exception) -> None:
        """Log `event=peer_send_failed` unless this peer's last line is younger than
        PEER_FAILURE_LOG_S; the next line says how many went unlogged in between."""
        now = time.monotonic()
        last, unlogged = self._seen.get(peer, (None, 0))
        if last is not None and now - last < PEER_FAILURE_LOG_S:
            self._seen[peer] = (last, unlogged + 1)
            return
        if len(self._seen) >= _PEERS_REMEMBERED:
            self._seen = {p: v for p, v in self._seen.items() if now - v[0] < PEER_FAILURE_LOG_S}
        self._seen[peer] = (now, 0)
        log.warning("event=peer_send_failed peer=%s error=%s unlogged_since=%d", peer.hex()[:16], err, unlogged)
