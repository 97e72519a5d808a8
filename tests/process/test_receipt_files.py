"""Receipt files on a real file system: read strictly, never through a symlink, quarantine without loss."""

from __future__ import annotations

import os
import stat
import time

import pytest

from qlactors.domain.receipt import MAX_RECEIPT_BYTES, Receipt, encode_receipt, receipt_shard
from qlactors.process.receipts import (
    QUARANTINE_DIR,
    Invalid,
    Missing,
    ReceiptStore,
    Unsafe,
    Valid,
)
from qlactors.process.shard_files import UnsafePath, classify_name

ATTEMPT = "att-0190a1b2_c3d4"
OTHER = "att-other"
TOKEN = "tOk3n_-" + "A" * 36


def make_receipt(attempt_id: str = ATTEMPT, **kw) -> Receipt:
    fields = dict(schema_version=1, run_id="run-1", attempt_id=attempt_id, callback_sequence=1,
                  token=TOKEN, started_at_ms=1_700_000_000_000, finished_at_ms=1_700_000_000_500,
                  exit_code=0)
    fields.update(kw)
    return Receipt(**fields)


@pytest.fixture
def store(tmp_path) -> ReceiptStore:
    s = ReceiptStore(tmp_path / "receipts")
    s.ensure()
    return s


def publish(store: ReceiptStore, data: bytes, attempt_id: str = ATTEMPT):
    store.shard_dir(attempt_id)
    path = store.final_path(attempt_id)
    path.write_bytes(data)
    return path


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_paths_follow_the_hashed_shard(store):
    shard = receipt_shard(ATTEMPT)
    assert store.final_path(ATTEMPT) == store.root / shard / f"{ATTEMPT}.json"
    assert store.marker_path(ATTEMPT) == store.root / shard / f"{ATTEMPT}.start"
    assert not (store.root / shard).exists()  # path helpers create nothing
    assert store.shard_dir(ATTEMPT) == store.root / shard
    assert mode(store.root) == 0o700 and mode(store.root / shard) == 0o700


def test_bad_attempt_id_is_refused_before_any_path_is_built(store):
    with pytest.raises(ValueError):
        store.final_path("../escape")
    with pytest.raises(ValueError):
        store.read("a/b")


def test_symlinked_shard_dir_is_refused(store, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (store.root / receipt_shard(ATTEMPT)).symlink_to(elsewhere)
    with pytest.raises(UnsafePath):
        store.shard_dir(ATTEMPT)
    (elsewhere / f"{ATTEMPT}.json").write_bytes(encode_receipt(make_receipt()))
    assert store.read(ATTEMPT) == Unsafe("shard_unsafe")


def test_valid_receipt_reads_as_valid_with_its_exact_bytes(store):
    data = encode_receipt(make_receipt())
    publish(store, data)
    result = store.read(ATTEMPT)
    assert isinstance(result, Valid)
    assert result.receipt == make_receipt() and result.raw == data
    assert TOKEN not in repr(result)


def test_missing_receipt_reads_as_missing(store):
    assert store.read(ATTEMPT) == Missing()  # no shard directory at all
    store.shard_dir(ATTEMPT)
    assert store.read(ATTEMPT) == Missing()


def test_launcher_temp_file_alone_is_missing_and_listed_as_temp(store):
    shard = store.shard_dir(ATTEMPT)
    temp = shard / f".{ATTEMPT}.4242.tmp"
    temp.write_bytes(encode_receipt(make_receipt()))
    marker_temp = shard / f"{ATTEMPT}.start.4242.tmp"
    marker_temp.write_bytes(b"pid=1")
    fifo_dir = shard / f"{ATTEMPT}.start.4242.d"
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / "out")
    (shard / f".{OTHER}.1.tmp").write_bytes(b"")  # another attempt's temp: not ours
    assert store.read(ATTEMPT) == Missing()
    assert store.temp_files(ATTEMPT) == sorted([temp, marker_temp])
    assert store.remove_temps(ATTEMPT) == 3
    assert sorted(p.name for p in shard.iterdir()) == [f".{OTHER}.1.tmp"]


def test_half_written_receipt_is_invalid(store):
    data = encode_receipt(make_receipt())
    for cut in (1, len(data) // 2, len(data) - 1):
        publish(store, data[:cut])
        result = store.read(ATTEMPT)
        assert isinstance(result, Invalid) and result.reason == "bad_json", cut
        store.delete(ATTEMPT)


def test_oversized_receipt_is_invalid_too_large(store):
    publish(store, b" " * (MAX_RECEIPT_BYTES + 1))
    assert store.read(ATTEMPT).reason == "too_large"
    publish(store, b"x" * (10 * MAX_RECEIPT_BYTES))
    assert store.read(ATTEMPT).reason == "too_large"


@pytest.mark.parametrize("reason, mutate", [
    ("unknown_key", lambda text: text[:-1] + ',"extra":1}'),
    ("duplicate_key", lambda text: text[:-1] + ',"exitCode":0}'),
    ("bad_type", lambda text: text.replace('"exitCode":0', '"exitCode":true')),
    ("bad_type", lambda text: text.replace('"exitCode":0', '"exitCode":0.0')),
    ("bad_constant", lambda text: text.replace('"exitCode":0', '"exitCode":NaN')),
    ("not_utf8", lambda text: text.replace("run-1", "run-\udcff")),
])
def test_codec_refusals_surface_as_invalid_with_the_codec_reason(store, reason, mutate):
    text = encode_receipt(make_receipt()).decode("ascii")
    publish(store, mutate(text).encode("utf-8", "surrogateescape"))
    result = store.read(ATTEMPT)
    assert isinstance(result, Invalid)
    assert result.reason == reason
    assert TOKEN not in result.detail


def test_attempt_id_in_content_must_match_the_path(store):
    publish(store, encode_receipt(make_receipt(OTHER)))
    assert store.read(ATTEMPT) == Invalid(
        "path_mismatch", f"receipt names attempt {OTHER!r} but its path names {ATTEMPT!r}")


def test_symlink_at_the_final_name_is_unsafe_and_never_followed(store, tmp_path):
    target = tmp_path / "genuine.json"
    target.write_bytes(encode_receipt(make_receipt()))
    store.shard_dir(ATTEMPT)
    store.final_path(ATTEMPT).symlink_to(target)
    assert store.read(ATTEMPT) == Unsafe("symlink")
    # a dangling one is just as unsafe
    store.final_path(ATTEMPT).unlink()
    store.final_path(ATTEMPT).symlink_to(tmp_path / "nowhere")
    assert store.read(ATTEMPT) == Unsafe("symlink")


def test_directory_and_fifo_at_the_final_name_are_unsafe(store):
    store.shard_dir(ATTEMPT)
    final = store.final_path(ATTEMPT)
    final.mkdir()
    assert store.read(ATTEMPT) == Unsafe("directory")
    final.rmdir()
    os.mkfifo(final)
    assert store.read(ATTEMPT) == Unsafe("not_regular")  # and it did not hang


def test_quarantine_moves_the_file_into_a_0700_directory(store):
    data = encode_receipt(make_receipt(OTHER))
    publish(store, data)
    shard = receipt_shard(ATTEMPT)
    moved = store.quarantine(ATTEMPT)
    assert moved == store.root / QUARANTINE_DIR / shard / f"{ATTEMPT}.json"
    assert moved.read_bytes() == data
    assert not store.final_path(ATTEMPT).exists()
    assert mode(store.root / QUARANTINE_DIR) == 0o700
    assert mode(store.root / QUARANTINE_DIR / shard) == 0o700
    assert abs(os.lstat(moved).st_mtime - time.time()) < 60  # retention counts from now


def test_quarantine_never_overwrites_a_quarantined_file(store):
    publish(store, b"first")
    first = store.quarantine(ATTEMPT)
    publish(store, b"second")
    second = store.quarantine(ATTEMPT)
    publish(store, b"third")
    third = store.quarantine(ATTEMPT)
    assert len({first, second, third}) == 3
    assert [first.read_bytes(), second.read_bytes(), third.read_bytes()] == [b"first", b"second", b"third"]
    assert second.name == f"{ATTEMPT}.json.1"


def test_quarantine_moves_a_symlink_as_itself(store, tmp_path):
    target = tmp_path / "genuine.json"
    target.write_bytes(b"precious")
    store.shard_dir(ATTEMPT)
    store.final_path(ATTEMPT).symlink_to(target)
    moved = store.quarantine(ATTEMPT)
    assert moved.is_symlink() and os.readlink(moved) == str(target)
    assert not os.path.lexists(store.final_path(ATTEMPT))
    assert target.read_bytes() == b"precious"
    assert not (store.root / QUARANTINE_DIR / receipt_shard(ATTEMPT) / target.name).exists()


def test_quarantine_moves_a_directory_squatting_on_the_name(store):
    store.shard_dir(ATTEMPT)
    store.final_path(ATTEMPT).mkdir()
    (store.final_path(ATTEMPT) / "inside").write_bytes(b"x")
    moved = store.quarantine(ATTEMPT)
    assert (moved / "inside").read_bytes() == b"x"
    assert store.read(ATTEMPT) == Missing()


def test_quarantine_of_nothing_raises_file_not_found(store):
    with pytest.raises(FileNotFoundError):
        store.quarantine(ATTEMPT)
    store.shard_dir(ATTEMPT)
    with pytest.raises(FileNotFoundError):
        store.quarantine(ATTEMPT)


def test_delete_removes_receipt_and_marker_and_may_repeat(store):
    publish(store, encode_receipt(make_receipt()))
    store.marker_path(ATTEMPT).write_bytes(b"pid=1")
    store.delete(ATTEMPT)
    assert store.read(ATTEMPT) == Missing()
    assert not store.marker_path(ATTEMPT).exists()
    store.delete(ATTEMPT)
    store.delete("never-seen")


def _quarantine_n(store, n: int) -> list:
    paths = []
    for i in range(n):
        aid = f"q-{i}"
        publish(store, b"x", aid)
        paths.append(store.quarantine(aid))
    return paths


def test_purge_quarantine_respects_age(store):
    old, young = _quarantine_n(store, 2)
    now_ms = int(time.time() * 1000)
    hour_ago = now_ms / 1000 - 3600
    os.utime(old, (hour_ago, hour_ago))
    assert store.purge_quarantine(older_than_ms=600_000, now_ms=now_ms, limit=10) == 1
    assert not old.exists() and young.exists()
    assert store.purge_quarantine(older_than_ms=600_000, now_ms=now_ms, limit=10) == 0


def test_purge_quarantine_respects_limit(store):
    paths = _quarantine_n(store, 5)
    now_ms = int(time.time() * 1000)
    for p in paths:
        os.utime(p, (0, 0))
    assert store.purge_quarantine(older_than_ms=1000, now_ms=now_ms, limit=2) == 2
    assert sum(p.exists() for p in paths) == 3
    assert store.purge_quarantine(older_than_ms=1000, now_ms=now_ms, limit=0) == 0
    assert store.purge_quarantine(older_than_ms=1000, now_ms=now_ms, limit=10) == 3


def test_purge_quarantine_without_a_quarantine_is_a_no_op(tmp_path):
    assert ReceiptStore(tmp_path / "none").purge_quarantine(0, 10**12, 8) == 0


def test_classify_name_matches_the_launcher_names():
    assert classify_name("a-b_c.json") == ("receipt", "a-b_c")
    assert classify_name("abc.start") == ("marker", "abc")
    assert classify_name(".abc.123.tmp") == ("temp", "abc")
    assert classify_name("abc.start.123.tmp") == ("temp", "abc")
    assert classify_name("abc.start.123.d") == ("temp_dir", "abc")
    assert classify_name(".abc.123.d") == ("temp_dir", "abc")
    assert classify_name("abc.json.1") == ("other", None)
    assert classify_name("../x.json") == ("other", None)


def test_launcher_temp_names_match_the_launcher_script():
    """The patterns above are the ones launcher.sh writes; keep the two in step."""
    import importlib.resources

    script = (importlib.resources.files("qlactors.process") / "launcher.sh").read_text()
    assert 'q_tmp=$q_rdir/.$q_attempt.$$.tmp' in script
    # The marker is now written in place and the FIFO is the executor's: the marker-temp and
    # FIFO-directory patterns only cover leftovers of earlier launchers.
    code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
    assert '"$q_marker.$$.tmp"' not in code
    assert "mkdir" not in code and "mkfifo" not in code and "rm -rf" not in code


# --- LocalReceipts: the files next to a receipt ------------------------------------------------

class _Journal:
    def __init__(self) -> None:
        self.cleared: list[str] = []

    def clear(self, attempt_id: str) -> bool:
        self.cleared.append(attempt_id)
        return True


def test_fifo_path_sits_next_to_the_dropped_file_in_the_attempts_shard(store):
    from qlactors.executor.local_receipts import LocalReceipts

    files = LocalReceipts(store, _Journal(), retention_ms=1000)
    shard = store.root / receipt_shard(ATTEMPT)
    assert files.fifo_path(ATTEMPT) == shard / f"{ATTEMPT}.fifo"
    assert files.fifo_path(ATTEMPT).parent == files.dropped_path(ATTEMPT).parent
    assert files.fifo_path(ATTEMPT) != files.dropped_path(ATTEMPT)
    assert files.fifo_path(OTHER) != files.fifo_path(ATTEMPT)


def test_finish_removes_receipt_marker_dropped_file_and_fifo_then_clears_the_journal(store):
    from qlactors.executor.local_receipts import LocalReceipts

    journal = _Journal()
    files = LocalReceipts(store, journal, retention_ms=1000)
    publish(store, encode_receipt(make_receipt()))
    store.marker_path(ATTEMPT).write_text("marker\n")
    files.dropped_path(ATTEMPT).write_text("0\n")
    os.mkfifo(files.fifo_path(ATTEMPT), 0o600)
    files.finish(ATTEMPT)
    assert list(store.shard_dir(ATTEMPT).iterdir()) == []
    assert journal.cleared == [ATTEMPT]
    files.finish(ATTEMPT)  # nothing left to remove is fine
    assert journal.cleared == [ATTEMPT, ATTEMPT]


def test_make_fifo_replaces_a_stale_one_with_a_private_fifo_and_remove_fifo_tolerates_none(store):
    import stat

    from qlactors.executor.local_receipts import LocalReceipts

    files = LocalReceipts(store, _Journal(), retention_ms=1000)
    stale = files.fifo_path(ATTEMPT)
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text("left from an earlier launch")
    path = files.make_fifo(ATTEMPT)
    assert path == stale
    st = os.lstat(path)
    assert stat.S_ISFIFO(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    files.remove_fifo(ATTEMPT)
    assert not path.exists()
    files.remove_fifo(ATTEMPT)  # already gone is fine


def test_make_fifo_that_cannot_be_made_is_none(store, tmp_path):
    from qlactors.executor.local_receipts import LocalReceipts

    files = LocalReceipts(store, _Journal(), retention_ms=1000)
    blocker = files.fifo_path(ATTEMPT)
    blocker.mkdir(parents=True)  # a directory where the FIFO goes: unlink fails, nothing is made
    assert files.make_fifo(ATTEMPT) is None
    assert blocker.is_dir()
