"""The control ROUTER's failed sends to a peer. A peer whose worker has a live session is logged,
naming the worker, at most once per peer per interval; one no live session is known by (a
worker that stopped, reconnected or moved to another replica: its session goes on elsewhere or
ends) is no news and is logged at debug level only."""

from __future__ import annotations

import logging
import time

from .pacing import LogLimit

log = logging.getLogger("qlactors.bridge")

PEER_FAILURE_LOG_S = 60.0  # `peer_send_failed` is logged once per peer per this long, with a count


class PeerFailures:
    def __init__(self) -> None:
        self._limit = LogLimit(PEER_FAILURE_LOG_S)

    def failed(self, peer: bytes, worker: str, err: Exception) -> None:
        """A send to `peer` failed. `worker` names its live session's worker ("" when none is known):
        `event=peer_send_failed` then, unless this peer's last line is younger than
        PEER_FAILURE_LOG_S; the next line says how many went unlogged in between."""
        if not worker:
            log.debug("event=peer_send_failed peer=%s error=%s session=none", peer.hex()[:16], err)
            return
        unlogged = self._limit.admit(peer, time.monotonic())
        if unlogged is not None:
            log.warning("event=peer_send_failed worker=%s peer=%s error=%s unlogged_since=%d", worker,
                        peer.hex()[:16], err, unlogged)
