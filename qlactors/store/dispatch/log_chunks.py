"""Store: a cluster run's log on the control side: acknowledged chunks appended at their expected offset
(SEMANTICS.md §13).

A chunk is authenticated like `Completed` — the attempt's worker id equals the authenticated
worker id and the callback token hash matches in constant time — not by the lease, so the tail
still lands after the worker re-registered and after the run is terminal. Each append is one
short transaction (or part of a batch of reports, `report_batch.py`) under the attempt's
advisory lock (`attempt:<id>`, the first key of the global order of §9). The log is contiguous by construction: a chunk lands only at the end of the
last one (0 for the first), so `read` concatenates rows without looking for holes.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import and_, bindparam, func, select

from ...domain.results import Outcome, Result
from ...errors import BadInput
from ..engine import Store
from ..records import check_id, same_hash
from ..schema import log_chunks, run_attempts
from .report_batch import alone
from .report_locks import HeldRows, LockRequest

MAX_CHUNK_BYTES = 128 * 1024
MAX_READ_BYTES = 4 * 1024 * 1024

_END = select(func.coalesce(func.max(log_chunks.c.start_offset + log_chunks.c.length), 0)).where(
    log_chunks.c.attempt_id == bindparam("attempt_id"))
_AT = select(log_chunks.c.length, log_chunks.c.checksum).where(and_(
    log_chunks.c.attempt_id == bindparam("attempt_id"), log_chunks.c.start_offset == bindparam("offset")))
_SPAN = (select(log_chunks.c.start_offset, log_chunks.c.data).where(and_(
    log_chunks.c.attempt_id == bindparam("attempt_id"),
    log_chunks.c.start_offset + log_chunks.c.length > bindparam("offset"),
    log_chunks.c.start_offset < bindparam("end")))
    .order_by(log_chunks.c.start_offset))
_INSERT = log_chunks.insert()
_FINAL = select(run_attempts.c.log_final_offset).where(run_attempts.c.id == bindparam("attempt_id"))


class LogChunks:
    """Append, acknowledge and read a cluster attempt's log chunks.

    An append's Outcome is `applied` (the chunk is stored, now or by an identical earlier send)
    or `refused`; its `value` is the acked offset: the end of the stored log, where the worker
    resumes (0 when unauthenticated); `detail` is why it was refused (unknown_attempt,
    wrong_worker, no_token, bad_token, empty, too_large, checksum, past_final_offset,
    past_log_cap, conflict, gap) or `repeated` for an identical repeat.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    def append(self, worker_id: str, attempt_id: str, callback_token_hash: str, offset: int,
               data: bytes, checksum: str) -> Outcome[int]:
        """Store `data` at `offset` if that is where the log ends; see the class doc for the answers."""
        return alone(self.store, LockRequest(attempt_id, log_end=True), lambda conn, rows: self.append_in(
            conn, rows, worker_id, attempt_id, callback_token_hash, offset, data, checksum))

    def append_in(self, conn, rows: HeldRows, worker_id: str, attempt_id: str, callback_token_hash: str,
                  offset: int, data: bytes, checksum: str) -> Outcome[int]:
        """`append` in a transaction holding `rows` (`report_locks.hold`, one report or a batch)."""
        check_id("worker id", worker_id, 128)
        check_id("attempt id", attempt_id)
        if type(offset) is not int or offset < 0:
            raise BadInput("a chunk offset is a non-negative integer")
        if not isinstance(data, (bytes, bytearray, memoryview)) or not isinstance(checksum, str):
            raise BadInput("a chunk is bytes with a hex SHA-256 checksum")
        data = bytes(data)
        attempt = rows.attempts.get(attempt_id)
        if attempt is None:
            return Outcome(Result.REFUSED, "unknown_attempt", value=0)
        if attempt.worker_id != worker_id:
            return Outcome(Result.REFUSED, "wrong_worker", value=0)
        if attempt.callback_token_hash is None:
            return Outcome(Result.REFUSED, "no_token", value=0)
        if not same_hash(attempt.callback_token_hash, callback_token_hash):
            return Outcome(Result.REFUSED, "bad_token", value=0)
        end = rows.log_ends[attempt_id]  # held with `log_end`
        problem = _invalid(data, checksum)
        if problem is not None:
            return Outcome(Result.REFUSED, problem, value=end)
        problem = _out_of_bounds(attempt, offset + len(data))
        if problem is not None:
            return Outcome(Result.REFUSED, problem, value=end)
        if offset > end:
            return Outcome(Result.REFUSED, "gap", value=end)
        if offset < end:
            stored = conn.execute(_AT, {"attempt_id": attempt_id, "offset": offset}).first()
            if stored is not None and stored.length == len(data) and stored.checksum == checksum:
                return Outcome(Result.APPLIED, "repeated", value=end)
            return Outcome(Result.REFUSED, "conflict", value=end)
        conn.execute(_INSERT, dict(attempt_id=attempt_id, start_offset=offset, run_id=attempt.run_id,
                                   length=len(data), checksum=checksum, data=data, created_at_ms=rows.now))
        rows.log_ends[attempt_id] = end + len(data)  # the next chunk of this batch follows it
        return Outcome(Result.APPLIED, value=end + len(data))

    def acked_offset(self, attempt_id: str) -> int:
        """The end of the stored log: how many bytes are acknowledged (0 before the first chunk)."""
        with self.store.read() as conn:
            return conn.execute(_END, {"attempt_id": attempt_id}).scalar_one()

    def read(self, attempt_id: str, offset: int, limit: int) -> bytes:
        """The stored bytes from `offset`, at most `limit` (bounded by MAX_READ_BYTES), exactly."""
        if type(offset) is not int or offset < 0 or type(limit) is not int or limit < 0:
            raise BadInput("offset and limit are non-negative integers")
        end = offset + min(limit, MAX_READ_BYTES)
        with self.store.read() as conn:
            rows = conn.execute(_SPAN, {"attempt_id": attempt_id, "offset": offset, "end": end}).all()
        out = bytearray()
        for start, data in rows:
            out += bytes(data)[max(offset - start, 0):end - start]
        return bytes(out)

    def final_offset(self, attempt_id: str) -> int | None:
        """The final offset the completion recorded (None before it, or on edge)."""
        with self.store.read() as conn:
            return conn.execute(_FINAL, {"attempt_id": attempt_id}).scalar()


def _out_of_bounds(attempt, chunk_end: int) -> str | None:
    """A chunk ending past the final offset its completion recorded, or past the log cap its
    offer carried (0 or NULL: none recorded), is no part of the job's log (SEMANTICS.md §13)."""
    if attempt.log_final_offset is not None and chunk_end > attempt.log_final_offset:
        return "past_final_offset"
    if attempt.log_cap_bytes and chunk_end > attempt.log_cap_bytes:
        return "past_log_cap"
    return None


def _invalid(data: bytes, checksum: str) -> str | None:
    if not data:
        return "empty"
    if len(data) > MAX_CHUNK_BYTES:
        return "too_large"
    if hashlib.sha256(data).hexdigest() != checksum:
        return "checksum"
    return None
