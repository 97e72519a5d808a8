"""Shared: database outages in the runtime: the retry delay of a message that met one, what `status`
shows while it lasts, and the stop when it outlasts `store_outage_stop_ms`."""

from __future__ import annotations

import logging
import threading

from ..store.health import Outage
from .context import SharedContext
from .home import clear_store_outage, write_store_outage

log = logging.getLogger("qlactors.outage")

FIRST_RETRY_S = 0.05
MAX_RETRY_S = 2.0


def retry_delay_s(tries: int) -> float:
    """Exponential backoff for the `tries`-th redelivery: 50 ms, 100 ms, ... at most 2 s."""
    return min(MAX_RETRY_S, FIRST_RETRY_S * 2 ** max(0, tries - 1))


def watch_store(ctx: SharedContext) -> None:
    """Publish outages of the runtime's database for `status`, and stop the runtime on a persistent one."""
    health = ctx.health
    home = ctx.config.home
    limit_ms = ctx.config.runtime.store_outage_stop_ms
    clear_store_outage(home)  # one left by a runtime that died is not this one's

    lock = threading.Lock()

    def changed(reported: Outage | None) -> None:
        # Called outside the health's lock, in whichever thread met the change: two calls may
        # arrive out of order, so each publishes the health's state as it is now, one at a time.
        with lock:
            if reported is None:
                log.warning("event=store_available")
            elif reported.failures == 1:
                log.warning("event=store_unavailable error=%s", reported.error)
            outage = health.outage()
            try:
                if outage is None:
                    clear_store_outage(home)
                else:
                    write_store_outage(home, since_ms=outage.since_ms, seconds=outage.seconds,
                                       failures=outage.failures, error=outage.error, stop_after_ms=limit_ms)
            except OSError as err:  # `status` then misses the reason; the retries go on
                log.warning("event=store_outage_status_unwritten error=%s", err)

    def persistent(outage: Outage) -> None:
        ctx.fatal.trip(
            f"the database has failed every transaction for {outage.seconds:.1f} s ({outage.failures} "
            f"failures, store_outage_stop_ms = {limit_ms}), last: {outage.error}; the failed transactions "
            "changed nothing and running jobs are left running; fix the database, then start the "
            "runtime again (recovery picks up where it stopped)")

    health.watch(limit_s=limit_ms / 1000, on_change=changed, on_persistent=persistent)
