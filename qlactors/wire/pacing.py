"""Pure pacing for the transport: a doubling backoff and a per-key log limit, the clock passed in.

No I/O here (links.py, peer_failures.py and bridge.py hold the sockets and the clock): a test
drives both with made-up times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable


@dataclass
class Backoff:
    """Delays of `first_s`, doubling up to `cap_s`; `reset` starts again from `first_s`."""

    first_s: float
    cap_s: float
    tries: int = 0  # delays handed out since the last reset

    def next(self) -> float:
        """The delay before the next try (and count it)."""
        delay = min(self.cap_s, self.first_s * 2 ** min(self.tries, 32))
        self.tries += 1
        return delay

    def reset(self) -> None:
        self.tries = 0


class LogLimit:
    """One log line per key per `every_s`: the first at once, then at most one per interval,
    each saying how many were left unlogged since the last (so nothing is hidden, only counted).

    At most `remember` keys are kept; past it, keys whose last line is older than the interval
    are forgotten (a forgotten key's next event is logged at once, as a first one).
    """

    def __init__(self, every_s: float, *, remember: int = 1024) -> None:
        self.every_s = every_s
        self.remember = remember
        self._seen: dict[Hashable, tuple[float, int]] = {}  # key -> (last logged, unlogged since)

    def admit(self, key: Hashable, now: float) -> int | None:
        """None: do not log this one (it is counted). Otherwise log it now, with the returned
        number of events left unlogged since the key's last line."""
        last, unlogged = self._seen.get(key, (None, 0))
        if last is not None and now - last < self.every_s:
            self._seen[key] = (last, unlogged + 1)
            return None
        if last is None and len(self._seen) >= self.remember:
            self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self.every_s}
        self._seen[key] = (now, 0)
        return unlogged

    def forget(self, key: Hashable) -> int:
        """Drop `key` (its next event is logged at once); the number it had left unlogged."""
        return self._seen.pop(key, (0.0, 0))[1]
