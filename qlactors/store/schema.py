"""Store: the control schema for SQLite and PostgreSQL: every table of SEMANTICS.md §1, with its invariants.

Size: one MetaData for every control table, so that each constraint reads beside its table.

Times are UTC epoch milliseconds (BigInteger). JSON is stored as text so both dialects read it
the same way. Status columns are plain strings guarded by CHECK constraints, not native enums,
so adding a state is a migration of one constraint.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from ..domain.metrics import DURATION_BUCKETS_S
from ..domain.retention import KEEP_AGE_MS_RANGE, KEEP_RUNS_RANGE
from ..domain.states import (
    ATTEMPT_ACTIVE,
    AttemptStatus,
    CancelReason,
    LeaseReleaseReason,
    LeaseStatus,
    RetrySafety,
    RunStatus,
    TaskEventType,
    TriggerType,
)

# Explicit names for every constraint, so a later migration can find and drop them (SQLite
# needs a table rebuild for that, and the rebuild must know the names).
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

ID = String(36)
MS = BigInteger


def one_of(column: str, values) -> str:
    """A CHECK expression: `column` holds one of `values` (shared with the executor journal's schema)."""
    listed = ", ".join(f"'{getattr(v, 'value', v)}'" for v in values)
    return f"{column} IN ({listed})"


def ms_nonneg(*columns: str) -> list[CheckConstraint]:
    """CHECKs that each millisecond column is NULL or non-negative."""
    return [CheckConstraint(f"{c} IS NULL OR {c} >= 0", name=f"{c}_nonneg") for c in columns]


def _active_attempt_where() -> str:
    return one_of("status", sorted(s.value for s in ATTEMPT_ACTIVE))


schema_version = Table(
    "qlactors_schema",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("version", Integer, nullable=False),
    Column("applied_at_ms", MS, nullable=False),
    CheckConstraint("id = 1", name="singleton"),
)

tasks = Table(
    "tasks",
    metadata,
    Column("id", ID, primary_key=True),
    Column("name", String(128), nullable=False),
    Column("current_revision", Integer, nullable=False),
    Column("version", Integer, nullable=False),  # compare-and-set fence for every head change
    Column("enabled", Boolean, nullable=False),
    Column("created_at_ms", MS, nullable=False),
    Column("updated_at_ms", MS, nullable=False),
    Column("deleted_at_ms", MS),
    # Schema 3: the task's own retention bounds (NULL: the global config bound). On the head, not
    # in task_revisions: a revision is what a run pins and executes, while retention is decided
    # when a run is retired, by the bounds in force then; changing them is no new revision.
    Column("retention_max_age_ms", MS),
    Column("retention_max_runs", Integer),
    CheckConstraint("current_revision >= 1 AND version >= 1", name="counters_positive"),
    CheckConstraint(f"retention_max_age_ms IS NULL OR (retention_max_age_ms >= {KEEP_AGE_MS_RANGE[0]} "
                    f"AND retention_max_age_ms <= {KEEP_AGE_MS_RANGE[1]})", name="retention_max_age_range"),
    CheckConstraint(f"retention_max_runs IS NULL OR (retention_max_runs >= {KEEP_RUNS_RANGE[0]} "
                    f"AND retention_max_runs <= {KEEP_RUNS_RANGE[1]})", name="retention_max_runs_range"),
    *ms_nonneg("created_at_ms", "updated_at_ms", "deleted_at_ms"),
)
# A removed task keeps its row (history stays readable) and frees its name.
Index("ix_tasks_live_name", tasks.c.name, unique=True,
      sqlite_where=text("deleted_at_ms IS NULL"), postgresql_where=text("deleted_at_ms IS NULL"))

task_revisions = Table(
    "task_revisions",
    metadata,
    Column("task_id", ID, ForeignKey("tasks.id"), nullable=False),
    Column("revision", Integer, nullable=False),
    Column("command_json", Text, nullable=False),
    Column("cwd", Text),
    Column("env_json", Text, nullable=False),
    Column("timeout_ms", MS),
    Column("stop_grace_ms", Integer, nullable=False),
    Column("max_concurrent", Integer, nullable=False),
    Column("retry_on_lost", Boolean, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("safety", String(16), nullable=False),
    Column("backoff_base_ms", MS, nullable=False),
    Column("backoff_max_ms", MS, nullable=False),
    Column("labels_json", Text, nullable=False),
    Column("created_at_ms", MS, nullable=False),
    # Schema 4: leave what the job left in its process group running (SEMANTICS.md §5); how many
    # cron fires of the task may wait `queued` under overlap `queue` (§8); the most a fire is
    # delayed at random to spread many tasks' schedules (§8, 0 = none).
    Column("keep_leftovers", Boolean, nullable=False),
    Column("max_queued", Integer, nullable=False),
    Column("random_delay_ms", MS, nullable=False),
    PrimaryKeyConstraint("task_id", "revision"),
    CheckConstraint("revision >= 1", name="revision_positive"),
    CheckConstraint("timeout_ms IS NULL OR (timeout_ms >= 1 AND timeout_ms <= 31536000000)",
                    name="timeout_range"),
    CheckConstraint("stop_grace_ms >= 0 AND stop_grace_ms <= 30000", name="stop_grace_range"),
    CheckConstraint("max_concurrent >= 1 AND max_concurrent <= 1024", name="max_concurrent_range"),
    CheckConstraint("max_attempts >= 1 AND max_attempts <= 16", name="max_attempts_range"),
    CheckConstraint(one_of("safety", RetrySafety), name="safety"),
    CheckConstraint("backoff_base_ms >= 0 AND backoff_base_ms <= backoff_max_ms "
                    "AND backoff_max_ms <= 86400000", name="backoff_range"),
    CheckConstraint("max_queued >= 1 AND max_queued <= 1024", name="max_queued_range"),
    CheckConstraint("random_delay_ms >= 0 AND random_delay_ms <= 86400000", name="random_delay_range"),
    *ms_nonneg("created_at_ms"),
)

triggers = Table(
    "triggers",
    metadata,
    Column("id", ID, primary_key=True),
    Column("task_id", ID, ForeignKey("tasks.id"), nullable=False),
    Column("revision", Integer, nullable=False),
    Column("cron", String(768), nullable=False),
    Column("tz", String(64), nullable=False),
    Column("misfire", String(16), nullable=False),
    Column("grace_ms", MS, nullable=False),
    Column("overlap", String(16), nullable=False),
    Column("created_at_ms", MS, nullable=False),
    Column("updated_at_ms", MS, nullable=False),
    Column("deleted_at_ms", MS),
    CheckConstraint("revision >= 1", name="revision_positive"),
    CheckConstraint(one_of("misfire", ("fire_once", "skip")), name="misfire"),
    CheckConstraint(one_of("overlap", ("queue", "skip", "replace")), name="overlap"),
    CheckConstraint("grace_ms >= 0", name="grace_nonneg"),
    *ms_nonneg("created_at_ms", "updated_at_ms", "deleted_at_ms"),
)
Index("ix_triggers_task_id", triggers.c.task_id)

trigger_schedules = Table(
    "trigger_schedules",
    metadata,
    Column("trigger_id", ID, ForeignKey("triggers.id"), primary_key=True),
    Column("trigger_revision", Integer, nullable=False),
    Column("next_fire_at_ms", MS),  # NULL: not yet initialised
    Column("last_scheduled_at_ms", MS),
    Column("state_version", Integer, nullable=False),
    Column("claim_owner", String(64)),
    Column("claim_token_hash", String(64)),
    Column("claim_version", Integer, nullable=False),
    Column("claim_expires_at_ms", MS),
    Column("updated_at_ms", MS, nullable=False),
    CheckConstraint("state_version >= 0 AND claim_version >= 0", name="versions_nonneg"),
    *ms_nonneg("next_fire_at_ms", "last_scheduled_at_ms", "claim_expires_at_ms", "updated_at_ms"),
)
Index("ix_trigger_schedules_due", trigger_schedules.c.next_fire_at_ms, trigger_schedules.c.trigger_id)

trigger_events = Table(
    "trigger_events",
    metadata,
    Column("id", ID, primary_key=True),
    Column("trigger_id", ID, ForeignKey("triggers.id"), nullable=False),
    Column("trigger_revision", Integer, nullable=False),
    Column("type", String(16), nullable=False),
    Column("scheduled_for_ms", MS, nullable=False),
    Column("occurrences", Integer, nullable=False),
    Column("run_id", ID, ForeignKey("runs.id")),
    Column("created_at_ms", MS, nullable=False),
    CheckConstraint(one_of("type", ("skipped", "missed")), name="type"),
    CheckConstraint("occurrences >= 1", name="occurrences_positive"),
    *ms_nonneg("scheduled_for_ms", "created_at_ms"),
)
Index("ix_trigger_events_trigger_id_created_at_ms", trigger_events.c.trigger_id,
      trigger_events.c.created_at_ms)
Index("ix_trigger_events_run_id", trigger_events.c.run_id,
      sqlite_where=text("run_id IS NOT NULL"), postgresql_where=text("run_id IS NOT NULL"))

runs = Table(
    "runs",
    metadata,
    Column("id", ID, primary_key=True),
    Column("task_id", ID, ForeignKey("tasks.id"), nullable=False),
    Column("task_revision", Integer, nullable=False),
    Column("trigger_type", String(16), nullable=False),
    Column("trigger_id", ID, ForeignKey("triggers.id")),
    Column("status", String(16), nullable=False),
    Column("version", Integer, nullable=False),
    Column("event_sequence", Integer, nullable=False),
    Column("scheduled_for_ms", MS),
    Column("idempotency_key", String(256)),
    Column("cancel_requested_at_ms", MS),
    Column("cancel_reason", String(16)),
    Column("error_code", String(64)),
    Column("error_summary", String(512)),
    Column("retry_of_run_id", ID, ForeignKey("runs.id")),
    Column("created_at_ms", MS, nullable=False),
    Column("queued_at_ms", MS),
    Column("started_at_ms", MS),
    Column("finished_at_ms", MS),
    Column("updated_at_ms", MS, nullable=False),
    # Schema 4: not offered before this time (a cron fire's random delay); NULL: at once.
    Column("not_before_ms", MS),
    UniqueConstraint("idempotency_key"),
    CheckConstraint(one_of("status", RunStatus), name="status"),
    CheckConstraint(one_of("trigger_type", TriggerType), name="trigger_type"),
    CheckConstraint(f"cancel_reason IS NULL OR {one_of('cancel_reason', CancelReason)}",
                    name="cancel_reason"),
    CheckConstraint("(cancel_reason IS NULL) = (cancel_requested_at_ms IS NULL)", name="cancel_intent"),
    CheckConstraint("version >= 1 AND event_sequence >= 1", name="counters_positive"),
    CheckConstraint(
        "(finished_at_ms IS NULL) = (status NOT IN ('succeeded', 'failed', 'cancelled', 'timed_out'))",
        name="finished_iff_terminal"),
    CheckConstraint("trigger_type <> 'cron' OR trigger_id IS NOT NULL", name="cron_has_trigger"),
    *ms_nonneg("scheduled_for_ms", "cancel_requested_at_ms", "created_at_ms", "queued_at_ms",
         "started_at_ms", "finished_at_ms", "updated_at_ms", "not_before_ms"),
)
Index("ix_runs_created_at_ms_id", runs.c.created_at_ms, runs.c.id)
Index("ix_runs_task_id_created_at_ms_id", runs.c.task_id, runs.c.created_at_ms, runs.c.id)
Index("ix_runs_status_created_at_ms_id", runs.c.status, runs.c.created_at_ms, runs.c.id)
# Schema 2: the dispatch query counts a task's dispatched runs and picks the oldest queued one.
Index("ix_runs_task_id_status", runs.c.task_id, runs.c.status)
Index("ix_runs_status_queued_at_ms_id", runs.c.status, runs.c.queued_at_ms, runs.c.id)
# Schema 3: retention picks finished runs oldest first, overall (age) and per task (count), and
# clears the references other runs hold to a retired one.
Index("ix_runs_finished_at_ms_id", runs.c.finished_at_ms, runs.c.id,
      sqlite_where=text("finished_at_ms IS NOT NULL"), postgresql_where=text("finished_at_ms IS NOT NULL"))
Index("ix_runs_task_id_finished_at_ms_id", runs.c.task_id, runs.c.finished_at_ms, runs.c.id,
      sqlite_where=text("finished_at_ms IS NOT NULL"), postgresql_where=text("finished_at_ms IS NOT NULL"))
Index("ix_runs_retry_of_run_id", runs.c.retry_of_run_id,
      sqlite_where=text("retry_of_run_id IS NOT NULL"), postgresql_where=text("retry_of_run_id IS NOT NULL"))

run_attempts = Table(
    "run_attempts",
    metadata,
    Column("id", ID, primary_key=True),
    Column("run_id", ID, ForeignKey("runs.id"), nullable=False),
    Column("number", Integer, nullable=False),
    Column("status", String(16), nullable=False),
    Column("executor_type", String(32), nullable=False),
    Column("worker_id", String(128)),
    Column("session_id", ID),
    Column("session_generation", Integer),
    Column("boot_id", String(64)),
    Column("pid", Integer),
    Column("pgid", Integer),
    Column("start_ticks", BigInteger),
    Column("log_artifact_id", String(256)),
    Column("callback_token_hash", String(64)),
    Column("callback_sequence", Integer, nullable=False),
    Column("deadline_at_ms", MS),
    Column("exit_code", Integer),
    Column("signal", Integer),
    Column("log_dropped_bytes", BigInteger),
    Column("error_code", String(64)),
    Column("error_summary", String(512)),
    # Read-only projection of the run lease (the lease table is the authority).
    Column("offer_id", ID),
    Column("lease_generation", Integer),
    Column("lease_version", Integer),
    Column("lease_expires_at_ms", MS),
    Column("created_at_ms", MS, nullable=False),
    Column("started_at_ms", MS),
    Column("finished_at_ms", MS),
    Column("updated_at_ms", MS, nullable=False),
    # Schema 6 (cluster, SEMANTICS.md §13): the log's final offset, recorded with the outcome;
    # `logs -f` ends there. NULL on edge (the log is a local file) and before the completion.
    Column("log_final_offset", BigInteger),
    # Schema 6: what the attempt's worker last attested about its process (SEMANTICS.md §9
    # Re-attest), and when (database time); recovery's evidence predicate reads it (§10).
    Column("evidence", String(32)),
    Column("evidence_at_ms", MS),
    # Schema 9 (issue 17, SEMANTICS.md §10): the lease generation the evidence speaks of (recovery
    # trusts only the attempt's current one; every new lease and every activation clears all
    # three), and who said it, for `confirm-stopped` (the operator's name).
    Column("evidence_lease_generation", Integer),
    Column("evidence_by", String(128)),
    # Schema 12: the log cap the offer carried (the replica's `log_cap_bytes`); a log chunk past
    # it, or past `log_final_offset`, is refused (SEMANTICS.md §13). NULL on edge.
    Column("log_cap_bytes", BigInteger),
    UniqueConstraint("run_id", "number"),
    CheckConstraint("number >= 1", name="number_positive"),
    CheckConstraint(one_of("status", AttemptStatus), name="status"),
    CheckConstraint("callback_sequence >= 0", name="callback_sequence_nonneg"),
    CheckConstraint("exit_code IS NULL OR (exit_code >= 0 AND exit_code <= 255)", name="exit_code_range"),
    CheckConstraint("signal IS NULL OR (signal >= 1 AND signal <= 64)", name="signal_range"),
    CheckConstraint("log_dropped_bytes IS NULL OR log_dropped_bytes >= 0", name="log_dropped_nonneg"),
    CheckConstraint("log_final_offset IS NULL OR log_final_offset >= 0", name="log_final_offset_nonneg"),
    CheckConstraint("log_cap_bytes IS NULL OR log_cap_bytes >= 0", name="log_cap_bytes_nonneg"),
    CheckConstraint("evidence IS NULL OR evidence IN ('stopped', 'ended', 'ended_with_receipt', "
                    "'never_launched', 'launch_unknown', 'rebooted', 'retired', 'confirmed_stopped')",
                    name="evidence"),
    CheckConstraint("evidence_lease_generation IS NULL OR evidence_lease_generation >= 1",
                    name="evidence_lease_generation_positive"),
    CheckConstraint("pid IS NULL OR pid > 0", name="pid_positive"),
    # An attempt without a callback token never activated: still claimed, cancelled or lost
    # before activation, or failed because no offer could carry it (OFFER_UNENCODABLE).
    CheckConstraint("status = 'claimed' OR callback_token_hash IS NOT NULL OR status IN ('cancelled', 'lost') "
                    "OR (status = 'failed' AND error_code = 'OFFER_UNENCODABLE')",
                    name="token_after_claim"),
    *ms_nonneg("deadline_at_ms", "lease_expires_at_ms", "created_at_ms", "started_at_ms",
         "finished_at_ms", "updated_at_ms", "evidence_at_ms"),
)
# At most one attempt of a run may be live at a time.
Index("ix_run_attempts_one_active", run_attempts.c.run_id, unique=True,
      sqlite_where=text(_active_attempt_where()), postgresql_where=text(_active_attempt_where()))
Index("ix_run_attempts_status_deadline_at_ms", run_attempts.c.status, run_attempts.c.deadline_at_ms)

run_events = Table(
    "run_events",
    metadata,
    Column("id", ID, primary_key=True),
    Column("run_id", ID, ForeignKey("runs.id"), nullable=False),
    Column("sequence", Integer, nullable=False),
    Column("type", String(48), nullable=False),
    Column("actor_type", String(16), nullable=False),
    # Schema 16: who asked, for a change a person made (the API token's name, or the CLI's
    # user); NULL for what the runtime did on its own.
    Column("actor_name", String(128)),
    Column("attempt_id", ID, ForeignKey("run_attempts.id")),
    Column("dedupe_key", String(256)),
    Column("payload_json", Text, nullable=False),
    Column("created_at_ms", MS, nullable=False),
    UniqueConstraint("run_id", "sequence"),
    CheckConstraint("sequence >= 1", name="sequence_positive"),
    CheckConstraint("length(payload_json) <= 16384", name="payload_size"),
    *ms_nonneg("created_at_ms"),
)
Index("ix_run_events_dedupe", run_events.c.run_id, run_events.c.dedupe_key, unique=True,
      sqlite_where=text("dedupe_key IS NOT NULL"), postgresql_where=text("dedupe_key IS NOT NULL"))

run_retry_policies = Table(
    "run_retry_policies",
    metadata,
    Column("run_id", ID, ForeignKey("runs.id"), primary_key=True),
    Column("max_attempts", Integer, nullable=False),
    Column("retry_on_lost", Boolean, nullable=False),
    Column("safety", String(16), nullable=False),
    Column("backoff_base_ms", MS, nullable=False),
    Column("backoff_max_ms", MS, nullable=False),
    Column("next_attempt_at_ms", MS),
    Column("version", Integer, nullable=False),
    Column("created_at_ms", MS, nullable=False),
    Column("updated_at_ms", MS, nullable=False),
    CheckConstraint("max_attempts >= 1 AND max_attempts <= 16", name="max_attempts_range"),
    CheckConstraint(one_of("safety", RetrySafety), name="safety"),
    CheckConstraint("backoff_base_ms >= 0 AND backoff_base_ms <= backoff_max_ms "
                    "AND backoff_max_ms <= 86400000", name="backoff_range"),
    # The admission rule, kept by the schema too: no unsafe automatic re-run.
    CheckConstraint("NOT (retry_on_lost AND max_attempts > 1 AND safety = 'unknown')", name="safe_retry"),
    CheckConstraint("version >= 0", name="version_nonneg"),
    *ms_nonneg("next_attempt_at_ms", "created_at_ms", "updated_at_ms"),
)
Index("ix_run_retry_policies_due", run_retry_policies.c.next_attempt_at_ms, run_retry_policies.c.run_id)


worker_sessions = Table(
    "worker_sessions",
    metadata,
    Column("session_id", ID, primary_key=True),
    Column("worker_id", String(128), nullable=False),
    Column("generation", Integer, nullable=False),
    Column("status", String(16), nullable=False),
    Column("version", Integer, nullable=False),
    Column("capacity", Integer, nullable=False),
    Column("free_slots", Integer, nullable=False),
    Column("heartbeat_at_ms", MS),
    Column("lease_expires_at_ms", MS),  # NULL: lives as long as the process (edge)
    Column("created_at_ms", MS, nullable=False),
    Column("updated_at_ms", MS, nullable=False),
    # Schema 6 (cluster, SEMANTICS.md §9 Sessions): the worker's boot id (a resume after a reboot
    # is refused), the hash of the resume secret, the last heartbeat's number and its stored
    # answer (a repeat gets the same answer), the worker's labels, database time minus the
    # worker's clock at the last heartbeat, and when the session ended (expired, superseded,
    # offline), which the recovery grace counts from.
    Column("boot_id", String(64)),
    Column("resume_secret_hash", String(64)),
    Column("heartbeat_seq", BigInteger, nullable=False, server_default=text("0")),
    Column("heartbeat_answer", Text),
    Column("labels_json", Text, nullable=False, server_default=text("'[]'")),
    Column("clock_skew_ms", BigInteger),
    Column("ended_at_ms", MS),
    # Schema 8: when the session was drained (`Sessions.end`: a planned stop); recovery counts a
    # drained session as ended only `drain_grace_ms` after it ended (SEMANTICS.md §9 Drain).
    Column("drained_at_ms", MS),
    # Schema 10 (SEMANTICS.md §9 Register once, Revoked and retired): the `register_id` of the
    # Register that opened the session and of the resume that last rotated its secret (a repeat
    # of either gets the same answer), and `revoked` / `retired` when the operator ended it
    # (such a session is never resumed, drained or not).
    Column("register_id", String(64)),
    Column("resume_register_id", String(64)),
    Column("ended_by", String(16)),
    # Schema 14: `duplicate` on a session opened by taking a worker's key back from a second live
    # process presenting it (session_rules.duplicate_verdict); `workers` shows it.
    Column("note", String(32)),
    UniqueConstraint("worker_id", "generation"),
    CheckConstraint(one_of("status", ("online", "draining", "offline")), name="status"),
    CheckConstraint(one_of("ended_by", ("revoked", "retired")), name="ended_by"),
    CheckConstraint("generation >= 1 AND version >= 0", name="counters"),
    CheckConstraint("capacity >= 0 AND free_slots >= 0 AND free_slots <= capacity", name="slots"),
    CheckConstraint("heartbeat_seq >= 0", name="heartbeat_seq_nonneg"),
    *ms_nonneg("heartbeat_at_ms", "lease_expires_at_ms", "created_at_ms", "updated_at_ms", "ended_at_ms",
         "drained_at_ms"),
)

run_dispatch_leases = Table(
    "run_dispatch_leases",
    metadata,
    Column("attempt_id", ID, ForeignKey("run_attempts.id"), nullable=False),
    Column("lease_generation", Integer, nullable=False),
    Column("run_id", ID, ForeignKey("runs.id"), nullable=False),
    Column("status", String(16), nullable=False),
    Column("version", Integer, nullable=False),
    Column("worker_id", String(128), nullable=False),
    Column("session_id", ID, ForeignKey("worker_sessions.session_id"), nullable=False),
    Column("session_generation", Integer, nullable=False),
    Column("token_hash", String(64), nullable=False),
    Column("offer_id", ID, nullable=False),
    Column("expires_at_ms", MS),  # NULL: lives as long as the runtime process (edge)
    Column("release_reason", String(16)),
    Column("created_at_ms", MS, nullable=False),
    Column("updated_at_ms", MS, nullable=False),
    PrimaryKeyConstraint("attempt_id", "lease_generation"),
    UniqueConstraint("offer_id"),
    CheckConstraint(one_of("status", LeaseStatus), name="status"),
    CheckConstraint(f"release_reason IS NULL OR {one_of('release_reason', LeaseReleaseReason)}",
                    name="release_reason"),
    CheckConstraint("(status = 'released') = (release_reason IS NOT NULL)", name="released_has_reason"),
    CheckConstraint("lease_generation >= 1 AND version >= 1", name="counters_positive"),
    *ms_nonneg("expires_at_ms", "created_at_ms", "updated_at_ms"),
)
# One live lease per attempt.
Index("ix_run_dispatch_leases_one_leased", run_dispatch_leases.c.attempt_id, unique=True,
      sqlite_where=text("status = 'leased'"), postgresql_where=text("status = 'leased'"))
Index("ix_run_dispatch_leases_status_expires_at_ms", run_dispatch_leases.c.status,
      run_dispatch_leases.c.expires_at_ms)

# Schema 3: what is left of a run retention deleted, so `logs` and `show` can say "retired"
# instead of "no such run". No FK to runs: the run row is gone by design.
run_tombstones = Table(
    "run_tombstones",
    metadata,
    Column("run_id", ID, primary_key=True),
    Column("task_id", ID, ForeignKey("tasks.id"), nullable=False),
    Column("finished_at_ms", MS, nullable=False),
    Column("retired_at_ms", MS, nullable=False),
    Column("reason", String(16), nullable=False),
    CheckConstraint(one_of("reason", ("max_age", "max_runs")), name="reason"),
    *ms_nonneg("finished_at_ms", "retired_at_ms"),
)
# Tombstones are pruned by the same two bounds as runs: overall by age, per task by count.
Index("ix_run_tombstones_retired_at_ms_run_id", run_tombstones.c.retired_at_ms, run_tombstones.c.run_id)
Index("ix_run_tombstones_task_id_retired_at_ms_run_id", run_tombstones.c.task_id,
      run_tombstones.c.retired_at_ms, run_tombstones.c.run_id)


# --- schema 6: the cluster (SEMANTICS.md §9, §13) ---------------------------------------------

# The allow-list: which CurveZMQ public key speaks for which worker id (`worker allow` / `revoke`).
worker_keys = Table(
    "worker_keys",
    metadata,
    Column("worker_id", String(128), primary_key=True),
    Column("public_key", String(40), nullable=False),  # Z85 text of the 32-byte CURVE key
    Column("created_at_ms", MS, nullable=False),
    UniqueConstraint("public_key"),
    CheckConstraint("length(public_key) = 40", name="public_key_z85"),
    *ms_nonneg("created_at_ms"),
)

# A cluster run's log on the control side: chunks appended only at their expected offset.
log_chunks = Table(
    "log_chunks",
    metadata,
    Column("attempt_id", ID, ForeignKey("run_attempts.id"), nullable=False),
    Column("start_offset", BigInteger, nullable=False),
    Column("run_id", ID, ForeignKey("runs.id"), nullable=False),
    Column("length", Integer, nullable=False),
    Column("checksum", String(64), nullable=False),  # SHA-256 hex of the chunk's bytes
    Column("data", LargeBinary, nullable=False),
    Column("created_at_ms", MS, nullable=False),
    PrimaryKeyConstraint("attempt_id", "start_offset"),
    CheckConstraint("start_offset >= 0 AND length >= 1 AND length <= 131072", name="chunk_bounds"),
    *ms_nonneg("created_at_ms"),
)
# Retention deletes a run's chunks with it.
Index("ix_log_chunks_run_id", log_chunks.c.run_id)

# Control replicas, for `status`: each one writes its row at start and every cycle.
control_replicas = Table(
    "control_replicas",
    metadata,
    Column("replica_id", ID, primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("bind", Text, nullable=False),
    Column("started_at_ms", MS, nullable=False),
    Column("heartbeat_at_ms", MS, nullable=False),
    Column("stopped_at_ms", MS),
    # The replica's transient database errors since it started (its StoreHealth's tally), written
    # with each heartbeat: a cluster `status` shows them (SEMANTICS.md §9 Transport).
    Column("db_errors", Integer, nullable=False),
    Column("last_db_error", Text),
    Column("last_db_error_at_ms", MS),
    # Schema 12: the cadence step that failed or stayed silent in the replica's last cycle, its
    # error, and since when (the first failed cycle of a run); NULL once a cycle gets through.
    Column("cycle_failed_step", Text),
    Column("cycle_error", Text),
    Column("cycle_failed_since_ms", MS),
    *ms_nonneg("started_at_ms", "heartbeat_at_ms", "stopped_at_ms", "last_db_error_at_ms", "cycle_failed_since_ms"),
)

# --- schema 11: the answer ledger (SEMANTICS.md §9 Owed reports, Pull once) --------------------

# The first answer to each worker request, by its request id: a repeat (a re-sent copy, a copy
# that reached another replica) gets it again instead of being judged anew. The result is the
# store operation's own (an Outcome's fields as JSON; a Pull's offer ids), never wire bytes.
# Written in the transaction of the request's effect; rows older than the retention are pruned.
REQUEST_KINDS = ("pull", "activate", "started", "start_failed", "decline", "completed", "attest", "leave")
worker_requests = Table(
    "worker_requests",
    metadata,
    Column("worker_id", String(128), nullable=False),
    Column("request_id", String(64), nullable=False),  # the wire's id (at most 64 characters)
    Column("kind", String(16), nullable=False),
    Column("result_json", Text, nullable=False),
    Column("created_at_ms", MS, nullable=False),
    PrimaryKeyConstraint("worker_id", "request_id"),
    CheckConstraint(one_of("kind", REQUEST_KINDS), name="kind"),
    *ms_nonneg("created_at_ms"),
)
# Pruning takes the oldest rows first.
Index("ix_worker_requests_created_at_ms", worker_requests.c.created_at_ms)

# Schema 16 (issue 20): each change to a task, and who made it (`task show` prints them). The
# payload names what changed (field names, never a command, an environment value or output).
task_events = Table(
    "task_events",
    metadata,
    Column("id", ID, primary_key=True),
    Column("task_id", ID, ForeignKey("tasks.id"), nullable=False),
    Column("type", String(16), nullable=False),
    Column("revision", Integer, nullable=False),
    Column("actor_name", String(128), nullable=False),
    Column("payload_json", Text, nullable=False),
    Column("created_at_ms", MS, nullable=False),
    CheckConstraint(one_of("type", TaskEventType), name="type"),
    CheckConstraint("length(payload_json) <= 16384", name="payload_size"),
    *ms_nonneg("created_at_ms"),
)
Index("ix_task_events_task_id_created_at_ms", task_events.c.task_id, task_events.c.created_at_ms)

# Schema 16: the HTTP API's bearer tokens. Only the secret's SHA-256 is kept; a revoked token
# keeps its row (its name may then be given to a new one).
api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", ID, primary_key=True),
    Column("name", String(64), nullable=False),
    Column("secret_hash", String(64), nullable=False),
    Column("read_only", Boolean, nullable=False),
    Column("created_at_ms", MS, nullable=False),
    Column("revoked_at_ms", MS),
    UniqueConstraint("secret_hash"),
    CheckConstraint("length(secret_hash) = 64", name="secret_hash_sha256"),
    *ms_nonneg("created_at_ms", "revoked_at_ms"),
)
Index("ix_api_tokens_live_name", api_tokens.c.name, unique=True,
      sqlite_where=text("revoked_at_ms IS NULL"), postgresql_where=text("revoked_at_ms IS NULL"))

# Schema 17 (issue 20): what `/metrics` counts, kept beside the runs so that retention, which
# deletes runs, never lowers a counter: per task and terminal state, the runs finished, and for
# those that started, the sum of their run times and a cumulative histogram of them (one column
# per bucket of domain/metrics.py DURATION_BUCKETS_S). Written in the terminal transition's own
# transaction (store/outcome_counts.py).
run_outcome_counts = Table(
    "run_outcome_counts",
    metadata,
    Column("task_id", ID, ForeignKey("tasks.id"), nullable=False),
    Column("state", String(16), nullable=False),
    Column("finished", BigInteger, nullable=False),
    Column("timed", BigInteger, nullable=False),  # of those, the runs that started (have a duration)
    Column("duration_ms_sum", BigInteger, nullable=False),
    *(Column(f"le_{b}s", BigInteger, nullable=False) for b in DURATION_BUCKETS_S),
    PrimaryKeyConstraint("task_id", "state"),
    # `lost` counts runs that became lost (a recovery outcome: each later ends failed or is retried)
    CheckConstraint(one_of("state", sorted(s.value for s in RunStatus if s.terminal or s is RunStatus.LOST)),
                    name="state"),
)

# Schema 17: notifications. A rule says where to tell about a task's runs (or every task's,
# task_id NULL) ending in some states; `on_states` is a comma-separated list of terminal states.
notification_rules = Table(
    "notification_rules",
    metadata,
    Column("id", ID, primary_key=True),
    Column("task_id", ID, ForeignKey("tasks.id")),
    Column("on_states", String(128), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("target", Text, nullable=False),
    Column("actor_name", String(128), nullable=False),
    Column("created_at_ms", MS, nullable=False),
    Column("removed_at_ms", MS),
    # Schema 18: a webhook's HMAC key (docs/web.md "Signed webhooks"), written and never read back
    # (a rule is shown as `signed` or not); NULL: unsigned.
    Column("secret", Text),
    CheckConstraint(one_of("kind", ("webhook", "apprise", "command")), name="kind"),
    CheckConstraint("length(target) <= 4096", name="target_size"),
    *ms_nonneg("created_at_ms", "removed_at_ms"),
)

# ...and the outbox: one row per rule asking about a run's transition (into a terminal state, or
# `lost`), written in that transition's transaction, delivered at least once by `qlactors web`
# with backoff; each try recorded in notification_deliveries. Its id is
# "<run id>:<rule id>:<run version after the transition>": a run lost twice is told of twice.
# Schema 18: the run's facts at that transition are copied into the row by the same INSERT
# (exit_code and attempt_number are its latest attempt's, the one that ended or became lost), so a
# notification delivered after retention deleted the run, or after the run was retried, still says
# what happened; and a claim names its deliverer (`claimed_by`, a notification_deliverers id): it
# holds while that deliverer is alive. `claimed_until_ms` is a claim made by a schema-17 web
# process, honoured until it runs out, never written since.
notification_outbox = Table(
    "notification_outbox",
    metadata,
    Column("id", String(96), primary_key=True),
    Column("run_id", ID, nullable=False),  # no foreign key: retention may delete the run first
    Column("rule_id", ID, ForeignKey("notification_rules.id"), nullable=False),
    Column("task_id", ID, nullable=False),
    Column("state", String(16), nullable=False),
    Column("status", String(16), nullable=False),
    Column("tries", Integer, nullable=False),
    Column("next_try_at_ms", MS, nullable=False),
    Column("claimed_until_ms", MS),
    Column("created_at_ms", MS, nullable=False),
    Column("delivered_at_ms", MS),
    Column("claimed_by", ID),
    Column("exit_code", Integer),
    Column("error_code", String(64)),
    Column("attempt_number", Integer),
    Column("run_created_at_ms", MS),
    Column("started_at_ms", MS),
    Column("finished_at_ms", MS),
    CheckConstraint(one_of("status", ("pending", "delivered", "gave_up")), name="status"),
    *ms_nonneg("next_try_at_ms", "claimed_until_ms", "created_at_ms", "delivered_at_ms"),
)
Index("ix_notification_outbox_status_next_try_at_ms", notification_outbox.c.status,
      notification_outbox.c.next_try_at_ms)
Index("ix_notification_outbox_run_id", notification_outbox.c.run_id)
Index("ix_notification_outbox_claimed_by", notification_outbox.c.claimed_by)

# Schema 18: the processes delivering the outbox (`qlactors web`), each refreshing `seen_at_ms`
# (database time) every few seconds while it runs and deleting its row, its claims released, when
# it stops; a claim whose deliverer has not been seen for 30 s is free (store/admin/notifications.py).
notification_deliverers = Table(
    "notification_deliverers",
    metadata,
    Column("id", ID, primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at_ms", MS, nullable=False),
    Column("seen_at_ms", MS, nullable=False),
    *ms_nonneg("started_at_ms", "seen_at_ms"),
)

notification_deliveries = Table(
    "notification_deliveries",
    metadata,
    Column("id", ID, primary_key=True),
    Column("outbox_id", String(96), nullable=False),
    Column("run_id", ID, nullable=False),
    Column("try_number", Integer, nullable=False),
    Column("ok", Boolean, nullable=False),
    Column("detail", String(512), nullable=False),
    Column("at_ms", MS, nullable=False),
    *ms_nonneg("at_ms"),
)
Index("ix_notification_deliveries_run_id", notification_deliveries.c.run_id)
