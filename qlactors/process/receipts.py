"""Completion receipt files on disk: read, delete, quarantine and purge them (SEMANTICS.md §5).

I/O only. Whether a receipt is acceptable is the domain codec's decision (`decode_receipt`);
this module only makes sure the bytes it hands over came from a regular file at the receipt's
own path, never through a symlink, and never more than the size cap. Every operation below the
root works on directory file descriptors opened with O_NOFOLLOW, so a symlink planted as a shard
or a receipt is reported, never followed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from qlactors.domain.receipt import (
    MAX_RECEIPT_BYTES,
    Receipt,
    ReceiptError,
    decode_receipt,
    receipt_shard,
)
from qlactors.process.fsutil import ensure_private_root, fsync_dir
from qlactors.process.shard_files import (UnsafePath, classify_name, link_unique, open_subdir, remove_flat_dir,
                                         rename_dir_unique)

QUARANTINE_DIR = ".quarantine"
ORPHAN_QUARANTINE_DIR = ".orphan-quarantine"
RECEIPT_SUFFIX = ".json"
MARKER_SUFFIX = ".start"
# O_NONBLOCK: should a FIFO slip in between the lstat and the open, opening it must not hang.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

@dataclass(frozen=True, slots=True)
class Missing:
    """No receipt has been published (a launcher's leftover temp file does not count)."""


@dataclass(frozen=True, slots=True)
class Valid:
    """A receipt the codec accepts, read from a regular file at its own path."""

    receipt: Receipt
    """The decoded receipt (its repr hides the token)."""
    raw: bytes = field(repr=False)
    """The exact bytes read; they hold the token, so they stay out of reprs."""


@dataclass(frozen=True, slots=True)
class Invalid:
    """A regular file the codec refuses: quarantine material once authentication is known."""

    reason: str
    """The codec's `ReceiptError.reason` (e.g. `too_large`, `duplicate_key`, `path_mismatch`)."""
    detail: str
    """The codec's message; it never echoes the token."""


@dataclass(frozen=True, slots=True)
class Unsafe:
    """Something that is not a regular file sits at the receipt's path; it was not followed."""

    reason: str
    """`symlink`, `directory`, `not_regular` or `shard_unsafe`."""


ReadResult = Missing | Valid | Invalid | Unsafe


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class ReceiptStore:
    """The receipts directory: `<root>/<2 hex of sha256(attempt id)>/<attempt id>.json`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        # Shards this process has made or checked: nothing of qlactors removes a shard, and the
        # executor asks for one several times per launch (a mkdir and two opens each time).
        self._checked_shards: set[str] = set()

    # --- paths ---------------------------------------------------------------------------

    def ensure(self) -> None:
        """Create the root (0700) if missing; its parent, the home, must exist."""
        ensure_private_root(self.root, "receipts root", UnsafePath)

    def _open_root(self) -> int:
        return os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def _open_shard(self, shard: str, *, create: bool) -> int | None:
        if create:
            self.ensure()
        try:
            root_fd = self._open_root()
        except FileNotFoundError:
            return None
        try:
            return open_subdir(root_fd, shard, create=create, what=f"receipt shard {self.root / shard}")
        finally:
            os.close(root_fd)

    def shard_dir(self, attempt_id: str) -> Path:
        """The attempt's shard directory, created 0700 if missing; refuses a symlinked shard.

        Checked once per process and shard: the receipts root is the runtime user's own (0700),
        and every read, delete and quarantine opens the shard again without following symlinks.
        """
        shard = receipt_shard(attempt_id)
        if shard not in self._checked_shards:
            fd = self._open_shard(shard, create=True)
            assert fd is not None
            os.close(fd)
            self._checked_shards.add(shard)
        return self.root / shard

    def final_path(self, attempt_id: str) -> Path:
        """Where the launcher publishes the attempt's receipt (nothing is created)."""
        return self.root / receipt_shard(attempt_id) / f"{attempt_id}{RECEIPT_SUFFIX}"

    def marker_path(self, attempt_id: str) -> Path:
        """Where the launcher publishes its start marker: next to the receipt."""
        return self.root / receipt_shard(attempt_id) / f"{attempt_id}{MARKER_SUFFIX}"

    # --- reading -------------------------------------------------------------------------

    def read(self, attempt_id: str) -> ReadResult:
        """The attempt's receipt as Missing, Valid, Invalid or Unsafe.

        Ordinary OS errors (EACCES, EIO, ...) raise: the receipt stays for the next try.
        """
        shard = receipt_shard(attempt_id)
        name = f"{attempt_id}{RECEIPT_SUFFIX}"
        try:
            shard_fd = self._open_shard(shard, create=False)
        except UnsafePath:
            return Unsafe("shard_unsafe")
        if shard_fd is None:
            return Missing()
        try:
            # lstat first so that a FIFO or a device is never even opened.
            try:
                st = os.stat(name, dir_fd=shard_fd, follow_symlinks=False)
            except FileNotFoundError:
                return Missing()
            early = _unsafe_mode(st.st_mode)
            if early is not None:
                return early
            try:
                fd = os.open(name, _READ_FLAGS, dir_fd=shard_fd)
            except FileNotFoundError:
                return Missing()
            except OSError as err:
                if err.errno == errno.ELOOP:  # swapped for a symlink since the lstat
                    return Unsafe("symlink")
                if err.errno == errno.ENXIO:  # a socket
                    return Unsafe("not_regular")
                raise
            try:
                st = os.fstat(fd)
                late = _unsafe_mode(st.st_mode)
                if late is not None:
                    return late
                if st.st_size > MAX_RECEIPT_BYTES:
                    return _too_large(st.st_size)
                data = _read_at_most(fd, MAX_RECEIPT_BYTES + 1)
            finally:
                os.close(fd)
        finally:
            os.close(shard_fd)
        if len(data) > MAX_RECEIPT_BYTES:  # grew after the fstat
            return _too_large(len(data))
        try:
            receipt = decode_receipt(data, expected_attempt_id=attempt_id)
        except ReceiptError as err:
            return Invalid(err.reason, str(err))
        return Valid(receipt, data)

    def temp_files(self, attempt_id: str) -> list[Path]:
        """The launcher's leftover temp files of this attempt (receipt and marker temps)."""
        return [self.root / receipt_shard(attempt_id) / n
                for n, kind in self._leftovers(attempt_id) if kind == "temp"]

    def _leftovers(self, attempt_id: str) -> list[tuple[str, str]]:
        shard = receipt_shard(attempt_id)
        shard_fd = self._open_shard(shard, create=False)
        if shard_fd is None:
            return []
        found: list[tuple[str, str]] = []
        try:
            with os.scandir(shard_fd) as entries:
                for entry in entries:
                    kind, owner = classify_name(entry.name)
                    if owner != attempt_id or kind not in ("temp", "temp_dir"):
                        continue
                    is_dir = entry.is_dir(follow_symlinks=False)
                    if (kind == "temp_dir") == is_dir:
                        found.append((entry.name, kind))
        finally:
            os.close(shard_fd)
        return sorted(found)

    # --- changes -------------------------------------------------------------------------

    def delete(self, attempt_id: str) -> None:
        """Remove the receipt and the start marker (absent is fine).

        Call only after the completion is committed (SEMANTICS.md §3 rule 3). No directory
        fsync: an unlink lost to a power cut brings the receipt back, and its replay answers
        `already_terminal` and deletes it again; the journal row, cleared after this, is durable.
        """
        shard = receipt_shard(attempt_id)
        shard_fd = self._open_shard(shard, create=False)
        if shard_fd is None:
            return
        try:
            for name in (f"{attempt_id}{RECEIPT_SUFFIX}", f"{attempt_id}{MARKER_SUFFIX}"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=shard_fd)
        finally:
            os.close(shard_fd)

    def remove_temps(self, attempt_id: str) -> int:
        """Remove the launcher's leftovers of this attempt (temp files, an emptied FIFO dir).

        Only for an attempt whose launcher is known to be gone. Returns how many were removed.
        """
        leftovers = self._leftovers(attempt_id)
        if not leftovers:
            return 0
        shard_fd = self._open_shard(receipt_shard(attempt_id), create=False)
        if shard_fd is None:
            return 0
        removed = 0
        try:
            for name, kind in leftovers:
                try:
                    if kind == "temp":
                        os.unlink(name, dir_fd=shard_fd)
                    else:
                        remove_flat_dir(shard_fd, name)
                except FileNotFoundError:
                    continue
                removed += 1
            fsync_dir(shard_fd)
        finally:
            os.close(shard_fd)
        return removed

    def quarantine(self, attempt_id: str) -> Path:
        """Move the receipt into `<root>/.quarantine/<shard>/` and return its new path.

        link + unlink (a symlink is moved as itself, never followed), never overwriting a file
        already quarantined under that name. Commit the journal's `quarantined` row first
        (SEMANTICS.md §5). A FileNotFoundError means there was nothing to move.
        """
        shard = receipt_shard(attempt_id)
        name = f"{attempt_id}{RECEIPT_SUFFIX}"
        self.ensure()
        root_fd = self._open_root()
        fds: list[int] = [root_fd]
        try:
            shard_fd = open_subdir(root_fd, shard, create=False, what=f"receipt shard {self.root / shard}")
            if shard_fd is None:
                raise FileNotFoundError(errno.ENOENT, "no receipt to quarantine", str(self.final_path(attempt_id)))
            fds.append(shard_fd)
            st = os.stat(name, dir_fd=shard_fd, follow_symlinks=False)
            qroot_fd = open_subdir(root_fd, QUARANTINE_DIR, create=True, what="receipt quarantine")
            assert qroot_fd is not None
            fds.append(qroot_fd)
            q_fd = open_subdir(qroot_fd, shard, create=True, what=f"receipt quarantine shard {shard}")
            assert q_fd is not None
            fds.append(q_fd)
            if stat.S_ISDIR(st.st_mode):
                target = rename_dir_unique(shard_fd, name, q_fd, name)
            else:
                target = link_unique(shard_fd, name, q_fd, name)
                os.unlink(name, dir_fd=shard_fd)
            # The retention clock starts now: link() keeps the launcher's old mtime, which
            # would let the next purge remove the evidence at once.
            os.utime(target, dir_fd=q_fd, follow_symlinks=False)
            fsync_dir(q_fd)
            fsync_dir(shard_fd)
        finally:
            for fd in reversed(fds):
                os.close(fd)
        return self.root / QUARANTINE_DIR / shard / target

    def purge_quarantine(self, older_than_ms: int, now_ms: int, limit: int) -> int:
        """Delete up to `limit` quarantined entries whose mtime is before now - older_than.

        Bounded: at most limit * 4 directory entries are looked at per call. Returns how many
        were deleted.
        """
        if older_than_ms < 0:
            raise ValueError("older_than_ms must be >= 0")
        if limit <= 0:
            return 0
        cutoff_ns = (now_ms - older_than_ms) * 1_000_000
        budget = limit * 4
        scanned = removed = 0
        try:
            root_fd = self._open_root()
        except FileNotFoundError:
            return 0
        try:
            qroot_fd = open_subdir(root_fd, QUARANTINE_DIR, create=False, what="receipt quarantine")
        finally:
            os.close(root_fd)
        if qroot_fd is None:
            return 0
        try:
            with os.scandir(qroot_fd) as shards:
                for shard in shards:
                    scanned += 1
                    if scanned > budget or removed >= limit:
                        break
                    if not shard.is_dir(follow_symlinks=False):
                        continue
                    try:
                        shard_fd = open_subdir(qroot_fd, shard.name, create=False, what="quarantine shard")
                    except UnsafePath:
                        continue
                    if shard_fd is None:
                        continue
                    try:
                        n, scanned = _purge_shard(shard_fd, cutoff_ns, limit - removed, scanned, budget)
                        removed += n
                    finally:
                        os.close(shard_fd)
        finally:
            os.close(qroot_fd)
        return removed


def _unsafe_mode(mode: int) -> Unsafe | None:
    if stat.S_ISLNK(mode):
        return Unsafe("symlink")
    if stat.S_ISDIR(mode):
        return Unsafe("directory")
    if not stat.S_ISREG(mode):
        return Unsafe("not_regular")
    return None


def _too_large(size: int) -> Invalid:
    return Invalid("too_large", f"receipt is {size} bytes or more, over the "
                                f"{MAX_RECEIPT_BYTES}-byte limit")


def _purge_shard(shard_fd: int, cutoff_ns: int, limit: int, scanned: int,
                 budget: int) -> tuple[int, int]:
    removed = 0
    with os.scandir(shard_fd) as entries:
        for entry in entries:
            scanned += 1
            if scanned > budget or removed >= limit:
                break
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if st.st_mtime_ns >= cutoff_ns:
                continue
            try:
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(entry.name, dir_fd=shard_fd)
                else:
                    os.unlink(entry.name, dir_fd=shard_fd)
            except FileNotFoundError:
                continue
            removed += 1
    if removed:
        fsync_dir(shard_fd)
    return removed, scanned
