-- qlactors schema 4 (the hardening issue): per-task leftover handling, a bound on queued cron
-- fires and a random delay (task revisions); a run's not-before time (the random delay applied);
-- and `cancelled` as a lease release reason (a cancel of an offered, never-activated attempt).
-- SQLite cannot alter a CHECK constraint: run_dispatch_leases is rebuilt with its rows.

ALTER TABLE task_revisions ADD COLUMN keep_leftovers BOOLEAN NOT NULL DEFAULT 0;

ALTER TABLE task_revisions ADD COLUMN max_queued INTEGER NOT NULL DEFAULT 1 CONSTRAINT ck_task_revisions_max_queued_range CHECK (max_queued >= 1 AND max_queued <= 1024);

ALTER TABLE task_revisions ADD COLUMN random_delay_ms BIGINT NOT NULL DEFAULT 0 CONSTRAINT ck_task_revisions_random_delay_range CHECK (random_delay_ms >= 0 AND random_delay_ms <= 86400000);

ALTER TABLE runs ADD COLUMN not_before_ms BIGINT CONSTRAINT ck_runs_not_before_ms_nonneg CHECK (not_before_ms IS NULL OR not_before_ms >= 0);

CREATE TABLE run_dispatch_leases_new (
	attempt_id VARCHAR(36) NOT NULL, 
	lease_generation INTEGER NOT NULL, 
	run_id VARCHAR(36) NOT NULL, 
	status VARCHAR(16) NOT NULL, 
	version INTEGER NOT NULL, 
	worker_id VARCHAR(128) NOT NULL, 
	session_id VARCHAR(36) NOT NULL, 
	session_generation INTEGER NOT NULL, 
	token_hash VARCHAR(64) NOT NULL, 
	offer_id VARCHAR(36) NOT NULL, 
	expires_at_ms BIGINT, 
	release_reason VARCHAR(16), 
	created_at_ms BIGINT NOT NULL, 
	updated_at_ms BIGINT NOT NULL, 
	CONSTRAINT pk_run_dispatch_leases PRIMARY KEY (attempt_id, lease_generation), 
	CONSTRAINT uq_run_dispatch_leases_offer_id UNIQUE (offer_id), 
	CONSTRAINT ck_run_dispatch_leases_status CHECK (status IN ('leased', 'released', 'completed')), 
	CONSTRAINT ck_run_dispatch_leases_release_reason CHECK (release_reason IS NULL OR release_reason IN ('declined', 'shutdown', 'start_failed', 'lease_expired', 'cancelled')), 
	CONSTRAINT ck_run_dispatch_leases_released_has_reason CHECK ((status = 'released') = (release_reason IS NOT NULL)), 
	CONSTRAINT ck_run_dispatch_leases_counters_positive CHECK (lease_generation >= 1 AND version >= 1), 
	CONSTRAINT ck_run_dispatch_leases_expires_at_ms_nonneg CHECK (expires_at_ms IS NULL OR expires_at_ms >= 0), 
	CONSTRAINT ck_run_dispatch_leases_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0), 
	CONSTRAINT ck_run_dispatch_leases_updated_at_ms_nonneg CHECK (updated_at_ms IS NULL OR updated_at_ms >= 0), 
	CONSTRAINT fk_run_dispatch_leases_attempt_id_run_attempts FOREIGN KEY(attempt_id) REFERENCES run_attempts (id), 
	CONSTRAINT fk_run_dispatch_leases_run_id_runs FOREIGN KEY(run_id) REFERENCES runs (id), 
	CONSTRAINT fk_run_dispatch_leases_session_id_worker_sessions FOREIGN KEY(session_id) REFERENCES worker_sessions (session_id)
);

INSERT INTO run_dispatch_leases_new SELECT attempt_id, lease_generation, run_id, status, version, worker_id, session_id, session_generation, token_hash, offer_id, expires_at_ms, release_reason, created_at_ms, updated_at_ms FROM run_dispatch_leases;

DROP TABLE run_dispatch_leases;

ALTER TABLE run_dispatch_leases_new RENAME TO run_dispatch_leases;

CREATE UNIQUE INDEX ix_run_dispatch_leases_one_leased ON run_dispatch_leases (attempt_id) WHERE status = 'leased';

CREATE INDEX ix_run_dispatch_leases_status_expires_at_ms ON run_dispatch_leases (status, expires_at_ms);
