"""Per-attempt log files: a deterministic sharded path, safe creation, and byte-exact reading.

The executor creates the file (SEMANTICS.md §4 step 2) and closes it; the launcher appends the
job's output (through the log-cap reader of §11). Reading is byte for byte: a job's output is
not text we may decode, fix or re-encode.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from qlactors.domain.receipt import ID_PATTERN, MAX_ID_LEN
from qlactors.errors import QlactorsError
from qlactors.process.fsutil import ensure_private_root, fsync_dir, open_private_subdir

FILE_MODE = 0o600
LOG_SUFFIX = ".log"
DEFAULT_READ_BYTES = 256 * 1024
MAX_READ_BYTES = 16 * 1024 * 1024
FOLLOW_CHUNK_BYTES = 64 * 1024

# No O_EXCL, no O_TRUNC: an existing file is checked first (regular, one link), then emptied.
# O_NONBLOCK: a FIFO planted at the path fails to open (ENXIO) instead of waiting for a reader.
_CREATE_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK
                 | os.O_CLOEXEC)
# O_NONBLOCK: a FIFO planted at a log path must not hang a reader before fstat refuses it.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UnsafeLogPath(QlactorsError):
    """A log path or its shard directory is a symlink or not what it should be; not followed."""


def _check_id(value: str, what: str) -> None:
    if type(value) is not str or ID_PATTERN.fullmatch(value) is None:
        raise ValueError(f"{what} must be 1 to {MAX_ID_LEN} characters of A-Z a-z 0-9 _ -, "
                         f"got {value!r}")


class LogStore:
    """The logs directory: `<root>/<2 hex of sha256(run id + "/" + attempt id)>/<attempt id>.log`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def ensure(self) -> None:
        """Create the root (0700) if missing; its parent, the home, must exist."""
        ensure_private_root(self.root, "logs root", UnsafeLogPath)

    def artifact_id(self, run_id: str, attempt_id: str) -> str:
        """The log's path relative to the root ('/'-separated): what `log_artifact_id` records."""
        _check_id(run_id, "run id")
        _check_id(attempt_id, "attempt id")
        # A hash, not an id prefix: UUIDv7 ids created together share their prefix. The '/'
        # cannot occur in an id, so the pair is unambiguous.
        shard = hashlib.sha256(f"{run_id}/{attempt_id}".encode("ascii")).hexdigest()[:2]
        return f"{shard}/{attempt_id}{LOG_SUFFIX}"

    def path_for(self, run_id: str, attempt_id: str) -> Path:
        """The deterministic log path of an attempt (nothing is created)."""
        return self.root / self.artifact_id(run_id, attempt_id)

    def create(self, run_id: str, attempt_id: str) -> Path:
        """Create the empty log file (0600, directories 0700) and return its path.

        Called for an offer, which proves the attempt was never activated, so no job ever wrote
        to this path: a file left by an earlier offer of the same attempt (its lease released,
        the attempt offered again) is emptied and reused. Never through a symlink (O_NOFOLLOW),
        and never anything but a regular file with one link (UnsafeLogPath, left as it was).
        """
        shard, name = self.artifact_id(run_id, attempt_id).split("/")
        self.ensure()
        root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            shard_fd = open_private_subdir(root_fd, shard, create=True, what=f"log directory {self.root / shard}",
                                           error=UnsafeLogPath)
        finally:
            os.close(root_fd)
        path = self.root / shard / name
        try:
            try:
                fd = os.open(name, _CREATE_FLAGS, FILE_MODE, dir_fd=shard_fd)
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENXIO):
                    raise UnsafeLogPath(f"log {path} is a symlink or not a regular file; it was left "
                                        "as it was") from None
                raise
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                    raise UnsafeLogPath(f"log {path} is not a regular file with one link; it was left "
                                        "as it was")
                if st.st_size:
                    os.ftruncate(fd, 0)
                os.fchmod(fd, FILE_MODE)  # whatever the umask says
            finally:
                os.close(fd)
        finally:
            os.close(shard_fd)
        return path

    def remove(self, run_id: str, attempt_id: str) -> bool:
        """Delete the attempt's log (retention); False when it was already gone.

        Through directory descriptors, never a symlinked shard (UnsafeLogPath). The shard is
        fsynced after the unlink: retention deletes the run's rows next, and a power cut must not
        bring back a log that no row accounts for.
        """
        shard, name = self.artifact_id(run_id, attempt_id).split("/")
        try:
            root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            shard_fd = open_private_subdir(root_fd, shard, create=False, what=f"log directory {self.root / shard}",
                                           error=UnsafeLogPath)
        finally:
            os.close(root_fd)
        if shard_fd is None:
            return False
        try:
            try:
                os.unlink(name, dir_fd=shard_fd)
            except FileNotFoundError:
                return False
            fsync_dir(shard_fd)
            return True
        finally:
            os.close(shard_fd)

    # The readers need no state; they are methods too so that a caller holding a LogStore
    # (`qlactors logs`, the executor) finds everything in one place.
    @staticmethod
    def read(path: Path | str, offset: int, max_bytes: int = DEFAULT_READ_BYTES) -> bytes:
        """See the module-level `read`."""
        return read(path, offset, max_bytes)

    @staticmethod
    def follow(path: Path | str, offset: int, is_done: Callable[[], bool], poll_s: float = 0.2,
               *, out: BinaryIO, chunk_bytes: int = FOLLOW_CHUNK_BYTES) -> int:
        """See the module-level `follow`."""
        return follow(path, offset, is_done, poll_s, out=out, chunk_bytes=chunk_bytes)

    @staticmethod
    def free_bytes(path: Path | str) -> int:
        """See the module-level `free_bytes`."""
        return free_bytes(path)


def _open_log(path: Path | str) -> int:
    """A read descriptor on a regular log file, never through a final symlink."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENXIO):
            raise UnsafeLogPath(f"log {os.fspath(path)} is a symlink or not a regular file; "
                                "it was not followed") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeLogPath(f"log {os.fspath(path)} is not a regular file; it was not read")
    # Back to blocking reads: a regular file never blocks anyway, and pread is clearer so.
    os.set_blocking(fd, True)
    return fd


def read(path: Path | str, offset: int, max_bytes: int = DEFAULT_READ_BYTES) -> bytes:
    """Up to `max_bytes` of the log from `offset`, exactly as written (b'' at or past the end)."""
    if offset < 0:
        raise ValueError("offset must be >= 0")
    if not 0 <= max_bytes <= MAX_READ_BYTES:
        raise ValueError(f"max_bytes must be from 0 to {MAX_READ_BYTES}")
    fd = _open_log(path)
    try:
        chunks: list[bytes] = []
        left = max_bytes
        while left > 0:
            chunk = os.pread(fd, left, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def follow(path: Path | str, offset: int, is_done: Callable[[], bool], poll_s: float = 0.2, *,
           out: BinaryIO, chunk_bytes: int = FOLLOW_CHUNK_BYTES) -> int:
    """Copy the log from `offset` to `out` as it grows, until the attempt is done and drained.

    `is_done` is asked before each drain, so every byte written before it turned True is copied.
    There is no event for "a file grew", hence the poll. Returns the offset reached.
    """
    if offset < 0:
        raise ValueError("offset must be >= 0")
    if poll_s <= 0 or chunk_bytes <= 0:
        raise ValueError("poll_s and chunk_bytes must be positive")
    fd = _open_log(path)
    try:
        while True:
            done = is_done()
            while True:
                chunk = os.pread(fd, chunk_bytes, offset)
                if not chunk:
                    break
                out.write(chunk)
                offset += len(chunk)
            out.flush()
            if done:
                return offset
            time.sleep(poll_s)
    finally:
        os.close(fd)


def free_bytes(path: Path | str) -> int:
    """Bytes an unprivileged writer may still use on the file system holding `path`."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
