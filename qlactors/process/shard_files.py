"""Executor-local files, process layer: the names the launcher and the executor leave in a receipt
shard directory, and the descriptor-level moves on them (never through a symlink): what the
receipt store (receipts.py) and the read-only audit (audit.py) share.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re

from qlactors.domain.receipt import MAX_ID_LEN
from qlactors.errors import QlactorsError
from qlactors.process.fsutil import open_private_subdir

# Quarantine never overwrites: a taken name gets ".1", ".2", ... up to this many tries.
MAX_NAME_SUFFIX = 1000


# The names the launcher (process/launcher.sh) and the executor leave in a shard directory, ids
# being [A-Za-z0-9_-]{1,36} so that a '.' always separates the parts:
#   <id>.json                 the published receipt
#   <id>.start                the start marker (QLACTORS_MARKER points next to the receipt)
#   .<id>.<pid>.tmp           the receipt's temp file before link()
#   <id>.fifo                 the log-cap FIFO the executor makes for a running launcher
#   <id>.dropped              the log-cap reader's dropped-byte count
# and, left only by launchers of an earlier version (still recognised, to be cleaned up):
#   <id>.start.<pid>.tmp      the start marker's temp file before mv
#   <id>.start.<pid>.d        the log-cap FIFO directory (".<id>.<pid>.d" without a marker)
_ID = r"[A-Za-z0-9_-]{1,%d}" % MAX_ID_LEN
_NAME_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("receipt", re.compile(rf"({_ID})\.json")),
    ("marker", re.compile(rf"({_ID})\.start")),
    ("temp", re.compile(rf"\.({_ID})\.[0-9]+\.tmp")),
    ("fifo", re.compile(rf"({_ID})\.fifo")),
    ("temp", re.compile(rf"({_ID})\.start\.[0-9]+\.tmp")),
    ("temp_dir", re.compile(rf"\.({_ID})\.[0-9]+\.d")),
    ("temp_dir", re.compile(rf"({_ID})\.start\.[0-9]+\.d")),
)


class UnsafePath(QlactorsError):
    """A directory below a qlactors root is a symlink or not a directory; it was not followed."""



def classify_name(name: str) -> tuple[str, str | None]:
    """(kind, attempt id) of a shard entry's name: receipt, marker, temp, fifo, temp_dir or other."""
    for kind, pattern in _NAME_KINDS:
        m = pattern.fullmatch(name)
        if m is not None:
            return kind, m.group(1)
    return "other", None


def open_subdir(parent_fd: int, name: str, *, create: bool, what: str) -> int | None:
    """A descriptor of directory `name` under `parent_fd`, never through a symlink (UnsafePath)."""
    return open_private_subdir(parent_fd, name, create=create, what=what, error=UnsafePath)


def link_unique(src_fd: int, src_name: str, dst_fd: int, base: str) -> str:
    """Hard-link `src_name` (a symlink itself, never its target) into `dst_fd` under a free name.

    `base`, else `base.1`, `base.2`, ...: an existing name is never overwritten.
    """
    for n in range(MAX_NAME_SUFFIX):
        candidate = base if n == 0 else f"{base}.{n}"
        try:
            os.link(src_name, candidate, src_dir_fd=src_fd, dst_dir_fd=dst_fd,
                    follow_symlinks=False)
        except FileExistsError:
            continue
        return candidate
    raise FileExistsError(errno.EEXIST, f"no free quarantine name for {base!r} after "
                                        f"{MAX_NAME_SUFFIX} tries; purge the quarantine")


def rename_dir_unique(src_fd: int, src_name: str, dst_fd: int, base: str) -> str:
    """Move a directory squatting on a receipt name; a directory cannot be hard-linked.

    rename() would replace an empty directory of the same name, so a free name is checked
    first; the quarantine shard is 0700 and only qlactors writes there.
    """
    for n in range(MAX_NAME_SUFFIX):
        candidate = base if n == 0 else f"{base}.{n}"
        try:
            os.stat(candidate, dir_fd=dst_fd, follow_symlinks=False)
        except FileNotFoundError:
            os.rename(src_name, candidate, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            return candidate
    raise FileExistsError(errno.EEXIST, f"no free quarantine name for {base!r}")


def remove_flat_dir(parent_fd: int, name: str) -> None:
    """Remove a launcher FIFO directory: its non-directory entries, then itself (no recursion)."""
    fd = open_subdir(parent_fd, name, create=False, what=f"launcher temp directory {name}")
    if fd is None:
        raise FileNotFoundError(errno.ENOENT, "gone", name)
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                if not entry.is_dir(follow_symlinks=False):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)
