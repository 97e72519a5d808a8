"""The bridge's timers: keyed one-shot calls at a monotonic time, a later call with the same key replacing it.

Thread-safe: actors set and cancel timers from their own threads; the bridge thread asks when
the next one is due (its poll timeout) and takes the due ones.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from typing import Any


class Timers:
    """Pending (when, target, message) jobs by key; a heap of (when, seq, key) orders them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._heap: list[tuple[float, int, str]] = []
        self._jobs: dict[str, tuple[float, Any, Any]] = {}
        self._seq = itertools.count()

    def set(self, key: str, when: float, target: Any, message: Any) -> None:
        with self._lock:
            self._jobs[key] = (when, target, message)
            heapq.heappush(self._heap, (when, next(self._seq), key))

    def due(self, key: str) -> float | None:
        """When the timer `key` fires, or None when none is pending."""
        with self._lock:
            job = self._jobs.get(key)
        return None if job is None else job[0]

    def cancel(self, key: str) -> None:
        with self._lock:
            self._jobs.pop(key, None)

    def next_at(self) -> float | None:
        """When the earliest pending timer fires (stale heap entries are skipped), or None."""
        with self._lock:
            while self._heap and self._heap[0][2] not in self._jobs:
                heapq.heappop(self._heap)
            return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[tuple[Any, Any]]:
        """The (target, message) of every timer due at `now`, in time order; they are forgotten."""
        due: list[tuple[Any, Any]] = []
        with self._lock:
            while self._heap and self._heap[0][0] <= now:
                when, _, key = heapq.heappop(self._heap)
                job = self._jobs.get(key)
                if job is not None and job[0] == when:
                    del self._jobs[key]
                    due.append((job[1], job[2]))
        return due
