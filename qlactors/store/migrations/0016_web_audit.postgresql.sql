-- qlactors schema 16 (issue 20: the HTTP API): who made each change, and the API's tokens.
-- run_events.actor_name: the person behind an event (an API token's name, or the CLI's user),
-- NULL for what the runtime did on its own; task_events: each change to a task (added, updated,
-- enabled, disabled, removed) with its revision and who made it; api_tokens: the bearer tokens
-- `qlactors token new` makes, by the SHA-256 of their secret (the secret itself is never kept).

ALTER TABLE run_events ADD COLUMN actor_name VARCHAR(128);

CREATE TABLE task_events (
	id VARCHAR(36) NOT NULL, 
	task_id VARCHAR(36) NOT NULL, 
	type VARCHAR(16) NOT NULL, 
	revision INTEGER NOT NULL, 
	actor_name VARCHAR(128) NOT NULL, 
	payload_json TEXT NOT NULL, 
	created_at_ms BIGINT NOT NULL, 
	CONSTRAINT pk_task_events PRIMARY KEY (id), 
	CONSTRAINT ck_task_events_type CHECK (type IN ('added', 'updated', 'enabled', 'disabled', 'removed')), 
	CONSTRAINT ck_task_events_payload_size CHECK (length(payload_json) <= 16384), 
	CONSTRAINT ck_task_events_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0), 
	CONSTRAINT fk_task_events_task_id_tasks FOREIGN KEY(task_id) REFERENCES tasks (id)
);

CREATE INDEX ix_task_events_task_id_created_at_ms ON task_events (task_id, created_at_ms);

CREATE TABLE api_tokens (
	id VARCHAR(36) NOT NULL, 
	name VARCHAR(64) NOT NULL, 
	secret_hash VARCHAR(64) NOT NULL, 
	read_only BOOLEAN NOT NULL, 
	created_at_ms BIGINT NOT NULL, 
	revoked_at_ms BIGINT, 
	CONSTRAINT pk_api_tokens PRIMARY KEY (id), 
	CONSTRAINT uq_api_tokens_secret_hash UNIQUE (secret_hash), 
	CONSTRAINT ck_api_tokens_secret_hash_sha256 CHECK (length(secret_hash) = 64), 
	CONSTRAINT ck_api_tokens_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0), 
	CONSTRAINT ck_api_tokens_revoked_at_ms_nonneg CHECK (revoked_at_ms IS NULL OR revoked_at_ms >= 0)
);

CREATE UNIQUE INDEX ix_api_tokens_live_name ON api_tokens (name) WHERE revoked_at_ms IS NULL;
