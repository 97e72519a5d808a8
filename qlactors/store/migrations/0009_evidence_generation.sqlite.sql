-- qlactors schema 9 (issue 17, SEMANTICS.md §10): evidence is bound to a lease generation. The
-- generation the recorded fact speaks of (recovery trusts only the attempt's current one; a new
-- lease or an activation clears the fact), who said it (`qlactors confirm-stopped RUN`: the
-- operator's name), and the operator's fact `confirmed_stopped`. Facts recorded before this
-- schema carry no generation, so recovery no longer trusts them: such an attempt waits (shown by
-- `status`) for its worker's next attestation or an operator, never ends on a stale fact.
-- SQLite cannot alter a CHECK constraint: run_attempts is rebuilt with its rows, as in schema 5
-- (the runner turns foreign keys off for the transaction and runs foreign_key_check before the
-- commit; the tables that reference run_attempts point at the new table by its name).

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
	log_final_offset BIGINT, 
	evidence VARCHAR(32), 
	evidence_at_ms BIGINT, 
	evidence_lease_generation INTEGER, 
	evidence_by VARCHAR(128), 
	CONSTRAINT pk_run_attempts PRIMARY KEY (id), 
	CONSTRAINT uq_run_attempts_run_id_number UNIQUE (run_id, number), 
	CONSTRAINT ck_run_attempts_number_positive CHECK (number >= 1), 
	CONSTRAINT ck_run_attempts_status CHECK (status IN ('claimed', 'starting', 'running', 'succeeded', 'failed', 'cancelled', 'timed_out', 'lost')), 
	CONSTRAINT ck_run_attempts_callback_sequence_nonneg CHECK (callback_sequence >= 0), 
	CONSTRAINT ck_run_attempts_exit_code_range CHECK (exit_code IS NULL OR (exit_code >= 0 AND exit_code <= 255)), 
	CONSTRAINT ck_run_attempts_signal_range CHECK (signal IS NULL OR (signal >= 1 AND signal <= 64)), 
	CONSTRAINT ck_run_attempts_log_dropped_nonneg CHECK (log_dropped_bytes IS NULL OR log_dropped_bytes >= 0), 
	CONSTRAINT ck_run_attempts_log_final_offset_nonneg CHECK (log_final_offset IS NULL OR log_final_offset >= 0), 
	CONSTRAINT ck_run_attempts_evidence CHECK (evidence IS NULL OR evidence IN ('stopped', 'ended', 'ended_with_receipt', 'never_launched', 'launch_unknown', 'rebooted', 'retired', 'confirmed_stopped')), 
	CONSTRAINT ck_run_attempts_evidence_lease_generation_positive CHECK (evidence_lease_generation IS NULL OR evidence_lease_generation >= 1), 
	CONSTRAINT ck_run_attempts_pid_positive CHECK (pid IS NULL OR pid > 0), 
	CONSTRAINT ck_run_attempts_token_after_claim CHECK (status = 'claimed' OR callback_token_hash IS NOT NULL OR status IN ('cancelled', 'lost') OR (status = 'failed' AND error_code = 'OFFER_UNENCODABLE')), 
	CONSTRAINT ck_run_attempts_deadline_at_ms_nonneg CHECK (deadline_at_ms IS NULL OR deadline_at_ms >= 0), 
	CONSTRAINT ck_run_attempts_lease_expires_at_ms_nonneg CHECK (lease_expires_at_ms IS NULL OR lease_expires_at_ms >= 0), 
	CONSTRAINT ck_run_attempts_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0), 
	CONSTRAINT ck_run_attempts_started_at_ms_nonneg CHECK (started_at_ms IS NULL OR started_at_ms >= 0), 
	CONSTRAINT ck_run_attempts_finished_at_ms_nonneg CHECK (finished_at_ms IS NULL OR finished_at_ms >= 0), 
	CONSTRAINT ck_run_attempts_updated_at_ms_nonneg CHECK (updated_at_ms IS NULL OR updated_at_ms >= 0), 
	CONSTRAINT ck_run_attempts_evidence_at_ms_nonneg CHECK (evidence_at_ms IS NULL OR evidence_at_ms >= 0), 
	CONSTRAINT fk_run_attempts_run_id_runs FOREIGN KEY(run_id) REFERENCES runs (id)
);

INSERT INTO run_attempts_new (id, run_id, number, status, executor_type, worker_id, session_id, session_generation, boot_id, pid, pgid, start_ticks, log_artifact_id, callback_token_hash, callback_sequence, deadline_at_ms, exit_code, signal, log_dropped_bytes, error_code, error_summary, offer_id, lease_generation, lease_version, lease_expires_at_ms, created_at_ms, started_at_ms, finished_at_ms, updated_at_ms, log_final_offset, evidence, evidence_at_ms)
SELECT id, run_id, number, status, executor_type, worker_id, session_id, session_generation, boot_id, pid, pgid, start_ticks, log_artifact_id, callback_token_hash, callback_sequence, deadline_at_ms, exit_code, signal, log_dropped_bytes, error_code, error_summary, offer_id, lease_generation, lease_version, lease_expires_at_ms, created_at_ms, started_at_ms, finished_at_ms, updated_at_ms, log_final_offset, evidence, evidence_at_ms FROM run_attempts;

DROP TABLE run_attempts;

ALTER TABLE run_attempts_new RENAME TO run_attempts;

CREATE UNIQUE INDEX ix_run_attempts_one_active ON run_attempts (run_id) WHERE status IN ('claimed', 'running', 'starting');

CREATE INDEX ix_run_attempts_status_deadline_at_ms ON run_attempts (status, deadline_at_ms);
