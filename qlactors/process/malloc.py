"""Fewer glibc malloc arenas for a small box's runtime (docs/performance.md, "Idle runtime").

glibc gives threads their own malloc arena (up to 8 per core), each holding pages of its own;
the edge runtime has a dozen mostly idle threads, so those pages are most of what it costs past
its imports. `limit_arenas` caps them before the threads start, as `MALLOC_ARENA_MAX` would. On
another libc, or when the call fails, nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_ARENA_MAX = -8  # glibc's mallopt parameter


def limit_arenas(count: int) -> bool:
    """Cap the malloc arenas of this process at `count`; True when glibc took it."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.mallopt(ctypes.c_int(M_ARENA_MAX), ctypes.c_int(count)))
    except (OSError, AttributeError):
        return False
