-- qlactors schema 6 (issue 10, the cluster profile): the worker allow-list, session columns for
-- resume, numbered heartbeats, labels, clock skew and the end of a session; log chunks and the
-- final log offset (SEMANTICS.md §13); control replicas for `status`; and the executor-local
-- lease, pull and session facts of the journal (§9 Journal).

CREATE TABLE worker_keys (
	worker_id VARCHAR(128) NOT NULL, 
	public_key VARCHAR(40) NOT NULL, 
	created_at_ms BIGINT NOT NULL, 
	CONSTRAINT pk_worker_keys PRIMARY KEY (worker_id), 
	CONSTRAINT uq_worker_keys_public_key UNIQUE (public_key), 
	CONSTRAINT ck_worker_keys_public_key_z85 CHECK (length(public_key) = 40), 
	CONSTRAINT ck_worker_keys_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0)
);

CREATE TABLE log_chunks (
	attempt_id VARCHAR(36) NOT NULL, 
	start_offset BIGINT NOT NULL, 
	run_id VARCHAR(36) NOT NULL, 
	length INTEGER NOT NULL, 
	checksum VARCHAR(64) NOT NULL, 
	data BYTEA NOT NULL, 
	created_at_ms BIGINT NOT NULL, 
	CONSTRAINT pk_log_chunks PRIMARY KEY (attempt_id, start_offset), 
	CONSTRAINT ck_log_chunks_chunk_bounds CHECK (start_offset >= 0 AND length >= 1 AND length <= 131072), 
	CONSTRAINT ck_log_chunks_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0), 
	CONSTRAINT fk_log_chunks_attempt_id_run_attempts FOREIGN KEY(attempt_id) REFERENCES run_attempts (id), 
	CONSTRAINT fk_log_chunks_run_id_runs FOREIGN KEY(run_id) REFERENCES runs (id)
);

CREATE INDEX ix_log_chunks_run_id ON log_chunks (run_id);

CREATE TABLE control_replicas (
	replica_id VARCHAR(36) NOT NULL, 
	host VARCHAR(255) NOT NULL, 
	pid INTEGER NOT NULL, 
	bind TEXT NOT NULL, 
	started_at_ms BIGINT NOT NULL, 
	heartbeat_at_ms BIGINT NOT NULL, 
	stopped_at_ms BIGINT, 
	CONSTRAINT pk_control_replicas PRIMARY KEY (replica_id), 
	CONSTRAINT ck_control_replicas_started_at_ms_nonneg CHECK (started_at_ms IS NULL OR started_at_ms >= 0), 
	CONSTRAINT ck_control_replicas_heartbeat_at_ms_nonneg CHECK (heartbeat_at_ms IS NULL OR heartbeat_at_ms >= 0), 
	CONSTRAINT ck_control_replicas_stopped_at_ms_nonneg CHECK (stopped_at_ms IS NULL OR stopped_at_ms >= 0)
);

CREATE TABLE executor_pulls (
	offer_id VARCHAR(36) NOT NULL, 
	pull_id VARCHAR(36) NOT NULL, 
	lease_token VARCHAR(64) NOT NULL, 
	created_at_ms BIGINT NOT NULL, 
	CONSTRAINT pk_executor_pulls PRIMARY KEY (offer_id), 
	CONSTRAINT ck_executor_pulls_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0)
);

CREATE INDEX ix_executor_pulls_pull_id ON executor_pulls (pull_id);

CREATE TABLE executor_session (
	worker_id VARCHAR(128) NOT NULL, 
	session_id VARCHAR(36) NOT NULL, 
	generation INTEGER NOT NULL, 
	resume_secret VARCHAR(64) NOT NULL, 
	boot_id VARCHAR(64) NOT NULL, 
	updated_at_ms BIGINT NOT NULL, 
	CONSTRAINT pk_executor_session PRIMARY KEY (worker_id), 
	CONSTRAINT ck_executor_session_generation_positive CHECK (generation >= 1), 
	CONSTRAINT ck_executor_session_updated_at_ms_nonneg CHECK (updated_at_ms IS NULL OR updated_at_ms >= 0)
);

ALTER TABLE worker_sessions ADD COLUMN boot_id VARCHAR(64);

ALTER TABLE worker_sessions ADD COLUMN resume_secret_hash VARCHAR(64);

ALTER TABLE worker_sessions ADD COLUMN heartbeat_seq BIGINT NOT NULL DEFAULT 0 CONSTRAINT ck_worker_sessions_heartbeat_seq_nonneg CHECK (heartbeat_seq >= 0);

ALTER TABLE worker_sessions ADD COLUMN heartbeat_answer TEXT;

ALTER TABLE worker_sessions ADD COLUMN labels_json TEXT NOT NULL DEFAULT '[]';

ALTER TABLE worker_sessions ADD COLUMN clock_skew_ms BIGINT;

ALTER TABLE worker_sessions ADD COLUMN ended_at_ms BIGINT CONSTRAINT ck_worker_sessions_ended_at_ms_nonneg CHECK (ended_at_ms IS NULL OR ended_at_ms >= 0);

ALTER TABLE run_attempts ADD COLUMN log_final_offset BIGINT CONSTRAINT ck_run_attempts_log_final_offset_nonneg CHECK (log_final_offset IS NULL OR log_final_offset >= 0);

ALTER TABLE run_attempts ADD COLUMN evidence VARCHAR(32) CONSTRAINT ck_run_attempts_evidence CHECK (evidence IS NULL OR evidence IN ('stopped', 'ended', 'ended_with_receipt', 'never_launched', 'launch_unknown', 'rebooted', 'retired'));

ALTER TABLE run_attempts ADD COLUMN evidence_at_ms BIGINT CONSTRAINT ck_run_attempts_evidence_at_ms_nonneg CHECK (evidence_at_ms IS NULL OR evidence_at_ms >= 0);

ALTER TABLE executor_journal ADD COLUMN offer_id VARCHAR(36);

ALTER TABLE executor_journal ADD COLUMN lease_generation INTEGER;

ALTER TABLE executor_journal ADD COLUMN lease_token VARCHAR(64);

ALTER TABLE executor_journal ADD COLUMN session_id VARCHAR(36);

ALTER TABLE executor_journal ADD COLUMN session_generation INTEGER;

ALTER TABLE executor_journal ADD COLUMN shipped_offset BIGINT NOT NULL DEFAULT 0 CONSTRAINT ck_executor_journal_offsets CHECK (shipped_offset >= 0);

ALTER TABLE executor_journal ADD COLUMN final_offset BIGINT CONSTRAINT ck_executor_journal_final_offset CHECK (final_offset IS NULL OR final_offset >= 0);

ALTER TABLE executor_journal ADD COLUMN activated_at_ms BIGINT CONSTRAINT ck_executor_journal_activated_at_ms_nonneg CHECK (activated_at_ms IS NULL OR activated_at_ms >= 0);

ALTER TABLE executor_journal ADD COLUMN local_deadline_ms BIGINT CONSTRAINT ck_executor_journal_local_deadline_ms_nonneg CHECK (local_deadline_ms IS NULL OR local_deadline_ms >= 0);

ALTER TABLE executor_journal ADD COLUMN timeout_intent_at_ms BIGINT CONSTRAINT ck_executor_journal_timeout_intent_at_ms_nonneg CHECK (timeout_intent_at_ms IS NULL OR timeout_intent_at_ms >= 0);
