"""A cluster run's log chunks on the control side (SEMANTICS.md §13): authenticated like Completed,
appended only at the expected offset, repeats acknowledged again, read back byte for byte, and
deleted with their run by retention; on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import secrets

import pytest
from sqlalchemy import func, select

from qlactors.domain.receipt import Receipt, token_hash
from qlactors.errors import BadInput
from qlactors.store.dispatch.completion import CompletionService
from qlactors.store.dispatch.log_chunks import MAX_CHUNK_BYTES, LogChunks
from qlactors.store.schema import log_chunks, run_attempts, runs
from store_helpers import new_hash, spec

WORKER = "w1"


@pytest.fixture
def chunks(repo):
    return LogChunks(repo.store)


@pytest.fixture
def flight(repo, dispatch):
    """A started attempt of worker w1: (run id, attempt id, callback token)."""
    session = dispatch.sessions.register(WORKER, 4)
    repo.tasks.add(spec(), actor_name="tester")
    run_id = repo.runs.request("job").run.id
    lease_hash = new_hash()
    offer = dispatch.offers.one(WORKER, session.session_id, session.generation, "o1", lease_hash, log_cap_bytes=0)
    token = secrets.token_urlsafe(32)
    assert dispatch.reports.activate(offer.fence(lease_hash), token_hash(token), "log").result == "applied"
    assert dispatch.reports.started(offer.fence(lease_hash), "boot", 10, 10, 99).result == "applied"
    return run_id, offer.attempt_id, token


def send(chunks, flight, offset, data, *, worker=WORKER, token=None, checksum=None):
    _, attempt_id, real = flight
    return chunks.append(worker, attempt_id, token_hash(token or real), offset, data,
                         checksum or hashlib.sha256(data).hexdigest())


def stored(repo, attempt_id):
    with repo.store.read() as conn:
        return conn.execute(select(func.count()).select_from(log_chunks)
                            .where(log_chunks.c.attempt_id == attempt_id)).scalar_one()


def test_chunks_append_at_the_expected_offset_and_read_back_exactly(chunks, flight):
    _, attempt_id, _ = flight
    assert chunks.acked_offset(attempt_id) == 0
    parts = [b"hello ", bytes(range(256)) * 3, b"\x00tail\n"]
    offset = 0
    for part in parts:
        result = send(chunks, flight, offset, part)
        offset += len(part)
        assert (result.result, result.value, result.detail) == ("applied", offset, None)
    whole = b"".join(parts)
    assert chunks.acked_offset(attempt_id) == len(whole)
    assert chunks.read(attempt_id, 0, 10_000) == whole
    assert chunks.read(attempt_id, 3, 10) == whole[3:13]  # across a chunk boundary
    assert chunks.read(attempt_id, 700, 10_000) == whole[700:]
    assert chunks.read(attempt_id, len(whole), 10) == b""


def test_a_repeat_is_acknowledged_again_and_a_different_one_is_refused(repo, chunks, flight):
    _, attempt_id, _ = flight
    send(chunks, flight, 0, b"abc")
    send(chunks, flight, 3, b"def")
    again = send(chunks, flight, 0, b"abc")
    assert (again.result, again.value, again.detail) == ("applied", 6, "repeated")
    other = send(chunks, flight, 0, b"abX")
    assert (other.result, other.value, other.detail) == ("refused", 6, "conflict")
    inside = send(chunks, flight, 1, b"bc")  # not a chunk's start: a conflict, not a repeat
    assert (inside.result, inside.detail) == ("refused", "conflict")
    assert stored(repo, attempt_id) == 2 and chunks.read(attempt_id, 0, 100) == b"abcdef"


def test_a_gap_is_refused_and_says_where_to_resume(chunks, flight):
    send(chunks, flight, 0, b"abc")
    gap = send(chunks, flight, 10, b"later")
    assert (gap.result, gap.value, gap.detail) == ("refused", 3, "gap")


@pytest.mark.parametrize("data, checksum, detail", [
    (b"", None, "empty"),
    (b"x" * (MAX_CHUNK_BYTES + 1), None, "too_large"),
    (b"abc", hashlib.sha256(b"abd").hexdigest(), "checksum"),
])
def test_invalid_chunks_are_refused(repo, chunks, flight, data, checksum, detail):
    result = send(chunks, flight, 0, data, checksum=checksum)
    assert (result.result, result.value, result.detail) == ("refused", 0, detail)
    assert stored(repo, flight[1]) == 0


def test_a_full_size_chunk_is_accepted(chunks, flight):
    data = secrets.token_bytes(MAX_CHUNK_BYTES)
    assert send(chunks, flight, 0, data).value == MAX_CHUNK_BYTES
    assert chunks.read(flight[1], 0, MAX_CHUNK_BYTES) == data


def test_chunks_are_authenticated_by_worker_and_callback_token(repo, chunks, flight):
    other = send(chunks, flight, 0, b"abc", worker="intruder")
    assert (other.result, other.value, other.detail) == ("refused", 0, "wrong_worker")
    forged = send(chunks, flight, 0, b"abc", token=secrets.token_urlsafe(32))
    assert (forged.result, forged.detail) == ("refused", "bad_token")
    unknown = chunks.append(WORKER, "0" * 36, new_hash(), 0, b"abc", hashlib.sha256(b"abc").hexdigest())
    assert (unknown.result, unknown.detail) == ("refused", "unknown_attempt")
    assert stored(repo, flight[1]) == 0
    with pytest.raises(BadInput):
        chunks.append(WORKER, flight[1], new_hash(), -1, b"abc", "00")


def test_the_tail_lands_after_the_run_is_terminal_and_the_final_offset_is_kept(repo, chunks, flight):
    run_id, attempt_id, token = flight
    send(chunks, flight, 0, b"first\n")
    assert chunks.final_offset(attempt_id) is None
    receipt = Receipt(schema_version=1, run_id=run_id, attempt_id=attempt_id, callback_sequence=1,
                      token=token, started_at_ms=1, finished_at_ms=2, exit_code=0)
    out = CompletionService(repo.store).complete(run_id, attempt_id, receipt, 0, worker_id=WORKER,
                                                 final_log_offset=12)
    assert out.run_state == "succeeded"
    assert chunks.final_offset(attempt_id) == 12
    assert send(chunks, flight, 6, b"second").value == 12
    assert chunks.read(attempt_id, 0, 100) == b"first\nsecond"


def test_retention_deletes_a_runs_chunks_with_it(repo, chunks, flight):
    from qlactors.store.cadence.retention import Retention

    run_id, attempt_id, token = flight
    send(chunks, flight, 0, b"log bytes")
    receipt = Receipt(schema_version=1, run_id=run_id, attempt_id=attempt_id, callback_sequence=1,
                      token=token, started_at_ms=1, finished_at_ms=2, exit_code=0)
    CompletionService(repo.store).complete(run_id, attempt_id, receipt, 0)
    with repo.store.write() as conn:
        conn.execute(runs.update().where(runs.c.id == run_id).values(finished_at_ms=1))
    report = Retention(repo.store, None).retire_page(  # a replica's: it holds no files
        10 * 86_400_000, max_age_ms=86_400_000, max_runs=100, page=16)
    assert report.retired == 1
    assert stored(repo, attempt_id) == 0 and chunks.acked_offset(attempt_id) == 0
    with repo.store.read() as conn:
        assert conn.execute(select(run_attempts).where(run_attempts.c.id == attempt_id)).first() is None


def _capped_flight(repo, dispatch, cap: int):
    """A started attempt of worker w1 offered with a log cap of `cap` bytes."""
    session = dispatch.sessions.register(WORKER, 4)
    repo.tasks.add(spec(), actor_name="tester")
    repo.runs.request("job")
    lease_hash = new_hash()
    offer = dispatch.offers.one(WORKER, session.session_id, session.generation, "o1", lease_hash, log_cap_bytes=cap)
    assert offer.log_cap_bytes == cap
    token = secrets.token_urlsafe(32)
    assert dispatch.reports.activate(offer.fence(lease_hash), token_hash(token), "log").result == "applied"
    return offer.run_id, offer.attempt_id, token


def test_a_chunk_past_the_final_offset_is_refused_and_stores_nothing(repo, chunks, flight):
    run_id, attempt_id, token = flight
    send(chunks, flight, 0, b"first\n")
    receipt = Receipt(schema_version=1, run_id=run_id, attempt_id=attempt_id, callback_sequence=1,
                      token=token, started_at_ms=1, finished_at_ms=2, exit_code=0)
    CompletionService(repo.store).complete(run_id, attempt_id, receipt, 0, worker_id=WORKER, final_log_offset=12)
    result = send(chunks, flight, 6, b"second and more")  # ends at 21, past the final 12
    assert (result.result, result.value, result.detail) == ("refused", 6, "past_final_offset")
    assert stored(repo, attempt_id) == 1 and chunks.read(attempt_id, 0, 100) == b"first\n"
    assert send(chunks, flight, 6, b"second").value == 12  # up to the final offset: kept
    assert send(chunks, flight, 12, b"x").detail == "past_final_offset"  # not one byte after it
    assert chunks.read(attempt_id, 0, 100) == b"first\nsecond"


def test_a_chunk_past_the_log_cap_the_offer_carried_is_refused_and_stores_nothing(repo, dispatch, chunks):
    capped = _capped_flight(repo, dispatch, cap=10)
    attempt_id = capped[1]
    with repo.store.read() as conn:
        assert conn.execute(select(run_attempts.c.log_cap_bytes).where(
            run_attempts.c.id == attempt_id)).scalar_one() == 10
    assert send(chunks, capped, 0, b"0123").result == "applied"
    result = send(chunks, capped, 4, b"456789ab")  # ends at 12, past the cap of 10
    assert (result.result, result.value, result.detail) == ("refused", 4, "past_log_cap")
    assert stored(repo, attempt_id) == 1
    assert send(chunks, capped, 4, b"456789").value == 10  # exactly the cap: kept
    assert send(chunks, capped, 10, b"!").detail == "past_log_cap"
    assert chunks.read(attempt_id, 0, 100) == b"0123456789"


def test_a_repeated_pull_offers_the_cap_first_recorded(repo, dispatch):
    """The same Pull again (its answer was lost) through a replica with another `log_cap_bytes`
    is answered with the cap the attempt's chunks are judged by."""
    session = dispatch.sessions.register(WORKER, 4)
    repo.tasks.add(spec(), actor_name="tester")
    repo.runs.request("job")
    lease_hash = new_hash()
    first = dispatch.offers.one(WORKER, session.session_id, session.generation, "o1", lease_hash, log_cap_bytes=100)
    again = dispatch.offers.one(WORKER, session.session_id, session.generation, "o1", lease_hash, log_cap_bytes=999)
    assert (again.attempt_id, again.log_cap_bytes) == (first.attempt_id, 100)
