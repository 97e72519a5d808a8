"""The random delay of a cron fire (SEMANTICS.md §8): a deterministic function of the trigger and
the occurrence, so every replica that admits the same occurrence computes the same not-before time.
"""

from __future__ import annotations

import hashlib

from .model import MAX_RANDOM_DELAY_MS


def random_delay_ms(trigger_id: str, scheduled_for_ms: int, max_delay_ms: int) -> int:
    """A delay uniform in [0, max_delay_ms] drawn from SHA-256 of `trigger_id:scheduled_for_ms`.

    64 bits of the digest modulo at most 86,400,001 values: the bias is below 1e-11.
    """
    if type(trigger_id) is not str or not trigger_id:
        raise ValueError(f"trigger_id must be a non-empty string, got {trigger_id!r}")
    if type(scheduled_for_ms) is not int:
        raise ValueError(f"scheduled_for_ms must be an integer (epoch ms), got {scheduled_for_ms!r}")
    if type(max_delay_ms) is not int or not 0 <= max_delay_ms <= MAX_RANDOM_DELAY_MS:
        raise ValueError(f"max_delay_ms must be an integer from 0 to {MAX_RANDOM_DELAY_MS}, got {max_delay_ms!r}")
    if max_delay_ms == 0:
        return 0
    digest = hashlib.sha256(f"{trigger_id}:{scheduled_for_ms}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (max_delay_ms + 1)


def not_before_ms(trigger_id: str, scheduled_for_ms: int, max_delay_ms: int) -> int | None:
    """The run's not-before time for this occurrence, or None when the task has no random delay."""
    if max_delay_ms == 0:
        return None
    return scheduled_for_ms + random_delay_ms(trigger_id, scheduled_for_ms, max_delay_ms)
