"""The orphan receipt audit on a real tree: read-only by default, bounded, and it never deletes."""

from __future__ import annotations

import itertools
import json
import os
import stat
import time
from pathlib import Path

import pytest

from qlactors.domain.receipt import receipt_shard
from qlactors.process.audit import CLASSES, HARD_MAX_PER_SHARD, HARD_MAX_SHARDS, audit
from qlactors.process.receipts import ORPHAN_QUARANTINE_DIR, QUARANTINE_DIR

NOW_MS = int(time.time() * 1000)
OLD_S = NOW_MS / 1000 - 3600  # an hour ago: older than the 10-minute minimum age
PER_SHARD = 4


def ids_in(shard: str, n: int, prefix: str) -> list[str]:
    """`n` attempt ids whose receipts live in `shard`."""
    found = []
    for i in itertools.count():
        candidate = f"{prefix}-{i}"
        if receipt_shard(candidate) == shard:
            found.append(candidate)
            if len(found) == n:
                return found


def put(path: Path, data: bytes = b"{}", *, old: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_bytes(data)
    if old:
        os.utime(path, (OLD_S, OLD_S))
    return path


def listing(*tops: Path) -> dict[str, tuple]:
    """Every path under `tops` with its type, inode, size, mtime and link target (no following)."""
    out = {}
    for top in tops:
        for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
            for name in dirnames + filenames:
                p = os.path.join(dirpath, name)
                st = os.lstat(p)
                target = os.readlink(p) if stat.S_ISLNK(st.st_mode) else None
                out[p] = (stat.S_IFMT(st.st_mode), st.st_ino, st.st_size, st.st_mtime_ns, target)
    return out


class Tree:
    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "receipts"
        self.outside = tmp_path / "outside"
        self.root.mkdir(mode=0o700)
        self.outside.mkdir()
        r = self.root
        (self.orphan, self.registered, self.active, self.young,
         self.link_id) = ids_in("00", 5, "z")
        self.orphan3, = ids_in("03", 1, "z")
        self.orphan4, = ids_in("04", 1, "z")
        self.overflow_ids = ids_in("01", PER_SHARD + 1, "z")
        self.escaped, = ids_in("02", 1, "z")
        misplaced, = ids_in("05", 1, "m")
        put(r / "00" / f"{self.orphan}.json", b'{"secret":1}')
        put(r / "00" / f"{self.registered}.json")
        put(r / "00" / f"{self.active}.json")
        put(r / "00" / f"{self.young}.json", old=False)
        put(self.outside / "target.json")
        (r / "00" / f"{self.link_id}.json").symlink_to(self.outside / "target.json")
        (r / "00" / "adir").mkdir()
        put(r / "00" / f"{self.registered}.start", b"pid=1")
        put(r / "00" / f".{self.young}.77.tmp")
        os.mkfifo(r / "00" / f"{self.active}.fifo", 0o600)  # a running launcher's log-cap FIFO
        put(r / "00" / f"{misplaced}.json")  # a receipt name in the wrong shard
        for aid in self.overflow_ids:
            put(r / "01" / f"{aid}.json")
        put(self.outside / "shard02" / f"{self.escaped}.json")
        (r / "02").symlink_to(self.outside / "shard02")
        put(r / "03" / f"{self.orphan3}.json")
        put(r / "03" / "notes.txt")
        os.mkfifo(r / "03" / "stray.pipe", 0o600)  # a FIFO by any other name is unsafe
        put(r / "04" / f"{self.orphan4}.json")
        put(r / QUARANTINE_DIR / "00" / "x.json")  # never looked at

    def is_registered(self, attempt_id: str) -> bool:
        return attempt_id == self.registered

    def is_active(self, attempt_id: str) -> bool:
        return attempt_id == self.active

    def run(self, **kw):
        kw.setdefault("start_shard", "00")
        kw.setdefault("shards", 4)
        kw.setdefault("per_shard", PER_SHARD)
        return audit(self.root, is_registered=self.is_registered, is_active=self.is_active,
                     now_ms=NOW_MS, **kw)


@pytest.fixture
def tree(tmp_path) -> Tree:
    return Tree(tmp_path)


def test_default_run_moves_nothing_and_classifies(tree):
    before = listing(tree.root, tree.outside)
    report = tree.run()
    assert listing(tree.root, tree.outside) == before
    # shards 00 (9 entries) and 01 (5) hold more than PER_SHARD: partly read, flagged
    assert report.overflow == ["00", "01"]
    assert report.next_shard == "04"
    assert not (tree.root / ORPHAN_QUARANTINE_DIR).exists()


def test_classification_of_every_kind_of_entry(tree):
    before = listing(tree.root, tree.outside)
    report = tree.run(per_shard=16)
    assert listing(tree.root, tree.outside) == before
    assert report.counts == {
        "registered": 1, "active": 1, "young": 1, "temp": 2, "marker": 1, "other": 2,
        # 00: symlink + directory; 02: the symlinked shard; 03: the stray FIFO
        "unsafe": 4,
        # 00: one; 01: five; 03: one
        "orphan": 2 + PER_SHARD + 1,
    }
    assert set(report.counts) == set(CLASSES)
    assert f"00/{tree.orphan}.json" in report.orphans
    assert f"03/{tree.orphan3}.json" in report.orphans
    assert all(not o.startswith("02/") for o in report.orphans)
    assert sorted((u["path"], u["reason"]) for u in report.unsafe) == [
        ("00/adir", "directory"), (f"00/{tree.link_id}.json", "symlink"),
        ("02", "shard_not_a_directory"), ("03/stray.pipe", "not_regular")]
    assert report.overflow == []
    assert report.shards_read == ["00", "01", "02", "03"]
    assert report.next_shard == "04"
    assert report.quarantined == [] and report.skipped == []
    assert not (tree.root / ORPHAN_QUARANTINE_DIR).exists()


def test_quarantine_moves_only_eligible_orphans_and_never_deletes(tree):
    inodes_before = {v[1] for v in listing(tree.root, tree.outside).values() if v[0] == stat.S_IFREG}
    outside_before = listing(tree.outside)
    report = tree.run(per_shard=16, quarantine=True)
    moved = {(q["from"], q["to"]) for q in report.quarantined}
    assert moved == {
        (f"00/{tree.orphan}.json", f"{ORPHAN_QUARANTINE_DIR}/00/{tree.orphan}.json"),
        (f"03/{tree.orphan3}.json", f"{ORPHAN_QUARANTINE_DIR}/03/{tree.orphan3}.json"),
        *((f"01/{a}.json", f"{ORPHAN_QUARANTINE_DIR}/01/{a}.json") for a in tree.overflow_ids),
    }
    q = tree.root / ORPHAN_QUARANTINE_DIR
    assert (q / "00" / f"{tree.orphan}.json").read_bytes() == b'{"secret":1}'
    assert not (tree.root / "00" / f"{tree.orphan}.json").exists()
    for d in (q, q / "00", q / "03"):
        assert stat.S_IMODE(os.lstat(d).st_mode) == 0o700
    for aid in (tree.registered, tree.active, tree.young):
        assert (tree.root / "00" / f"{aid}.json").exists()
    assert os.path.islink(tree.root / "00" / f"{tree.link_id}.json")
    assert listing(tree.outside) == outside_before
    inodes_after = {v[1] for v in listing(tree.root, tree.outside).values() if v[0] == stat.S_IFREG}
    assert inodes_after == inodes_before  # moved, never deleted
    assert (tree.root / "00" / "adir").is_dir()


def test_overflow_shard_is_left_untouched_by_quarantine(tree):
    overflow_before = listing(tree.root / "01")
    report = tree.run(start_shard="01", shards=1, quarantine=True)
    assert report.overflow == ["01"]
    assert report.quarantined == []
    assert len(report.skipped) == PER_SHARD  # the orphans it did read, all left in place
    assert {s["reason"] for s in report.skipped} == {"overflow"}
    assert listing(tree.root / "01") == overflow_before
    assert report.counts["orphan"] == PER_SHARD  # only the first PER_SHARD were classified


def test_quarantine_never_overwrites_an_earlier_orphan_of_the_same_name(tree):
    q = tree.root / ORPHAN_QUARANTINE_DIR / "03"
    put(q / f"{tree.orphan3}.json", b"earlier")
    report = tree.run(start_shard="03", shards=1, quarantine=True)
    assert report.quarantined == [{"from": f"03/{tree.orphan3}.json",
                                   "to": f"{ORPHAN_QUARANTINE_DIR}/03/{tree.orphan3}.json.1"}]
    assert (q / f"{tree.orphan3}.json").read_bytes() == b"earlier"


def test_an_orphan_registered_meanwhile_stays(tree):
    calls = []

    def is_registered(attempt_id):
        calls.append(attempt_id)
        return calls.count(attempt_id) > 1  # unknown at classification, known at the move

    report = audit(tree.root, is_registered=is_registered, is_active=lambda a: False,
                   now_ms=NOW_MS, start_shard="03", shards=1, quarantine=True)
    assert report.orphans == [f"03/{tree.orphan3}.json"]
    assert report.quarantined == []
    assert report.skipped == [{"path": f"03/{tree.orphan3}.json", "reason": "registered"}]
    assert (tree.root / "03" / f"{tree.orphan3}.json").exists()


def test_next_shard_continues_where_the_slice_stopped(tree):
    first = tree.run(shards=4)
    assert first.next_shard == "04"
    second = tree.run(start_shard=first.next_shard, shards=4)
    assert second.shards_read == ["04", "05", "06", "07"]
    assert second.orphans == [f"04/{tree.orphan4}.json"]
    assert tree.run(start_shard="fe", shards=8).shards_read == ["fe", "ff"]
    assert tree.run(start_shard="FE", shards=8).next_shard is None
    assert tree.run(start_shard="f0", shards=16).next_shard is None
    assert tree.run(start_shard="ef", shards=16).next_shard == "ff"


def test_limits_above_the_hard_maximum_are_refused(tree):
    with pytest.raises(ValueError):
        tree.run(shards=HARD_MAX_SHARDS + 1)
    with pytest.raises(ValueError):
        tree.run(per_shard=HARD_MAX_PER_SHARD + 1)
    for bad in ({"shards": 0}, {"per_shard": 0}, {"start_shard": "g0"}, {"start_shard": "100"},
                {"min_age_ms": -1}):
        with pytest.raises(ValueError):
            tree.run(**bad)
    report = tree.run(shards=HARD_MAX_SHARDS, per_shard=HARD_MAX_PER_SHARD)
    assert len(report.shards_read) == HARD_MAX_SHARDS


def test_missing_root_is_an_empty_report(tmp_path):
    report = audit(tmp_path / "nope", is_registered=lambda a: False, is_active=lambda a: False,
                   now_ms=NOW_MS)
    assert report.counts == dict.fromkeys(CLASSES, 0)
    assert report.next_shard == "08"


def test_report_json_has_stable_keys(tree):
    text = tree.run().to_json()
    data = json.loads(text)
    assert list(data) == sorted(data)
    assert set(data) == {"start_shard", "next_shard", "shards_read", "quarantine", "counts",
                         "orphans", "unsafe", "overflow", "quarantined", "skipped"}
    assert list(data["counts"]) == sorted(CLASSES)
    assert text == tree.run().to_json()
