"""Small file-system helpers shared by the log and receipt stores."""

from __future__ import annotations

import os
from pathlib import Path

DIR_MODE = 0o700


def ensure_private_root(root: Path, what: str, error: type[Exception]) -> None:
    """Create `root` (0700) if missing; its parent, the home, must exist. Refuse a non-directory."""
    try:
        os.mkdir(root, DIR_MODE)
    except FileExistsError:
        pass
    else:
        os.chmod(root, DIR_MODE)  # the umask must not widen it
    if not root.is_dir():
        raise error(f"{what} {root} is not a directory; move it away")
