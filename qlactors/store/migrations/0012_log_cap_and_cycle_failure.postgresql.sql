-- qlactors schema 12 (issue 17 point 9):
-- the log cap the offer carried (SEMANTICS.md §13): the control side refuses a log chunk that
-- passes it (NULL: an edge attempt, or one offered before this schema, bounded by its final
-- offset only);
-- and each control replica's failing cadence step: which step, its error, and since when (the
-- first cycle of a run of failed ones), written with its heartbeat and cleared by the next
-- cycle that gets through, for a cluster `status`.

ALTER TABLE run_attempts ADD COLUMN log_cap_bytes BIGINT;

ALTER TABLE run_attempts ADD CONSTRAINT ck_run_attempts_log_cap_bytes_nonneg CHECK (log_cap_bytes IS NULL OR log_cap_bytes >= 0);

ALTER TABLE control_replicas ADD COLUMN cycle_failed_step TEXT;

ALTER TABLE control_replicas ADD COLUMN cycle_error TEXT;

ALTER TABLE control_replicas ADD COLUMN cycle_failed_since_ms BIGINT;

ALTER TABLE control_replicas ADD CONSTRAINT ck_control_replicas_cycle_failed_since_ms_nonneg CHECK (cycle_failed_since_ms IS NULL OR cycle_failed_since_ms >= 0);
