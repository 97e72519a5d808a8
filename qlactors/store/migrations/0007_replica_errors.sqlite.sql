-- qlactors schema 7 (cluster, part 1): each control replica's transient database errors since it
-- started (a count, the last one and when), written with its heartbeat, for a cluster `status`.
-- An edge file has the table (one schema for both dialects) and never a row in it.

ALTER TABLE control_replicas ADD COLUMN db_errors INTEGER NOT NULL DEFAULT 0;

ALTER TABLE control_replicas ADD COLUMN last_db_error TEXT;

ALTER TABLE control_replicas ADD COLUMN last_db_error_at_ms BIGINT CONSTRAINT ck_control_replicas_last_db_error_at_ms_nonneg CHECK (last_db_error_at_ms IS NULL OR last_db_error_at_ms >= 0);
