"""Web: a task's schedule as the page shows it: the cron expression in words (`cron-descriptor`,
part of the `web` extra; without it, None) and its next few fire times from the stored cursor."""

from __future__ import annotations

from typing import Any

from ..domain.cron_times import next_fire_ms
from ..store.views import TriggerView

NEXT_FIRES = 3


def in_words(cron: str) -> str | None:
    """'*/5 * * * *' -> 'Every 5 minutes' (6 fields: seconds first, as qlactors reads them)."""
    try:
        from cron_descriptor import Options, get_description
    except ImportError:
        return None
    options = Options()
    options.use_24hour_time_format = True
    try:
        return get_description(cron, options)
    except Exception:  # a description is a nicety: the expression itself is always shown
        return None


def schedule_json(trigger: TriggerView | None, enabled: bool, count: int = NEXT_FIRES) -> dict[str, Any] | None:
    """`{cron, tz, in_words, next_fires_ms}`, None for a task without a schedule; no fire times
    while the task is disabled (its schedule counts from when it is enabled again)."""
    if trigger is None:
        return None
    fires: list[int] = []
    if enabled and trigger.next_fire_at_ms is not None:
        fires.append(trigger.next_fire_at_ms)
        while len(fires) < count:
            fires.append(next_fire_ms(trigger.cron, trigger.tz, fires[-1]))
    return {"cron": trigger.cron, "tz": trigger.tz, "in_words": in_words(trigger.cron), "next_fires_ms": fires}
