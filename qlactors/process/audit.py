"""The orphan receipt audit behind `qlactors audit receipts` (SEMANTICS.md §12): classify, rarely move.

Read-only by default. It reads one bounded slice of shard directories incrementally, looks at
names and `lstat` only (never a file's contents), and with `quarantine=True` moves nothing but
old, unregistered, inactive regular receipt files — by link + unlink into
`<root>/.orphan-quarantine/<shard>/`. It never deletes. A shard holding more entries than the
slice allows is marked overflow and nothing in it moves, since what was not read could change
what the rest means.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qlactors.domain.receipt import receipt_shard
from qlactors.process.fsutil import DIR_FLAGS, fsync_dir
from qlactors.process.receipts import ORPHAN_QUARANTINE_DIR
from qlactors.process.shard_files import UnsafePath, classify_name, link_unique, open_subdir

HARD_MAX_SHARDS = 32
HARD_MAX_PER_SHARD = 64
DEFAULT_SHARDS = 8
DEFAULT_PER_SHARD = 32
DEFAULT_MIN_AGE_MS = 600_000
LAST_SHARD = 0xFF

CLASSES = ("registered", "active", "young", "unsafe", "temp", "marker", "orphan", "other")
"""Every class an entry can get; each appears in `counts`, zero or not."""

_SHARD = re.compile(r"[0-9a-fA-F]{2}")



@dataclass
class AuditReport:
    """What one audit slice found, and where the next one starts."""

    start_shard: str
    """The first shard of the slice (lowercase hex)."""
    shards_read: list[str] = field(default_factory=list)
    """Every shard the slice covered, present on disk or not."""
    next_shard: str | None = None
    """Where `--shard` should continue; None once "ff" has been read."""
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0))
    """Entries per class."""
    orphans: list[str] = field(default_factory=list)
    """Orphan receipts as `<shard>/<name>`, moved or not."""
    unsafe: list[dict[str, str]] = field(default_factory=list)
    """`{"path", "reason"}` of symlinks, directories, non-regular entries and unsafe shards."""
    overflow: list[str] = field(default_factory=list)
    """Shards with more entries than `per_shard`: only partly classified, nothing moved."""
    quarantined: list[dict[str, str]] = field(default_factory=list)
    """`{"from", "to"}` of each orphan moved (paths relative to the receipts root)."""
    skipped: list[dict[str, str]] = field(default_factory=list)
    """`{"path", "reason"}` of orphans left in place although quarantine was asked."""
    quarantine: bool = False
    """Whether eligible orphans were to be moved."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "start_shard": self.start_shard,
            "next_shard": self.next_shard,
            "shards_read": list(self.shards_read),
            "quarantine": self.quarantine,
            "counts": {k: self.counts[k] for k in CLASSES},
            "orphans": list(self.orphans),
            "unsafe": [dict(u) for u in self.unsafe],
            "overflow": list(self.overflow),
            "quarantined": [dict(q) for q in self.quarantined],
            "skipped": [dict(s) for s in self.skipped],
        }

    def to_json(self) -> str:
        """One JSON object with sorted keys, stable for scripts and tests."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class _Orphan:
    name: str
    attempt_id: str
    dev: int
    ino: int


def audit(root: Path, *, is_registered: Callable[[str], bool], is_active: Callable[[str], bool],
          now_ms: int, start_shard: str = "00", shards: int = DEFAULT_SHARDS,
          per_shard: int = DEFAULT_PER_SHARD, min_age_ms: int = DEFAULT_MIN_AGE_MS,
          quarantine: bool = False) -> AuditReport:
    """Classify one slice of `<root>/<shard>/` directories; with `quarantine`, move old orphans.

    `is_registered(attempt_id)`: the executor journal knows the attempt. `is_active(attempt_id)`:
    the database holds it non-terminal. Both are asked again right before a move.
    Raises ValueError for limits beyond the hard maximum (32 shards x 64 entries).
    """
    if _SHARD.fullmatch(start_shard or "") is None:
        raise ValueError(f"start shard must be two hex digits (00 to ff), got {start_shard!r}")
    if type(shards) is not int or not 1 <= shards <= HARD_MAX_SHARDS:
        raise ValueError(f"shards must be from 1 to {HARD_MAX_SHARDS}, got {shards!r}")
    if type(per_shard) is not int or not 1 <= per_shard <= HARD_MAX_PER_SHARD:
        raise ValueError(f"entries per shard must be from 1 to {HARD_MAX_PER_SHARD}, got {per_shard!r}")
    if type(min_age_ms) is not int or min_age_ms < 0:
        raise ValueError(f"minimum age must be a non-negative number of ms, got {min_age_ms!r}")
    first = int(start_shard, 16)
    last = min(first + shards - 1, LAST_SHARD)
    walker = _Audit(
        report=AuditReport(start_shard=f"{first:02x}", quarantine=quarantine,
                           next_shard=f"{last + 1:02x}" if last < LAST_SHARD else None),
        is_registered=is_registered, is_active=is_active, per_shard=per_shard,
        young_after_ns=(now_ms - min_age_ms) * 1_000_000, quarantine=quarantine,
    )
    walker.run(Path(root), [f"{i:02x}" for i in range(first, last + 1)])
    return walker.report


class _Audit:
    def __init__(self, *, report: AuditReport, is_registered: Callable[[str], bool],
                 is_active: Callable[[str], bool], per_shard: int, young_after_ns: int,
                 quarantine: bool) -> None:
        self.report = report
        self.is_registered = is_registered
        self.is_active = is_active
        self.per_shard = per_shard
        self.young_after_ns = young_after_ns
        self.quarantine = quarantine
        self.canon_root = ""
        self.root_fd = -1
        self.qroot_fd: int | None = None

    def run(self, root: Path, shard_names: list[str]) -> None:
        self.report.shards_read.extend(shard_names)
        self.canon_root = os.path.realpath(root)
        try:
            self.root_fd = os.open(self.canon_root, DIR_FLAGS)
        except FileNotFoundError:
            return  # no receipts root yet: nothing to audit
        try:
            for shard in shard_names:
                self._shard(shard)
        finally:
            if self.qroot_fd is not None:
                os.close(self.qroot_fd)
            os.close(self.root_fd)

    def _unsafe(self, path: str, reason: str) -> None:
        self.report.counts["unsafe"] += 1
        self.report.unsafe.append({"path": path, "reason": reason})

    def _canonical(self, fd: int, rel: str) -> bool:
        """Whether `fd` is the directory at `<canonical root>/<rel>`, with no symlink on the way."""
        expected = os.path.join(self.canon_root, rel)
        if os.path.realpath(expected) != expected:
            return False
        try:
            by_path = os.stat(expected, follow_symlinks=False)
        except FileNotFoundError:
            return False
        by_fd = os.fstat(fd)
        return (stat.S_ISDIR(by_path.st_mode)
                and (by_path.st_dev, by_path.st_ino) == (by_fd.st_dev, by_fd.st_ino))

    def _shard(self, shard: str) -> None:
        try:
            fd = open_subdir(self.root_fd, shard, create=False, what=f"receipt shard {shard}")
        except UnsafePath:
            self._unsafe(shard, "shard_not_a_directory")
            return
        if fd is None:
            return
        try:
            if not self._canonical(fd, shard):
                self._unsafe(shard, "shard_escapes_root")
                return
            with os.scandir(fd) as entries:  # incremental: stop one past the limit
                batch = list(itertools.islice(entries, self.per_shard + 1))
            overflow = len(batch) > self.per_shard
            if overflow:
                self.report.overflow.append(shard)
            orphans = [o for entry in batch[:self.per_shard]
                       if (o := self._classify(shard, entry)) is not None]
            if not (self.quarantine and orphans):
                return
            if overflow:
                self.report.skipped.extend({"path": f"{shard}/{o.name}", "reason": "overflow"}
                                           for o in orphans)
                return
            self._move(shard, fd, orphans)
        finally:
            os.close(fd)

    def _classify(self, shard: str, entry: os.DirEntry[str]) -> _Orphan | None:
        rel = f"{shard}/{entry.name}"
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            return None  # gone since the directory was read
        kind, attempt_id = classify_name(entry.name)
        mode = st.st_mode
        counts = self.report.counts
        if stat.S_ISLNK(mode):
            self._unsafe(rel, "symlink")
        elif stat.S_ISDIR(mode):
            if kind == "temp_dir":  # a running launcher's log-cap FIFO directory
                counts["temp"] += 1
            else:
                self._unsafe(rel, "directory")
        elif stat.S_ISFIFO(mode) and kind == "fifo":  # a running launcher's log-cap FIFO
            counts["temp"] += 1
        elif not stat.S_ISREG(mode):
            self._unsafe(rel, "not_regular")
        elif kind in ("temp", "marker"):
            counts[kind] += 1
        elif kind == "receipt" and attempt_id is not None and receipt_shard(attempt_id) == shard:
            if self.is_registered(attempt_id):
                counts["registered"] += 1
            elif self.is_active(attempt_id):
                counts["active"] += 1
            elif st.st_mtime_ns > self.young_after_ns:
                counts["young"] += 1
            else:
                counts["orphan"] += 1
                self.report.orphans.append(rel)
                return _Orphan(entry.name, attempt_id, st.st_dev, st.st_ino)
        else:
            counts["other"] += 1  # includes a receipt name in the wrong shard: never read there
        return None

    def _orphan_dir(self, shard: str) -> int:
        if self.qroot_fd is None:
            self.qroot_fd = open_subdir(self.root_fd, ORPHAN_QUARANTINE_DIR, create=True,
                                        what="orphan quarantine")
            assert self.qroot_fd is not None
            if not self._canonical(self.qroot_fd, ORPHAN_QUARANTINE_DIR):
                raise UnsafePath("the orphan quarantine directory escapes the receipts root; "
                                 "nothing was moved")
        fd = open_subdir(self.qroot_fd, shard, create=True, what=f"orphan quarantine shard {shard}")
        assert fd is not None
        if not self._canonical(fd, f"{ORPHAN_QUARANTINE_DIR}/{shard}"):
            os.close(fd)
            raise UnsafePath(f"orphan quarantine shard {shard} escapes the receipts root; "
                             "nothing was moved")
        return fd

    def _move(self, shard: str, shard_fd: int, orphans: list[_Orphan]) -> None:
        q_fd = self._orphan_dir(shard)
        moved = False
        try:
            for o in orphans:
                reason = self._still_orphan(shard_fd, o)
                if reason is not None:
                    self.report.skipped.append({"path": f"{shard}/{o.name}", "reason": reason})
                    continue
                target = link_unique(shard_fd, o.name, q_fd, o.name)
                linked = os.stat(target, dir_fd=q_fd, follow_symlinks=False)
                if (linked.st_dev, linked.st_ino) != (o.dev, o.ino):
                    # The name was swapped after the check: drop our extra link (the file
                    # itself stays at its name) and leave it for a later audit.
                    os.unlink(target, dir_fd=q_fd)
                    self.report.skipped.append({"path": f"{shard}/{o.name}", "reason": "changed"})
                    continue
                fsync_dir(q_fd)
                os.unlink(o.name, dir_fd=shard_fd)
                moved = True
                self.report.quarantined.append({"from": f"{shard}/{o.name}",
                                                "to": f"{ORPHAN_QUARANTINE_DIR}/{shard}/{target}"})
        finally:
            if moved:
                fsync_dir(shard_fd)
            os.close(q_fd)

    def _still_orphan(self, shard_fd: int, o: _Orphan) -> str | None:
        """Why the orphan must stay after all (re-checked just before the move), or None."""
        if self.is_registered(o.attempt_id):
            return "registered"
        if self.is_active(o.attempt_id):
            return "active"
        try:
            st = os.stat(o.name, dir_fd=shard_fd, follow_symlinks=False)
        except FileNotFoundError:
            return "vanished"
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (o.dev, o.ino):
            return "changed"
        if st.st_mtime_ns > self.young_after_ns:
            return "young"
        return None
