"""Free space on the file system that holds the logs, as the disk-reserve check reads it.

Tests stand in for the file system with `QLACTORS_TEST_FREE_BYTES_FILE=<path>`: while that file
holds an integer, it is the free space (a test fills and frees the "disk" by rewriting it); when
it is missing or unreadable the real file system answers. Unset, it costs one lookup at start.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Mapping

FREE_BYTES_FILE_ENV = "QLACTORS_TEST_FREE_BYTES_FILE"


def free_bytes(path: Path | str) -> int:
    """Bytes an unprivileged writer may still use on the file system holding `path` (statvfs)."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def free_space_source(path: Path | str, environ: Mapping[str, str] = os.environ) -> Callable[[], int]:
    """A no-argument reader of the free space under `path` (or of the test file, when set)."""
    override = environ.get(FREE_BYTES_FILE_ENV)
    if not override:
        return lambda: free_bytes(path)

    def from_file() -> int:
        try:
            return int(Path(override).read_text().strip())
        except (OSError, ValueError):
            return free_bytes(path)
    return from_file
