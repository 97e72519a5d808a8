-- qlactors schema 5 (issue 9 §1): an attempt whose offer cannot be built or encoded ends
-- `failed` (OFFER_UNENCODABLE) straight from `claimed`, so it never had a callback token.
-- SQLite cannot alter a CHECK constraint: run_attempts is rebuilt with its rows, the documented
-- way (the runner turns foreign keys off for the transaction and runs foreign_key_check before
-- the commit). run_events and run_dispatch_leases name run_attempts in their references; the
-- new table takes that name, so they point at it.

CREATE TABLE run_attempts_new (
	id VARCHAR(36) NOT NULL, 
	run_id VARCHAR(36) NOT NULL, 
	number INTEGER NOT NULL, 
	status VARCHAR(16) NOT NULL, 
	executor_type VARCHAR(32) NOT NULL, 
	worker_id VARCHAR(128), 
	session_id VARCHAR(36), 
	session_generation INTEGER, 
	boot_id VARCHAR(64), 
	pid INTEGER, 
	pgid INTEGER, 
	start_ticks BIGINT, 
	log_artifact_id VARCHAR(256), 
	callback_token_hash VARCHAR(64), 
	callback_sequence INTEGER NOT NULL, 
	deadline_at_ms BIGINT, 
	exit_code INTEGER, 
	signal INTEGER, 
	log_dropped_bytes BIGINT, 
	error_code VARCHAR(64), 
	error_summary VARCHAR(512), 
	offer_id VARCHAR(36), 
	lease_generation INTEGER, 
	lease_version INTEGER, 
	lease_expires_at_ms BIGINT, 
	created_at_ms BIGINT NOT NULL, 
	started_at_ms BIGINT, 
	finished_at_ms BIGINT, 
	updated_at_ms BIGINT NOT NULL, 
	CONSTRAINT pk_run_attempts PRIMARY KEY (id), 
	CONSTRAINT uq_run_attempts_run_id_number UNIQUE (run_id, number), 
	CONSTRAINT ck_run_attempts_number_positive CHECK (number >= 1), 
	CONSTRAINT ck_run_attempts_status CHECK (status IN ('claimed', 'starting', 'running', 'succeeded', 'failed', 'cancelled', 'timed_out', 'lost')), 
	CONSTRAINT ck_run_attempts_callback_sequence_nonneg CHECK (callback_sequence >= 0), 
	CONSTRAINT ck_run_attempts_exit_code_range CHECK (exit_code IS NULL OR (exit_code >= 0 AND exit_code <= 255)), 
	CONSTRAINT ck_run_attempts_signal_range CHECK (signal IS NULL OR (signal >= 1 AND signal <= 64)), 
	CONSTRAINT ck_run_attempts_log_dropped_nonneg CHECK (log_dropped_bytes IS NULL OR log_dropped_bytes >= 0), 
	CONSTRAINT ck_run_attempts_pid_positive CHECK (pid IS NULL OR pid > 0), 
	CONSTRAINT ck_run_attempts_token_after_claim CHECK (status = 'claimed' OR callback_token_hash IS NOT NULL OR status IN ('cancelled', 'lost') OR (status = 'failed' AND error_code = 'OFFER_UNENCODABLE')), 
	CONSTRAINT ck_run_attempts_deadline_at_ms_nonneg CHECK (deadline_at_ms IS NULL OR deadline_at_ms >= 0), 
	CONSTRAINT ck_run_attempts_lease_expires_at_ms_nonneg CHECK (lease_expires_at_ms IS NULL OR lease_expires_at_ms >= 0), 
	CONSTRAINT ck_run_attempts_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0), 
	CONSTRAINT ck_run_attempts_started_at_ms_nonneg CHECK (started_at_ms IS NULL OR started_at_ms >= 0), 
	CONSTRAINT ck_run_attempts_finished_at_ms_nonneg CHECK (finished_at_ms IS NULL OR finished_at_ms >= 0), 
	CONSTRAINT ck_run_attempts_updated_at_ms_nonneg CHECK (updated_at_ms IS NULL OR updated_at_ms >= 0), 
	CONSTRAINT fk_run_attempts_run_id_runs FOREIGN KEY(run_id) REFERENCES runs (id)
);

INSERT INTO run_attempts_new SELECT * FROM run_attempts;

DROP TABLE run_attempts;

ALTER TABLE run_attempts_new RENAME TO run_attempts;

CREATE UNIQUE INDEX ix_run_attempts_one_active ON run_attempts (run_id) WHERE status IN ('claimed', 'running', 'starting');

CREATE INDEX ix_run_attempts_status_deadline_at_ms ON run_attempts (status, deadline_at_ms);
