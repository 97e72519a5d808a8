"""Fresh identifiers for new rows: UUIDv7 from the system clock and the OS random source."""

from __future__ import annotations

import os
import time

from .domain.ids import uuid7


def new_id() -> str:
    return uuid7(time.time_ns() // 1_000_000, os.urandom(10))
