"""Executor side: the journal's own tables, in a MetaData of their own (not the control schema's).

Edge: they live in the edge file, created by its migrations (0001-0013 of store/migrations, which
are frozen), beside the control tables; a worker: in its own journal file (file.py), created from
this MetaData. PostgreSQL never holds them (migration 0015 dropped the empty copies). Constraint
names follow the control schema's convention, so both files name them alike.
"""

from __future__ import annotations

from sqlalchemy import (BigInteger, Boolean, CheckConstraint, Column, Index, Integer, LargeBinary, MetaData,
                        String, Table, Text, false, text)

from ...store.schema import ID, MS, NAMING_CONVENTION, ms_nonneg, one_of

metadata = MetaData(naming_convention=NAMING_CONVENTION)


executor_journal = Table(
    "executor_journal",
    metadata,
    Column("attempt_id", ID, primary_key=True),  # no FK: on a worker this table lives elsewhere
    Column("run_id", ID, nullable=False),
    Column("state", String(16), nullable=False),
    Column("log_path", Text, nullable=False),
    Column("receipt_path", Text, nullable=False),
    Column("callback_token_hash", String(64), nullable=False),
    Column("boot_id", String(64)),
    Column("pid", Integer),
    Column("pgid", Integer),
    Column("start_ticks", BigInteger),
    Column("purge_after_ms", MS),
    Column("created_at_ms", MS, nullable=False),
    Column("updated_at_ms", MS, nullable=False),
    # Schema 6 (cluster, SEMANTICS.md §9 Journal): the lease this executor holds for the attempt,
    # so a restarted worker can quote it in an Attest; how far its log was shipped (§13); and the
    # executor's own clock for "finished in time" and a local timeout intent (§5, §7).
    Column("offer_id", ID),
    Column("lease_generation", Integer),
    Column("lease_token", String(64)),
    Column("session_id", ID),
    Column("session_generation", Integer),
    Column("shipped_offset", BigInteger, nullable=False, server_default=text("0")),
    Column("final_offset", BigInteger),
    Column("activated_at_ms", MS),
    Column("local_deadline_ms", MS),
    Column("timeout_intent_at_ms", MS),
    # Schema 13 (protocol 4, SEMANTICS.md §9 Owed reports): cleared while a report about the
    # attempt was still owed; the row goes when the last of them is answered, and until then no
    # reader but the owed reports sees it.
    Column("clear_pending", Boolean, nullable=False, server_default=false()),
    CheckConstraint(one_of("state", ("accepted", "launching", "started", "completed", "quarantined")),
                    name="state"),
    CheckConstraint("shipped_offset >= 0", name="offsets"),
    CheckConstraint("final_offset IS NULL OR final_offset >= 0", name="final_offset"),
    *ms_nonneg("purge_after_ms", "created_at_ms", "updated_at_ms", "activated_at_ms", "local_deadline_ms",
         "timeout_intent_at_ms"),
)
Index("ix_executor_journal_state_purge_after_ms", executor_journal.c.state, executor_journal.c.purge_after_ms)


# The (offer id, lease token) pairs of a Pull, journalled
# before it is sent, so a Pull whose answer was lost is repeated with the same pairs.
executor_pulls = Table(
    "executor_pulls",
    metadata,
    Column("offer_id", ID, primary_key=True),
    Column("pull_id", ID, nullable=False),
    Column("lease_token", String(64), nullable=False),
    Column("created_at_ms", MS, nullable=False),
    *ms_nonneg("created_at_ms"),
)
Index("ix_executor_pulls_pull_id", executor_pulls.c.pull_id)

# Schema 13 (SEMANTICS.md §9 Owed reports): every report the executor owes the
# control side, written before it is first sent and kept, re-sent unchanged, until its own answer.
executor_owed = Table(
    "executor_owed",
    metadata,
    Column("request_id", ID, primary_key=True),
    Column("kind", String(32), nullable=False),
    Column("attempt_id", ID),  # the attempt it is about; None for Register and Leave
    Column("body", LargeBinary, nullable=False),  # the message as encoded (codec.encode's body)
    Column("created_at_ms", MS, nullable=False),
    *ms_nonneg("created_at_ms"),
)
Index("ix_executor_owed_attempt_id", executor_owed.c.attempt_id)
Index("ix_executor_owed_created_at_ms", executor_owed.c.created_at_ms, executor_owed.c.request_id)

# This executor's current session and its resume secret (one row per worker id).
executor_session = Table(
    "executor_session",
    metadata,
    Column("worker_id", String(128), primary_key=True),
    Column("session_id", ID, nullable=False),
    Column("generation", Integer, nullable=False),
    Column("resume_secret", String(64), nullable=False),
    Column("boot_id", String(64), nullable=False),
    Column("updated_at_ms", MS, nullable=False),
    CheckConstraint("generation >= 1", name="generation_positive"),
    *ms_nonneg("updated_at_ms"),
)

TABLES = (executor_journal, executor_pulls, executor_session, executor_owed)
"""The journal's tables, in the order a version 1 journal had its first three."""
