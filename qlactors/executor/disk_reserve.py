"""Executor side: the disk reserve of an edge runtime: below it no attempt starts and queued runs wait
(SEMANTICS.md §11; docs/edge.md). `status` shows the hold from a small file in the home."""

from __future__ import annotations

import logging
from typing import Any, Callable

from ..clock import wall_ms
from ..runtime.home import clear_disk_hold, write_disk_hold

log = logging.getLogger("qlactors.supervisor")


class DiskReserve:
    """Whether the logs' file system has room for another attempt; logs and publishes each hold once."""

    def __init__(self, config: Any, free_bytes: Callable[[], int] | None) -> None:
        self.config = config
        self.free_bytes = free_bytes
        self.disk_held_since_ms: int | None = None  # set while the reserve holds attempts back
        # A hold published by a runtime that died is not this one's.
        self._publish_hold(lambda: clear_disk_hold(config.home))

    def has_room(self) -> bool:
        """The disk reserve: below it no attempt starts and queued runs wait (logged once per hold).

        No timer watches the disk: while runs wait, every cycle nudges the executors, whose next
        pull checks again, so queued runs start within a tick of space coming back.
        """
        reserve = self.config.runtime.disk_reserve_bytes
        if reserve <= 0 or self.free_bytes is None:
            return True
        try:
            free = self.free_bytes()
        except OSError as err:  # cannot tell: do not stop work on a guess, the log create will say
            log.warning("event=disk_free_unknown path=%s error=%s", self.config.logs_dir, err)
            return True
        home = self.config.home
        if free < reserve:
            if self.disk_held_since_ms is None:
                self.disk_held_since_ms = wall_ms()
                log.warning("event=disk_reserve_hold free=%d reserve=%d path=%s", free, reserve,
                            self.config.logs_dir)
                self._publish_hold(lambda: write_disk_hold(
                    home, free_bytes=free, reserve_bytes=reserve, path=str(self.config.logs_dir),
                    since_ms=self.disk_held_since_ms))
            return False
        if self.disk_held_since_ms is not None:
            held_s = (wall_ms() - self.disk_held_since_ms) / 1000
            self.disk_held_since_ms = None
            self._publish_hold(lambda: clear_disk_hold(home))
            log.info("event=disk_reserve_released free=%d reserve=%d held_s=%.1f", free, reserve, held_s)
        return True

    @staticmethod
    def _publish_hold(write: Callable[[], None]) -> None:
        # A nearly full disk may refuse even this small file: `status` then misses the reason,
        # the hold itself (and its log line) stands.
        try:
            write()
        except OSError as err:
            log.warning("event=disk_hold_status_unwritten error=%s", err)

