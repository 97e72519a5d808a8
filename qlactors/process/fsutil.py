"""Small file-system helpers shared by the log and receipt stores."""

from __future__ import annotations

import errno
import os
from pathlib import Path

DIR_MODE = 0o700
# A directory opened by descriptor, never through a symlink.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


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


def fsync_dir(fd: int) -> None:
    """Make directory entry changes (a link, an unlink, a new subdirectory) durable."""
    os.fsync(fd)


def open_private_subdir(parent_fd: int, name: str, *, create: bool, what: str,
                        error: type[Exception]) -> int | None:
    """A descriptor of directory `name` under `parent_fd`, never through a symlink.

    With `create` a missing directory is made 0700 (fchmod'ed, so a umask cannot widen or narrow
    it) and the parent fsynced; without it a missing directory is None. A symlink or a
    non-directory raises `error`.
    """
    created = False
    if create:
        try:
            os.mkdir(name, DIR_MODE, dir_fd=parent_fd)
            created = True
        except FileExistsError:
            pass
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        if create:
            raise
        return None
    except OSError as err:
        # O_NOFOLLOW|O_DIRECTORY on a symlink fails with ENOTDIR on Linux, ELOOP elsewhere.
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise error(f"{what} is a symlink or not a directory; nothing was followed or "
                             "changed. Move it out of the way and try again") from None
        raise
    if created:
        try:
            os.fchmod(fd, DIR_MODE)
            fsync_dir(parent_fd)
        except BaseException:
            os.close(fd)
            raise
    return fd
