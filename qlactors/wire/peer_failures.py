"""The control ROUTER's failed sends to a peer, logged at most once per peer per interval: a peer
that left (its worker stopped, its session ended) is no reason to log every nudge."""

from __future__ import annotations

import logging
import time

from .pacing import LogLimit

log = logging.getLogger("qlactors.bridge")

PEER_FAILURE_LOG_S = 60.0  # `peer_send_failed` is logged once per peer per this long, with a count


class PeerFailures:
    def __init__(self) -> None:
        self._limit = LogLimit(PEER_FAILURE_LOG_S)

    def failed(self, peer: bytes, err: Exception) -> None:
        """Log `event=peer_send_failed` unless this peer's last line is younger than
        PEER_FAILURE_LOG_S; the next line says how many went unlogged in between."""
        unlogged = self._limit.admit(peer, time.monotonic())
        if unlogged is not None:
            log.warning("event=peer_send_failed peer=%s error=%s unlogged_since=%d", peer.hex()[:16], err, unlogged)
