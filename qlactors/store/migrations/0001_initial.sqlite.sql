-- qlactors schema 1: the initial tables (sqlite). Frozen: change the schema with a new numbered file.

CREATE TABLE executor_journal (
	attempt_id VARCHAR(36) NOT NULL, 
	run_id VARCHAR(36) NOT NULL, 
	state VARCHAR(16) NOT NULL, 
	log_path TEXT NOT NULL, 
	receipt_path TEXT NOT NULL, 
	callback_token_hash VARCHAR(64) NOT NULL, 
	boot_id VARCHAR(64), 
	pid INTEGER, 
	pgid INTEGER, 
	start_ticks BIGINT, 
	purge_after_ms BIGINT, 
	created_at_ms BIGINT NOT NULL, 
	updated_at_ms BIGINT NOT NULL, 
	CONSTRAINT pk_executor_journal PRIMARY KEY (attempt_id), 
	CONSTRAINT ck_executor_journal_state CHECK (state IN ('accepted', 'launching', 'started', 'completed', 'quarantined')), 
	CONSTRAINT ck_executor_journal_purge_after_ms_nonneg CHECK (purge_after_ms IS NULL OR purge_after_ms >= 0), 
	CONSTRAINT ck_executor_journal_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0), 
	CONSTRAINT ck_executor_journal_updated_at_ms_nonneg CHECK (updated_at_ms IS NULL OR updated_at_ms >= 0)
);

CREATE INDEX ix_executor_journal_state_purge_after_ms ON executor_journal (state, purge_after_ms);

CREATE TABLE qlactors_schema (
	id INTEGER NOT NULL, 
	version INTEGER NOT NULL, 
	applied_at_ms BIGINT NOT NULL, 
	CONSTRAINT pk_qlactors_schema PRIMARY KEY (id), 
	CONSTRAINT ck_qlactors_schema_singleton CHECK (id = 1)
);

CREATE TABLE tasks (
	id VARCHAR(36) NOT NULL, 
	name VARCHAR(128) NOT NULL, 
	current_revision INTEGER NOT NULL, 
	version INTEGER NOT NULL, 
	enabled BOOLEAN NOT NULL, 
	created_at_ms BIGINT NOT NULL, 
	updated_at_ms BIGINT NOT NULL, 
	deleted_at_ms BIGINT, 
	CONSTRAINT pk_tasks PRIMARY KEY (id), 
	CONSTRAINT ck_tasks_counters_positive CHECK (current_revision >= 1 AND version >= 1), 
	CONSTRAINT ck_tasks_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0), 
	CONSTRAINT ck_tasks_updated_at_ms_nonneg CHECK (updated_at_ms IS NULL OR updated_at_ms >= 0), 
	CONSTRAINT ck_tasks_deleted_at_ms_nonneg CHECK (deleted_at_ms IS NULL OR deleted_at_ms >= 0)
);

CREATE UNIQUE INDEX ix_tasks_live_name ON tasks (name) WHERE deleted_at_ms IS NULL;

CREATE TABLE worker_sessions (
	session_id VARCHAR(36) NOT NULL, 
	worker_id VARCHAR(128) NOT NULL, 
	generation INTEGER NOT NULL, 
	status VARCHAR(16) NOT NULL, 
	version INTEGER NOT NULL, 
	capacity INTEGER NOT NULL, 
	free_slots INTEGER NOT NULL, 
	heartbeat_at_ms BIGINT, 
	lease_expires_at_ms BIGINT, 
	created_at_ms BIGINT NOT NULL, 
	updated_at_ms BIGINT NOT NULL, 
	CONSTRAINT pk_worker_sessions PRIMARY KEY (session_id), 
	CONSTRAINT uq_worker_sessions_worker_id_generation UNIQUE (worker_id, generation), 
	CONSTRAINT ck_worker_sessions_status CHECK (status IN ('online', 'draining', 'offline')), 
	CONSTRAINT ck_worker_sessions_counters CHECK (generation >= 1 AND version >= 0), 
	CONSTRAINT ck_worker_sessions_slots CHECK (capacity >= 0 AND free_slots >= 0 AND free_slots <= capacity), 
	CONSTRAINT ck_worker_sessions_heartbeat_at_ms_nonneg CHECK (heartbeat_at_ms IS NULL OR heartbeat_at_ms >= 0), 
	CONSTRAINT ck_worker_sessions_lease_expires_at_ms_nonneg CHECK (lease_expires_at_ms IS NULL OR lease_expires_at_ms >= 0), 
	CONSTRAINT ck_worker_sessions_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0), 
	CONSTRAINT ck_worker_sessions_updated_at_ms_nonneg CHECK (updated_at_ms IS NULL OR updated_at_ms >= 0)
);

CREATE TABLE task_revisions (
	task_id VARCHAR(36) NOT NULL, 
	revision INTEGER NOT NULL, 
	command_json TEXT NOT NULL, 
	cwd TEXT, 
	env_json TEXT NOT NULL, 
	timeout_ms BIGINT, 
	stop_grace_ms INTEGER NOT NULL, 
	max_concurrent INTEGER NOT NULL, 
	retry_on_lost BOOLEAN NOT NULL, 
	max_attempts INTEGER NOT NULL, 
	safety VARCHAR(16) NOT NULL, 
	backoff_base_ms BIGINT NOT NULL, 
	backoff_max_ms BIGINT NOT NULL, 
	labels_json TEXT NOT NULL, 
	created_at_ms BIGINT NOT NULL, 
	CONSTRAINT pk_task_revisions PRIMARY KEY (task_id, revision), 
	CONSTRAINT ck_task_revisions_revision_positive CHECK (revision >= 1), 
	CONSTRAINT ck_task_revisions_timeout_range CHECK (timeout_ms IS NULL OR (timeout_ms >= 1 AND timeout_ms <= 31536000000)), 
	CONSTRAINT ck_task_revisions_stop_grace_range CHECK (stop_grace_ms >= 0 AND stop_grace_ms <= 30000), 
	CONSTRAINT ck_task_revisions_max_concurrent_range CHECK (max_concurrent >= 1 AND max_concurrent <= 1024), 
	CONSTRAINT ck_task_revisions_max_attempts_range CHECK (max_attempts >= 1 AND max_attempts <= 16), 
	CONSTRAINT ck_task_revisions_safety CHECK (safety IN ('unknown', 'idempotent', 'deduplicated')), 
	CONSTRAINT ck_task_revisions_backoff_range CHECK (backoff_base_ms >= 0 AND backoff_base_ms <= backoff_max_ms AND backoff_max_ms <= 86400000), 
	CONSTRAINT ck_task_revisions_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0), 
	CONSTRAINT fk_task_revisions_task_id_tasks FOREIGN KEY(task_id) REFERENCES tasks (id)
);

CREATE TABLE triggers (
	id VARCHAR(36) NOT NULL, 
	task_id VARCHAR(36) NOT NULL, 
	revision INTEGER NOT NULL, 
	cron VARCHAR(768) NOT NULL, 
	tz VARCHAR(64) NOT NULL, 
	misfire VARCHAR(16) NOT NULL, 
	grace_ms BIGINT NOT NULL, 
	overlap VARCHAR(16) NOT NULL, 
	created_at_ms BIGINT NOT NULL, 
	updated_at_ms BIGINT NOT NULL, 
	deleted_at_ms BIGINT, 
	CONSTRAINT pk_triggers PRIMARY KEY (id), 
	CONSTRAINT ck_triggers_revision_positive CHECK (revision >= 1), 
	CONSTRAINT ck_triggers_misfire CHECK (misfire IN ('fire_once', 'skip')), 
	CONSTRAINT ck_triggers_overlap CHECK (overlap IN ('queue', 'skip', 'replace')), 
	CONSTRAINT ck_triggers_grace_nonneg CHECK (grace_ms >= 0), 
	CONSTRAINT ck_triggers_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0), 
	CONSTRAINT ck_triggers_updated_at_ms_nonneg CHECK (updated_at_ms IS NULL OR updated_at_ms >= 0), 
	CONSTRAINT ck_triggers_deleted_at_ms_nonneg CHECK (deleted_at_ms IS NULL OR deleted_at_ms >= 0), 
	CONSTRAINT fk_triggers_task_id_tasks FOREIGN KEY(task_id) REFERENCES tasks (id)
);

CREATE INDEX ix_triggers_task_id ON triggers (task_id);

CREATE TABLE runs (
	id VARCHAR(36) NOT NULL, 
	task_id VARCHAR(36) NOT NULL, 
	task_revision INTEGER NOT NULL, 
	trigger_type VARCHAR(16) NOT NULL, 
	trigger_id VARCHAR(36), 
	status VARCHAR(16) NOT NULL, 
	version INTEGER NOT NULL, 
	event_sequence INTEGER NOT NULL, 
	scheduled_for_ms BIGINT, 
	idempotency_key VARCHAR(256), 
	cancel_requested_at_ms BIGINT, 
	cancel_reason VARCHAR(16), 
	error_code VARCHAR(64), 
	error_summary VARCHAR(512), 
	retry_of_run_id VARCHAR(36), 
	created_at_ms BIGINT NOT NULL, 
	queued_at_ms BIGINT, 
	started_at_ms BIGINT, 
	finished_at_ms BIGINT, 
	updated_at_ms BIGINT NOT NULL, 
	CONSTRAINT pk_runs PRIMARY KEY (id), 
	CONSTRAINT uq_runs_idempotency_key UNIQUE (idempotency_key), 
	CONSTRAINT ck_runs_status CHECK (status IN ('queued', 'dispatching', 'running', 'retry_wait', 'lost', 'succeeded', 'failed', 'cancelled', 'timed_out')), 
	CONSTRAINT ck_runs_trigger_type CHECK (trigger_type IN ('manual', 'cron', 'retry')), 
	CONSTRAINT ck_runs_cancel_reason CHECK (cancel_reason IS NULL OR cancel_reason IN ('user', 'policy', 'timeout', 'shutdown')), 
	CONSTRAINT ck_runs_cancel_intent CHECK ((cancel_reason IS NULL) = (cancel_requested_at_ms IS NULL)), 
	CONSTRAINT ck_runs_counters_positive CHECK (version >= 1 AND event_sequence >= 1), 
	CONSTRAINT ck_runs_finished_iff_terminal CHECK ((finished_at_ms IS NULL) = (status NOT IN ('succeeded', 'failed', 'cancelled', 'timed_out'))), 
	CONSTRAINT ck_runs_cron_has_trigger CHECK (trigger_type <> 'cron' OR trigger_id IS NOT NULL), 
	CONSTRAINT ck_runs_scheduled_for_ms_nonneg CHECK (scheduled_for_ms IS NULL OR scheduled_for_ms >= 0), 
	CONSTRAINT ck_runs_cancel_requested_at_ms_nonneg CHECK (cancel_requested_at_ms IS NULL OR cancel_requested_at_ms >= 0), 
	CONSTRAINT ck_runs_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0), 
	CONSTRAINT ck_runs_queued_at_ms_nonneg CHECK (queued_at_ms IS NULL OR queued_at_ms >= 0), 
	CONSTRAINT ck_runs_started_at_ms_nonneg CHECK (started_at_ms IS NULL OR started_at_ms >= 0), 
	CONSTRAINT ck_runs_finished_at_ms_nonneg CHECK (finished_at_ms IS NULL OR finished_at_ms >= 0), 
	CONSTRAINT ck_runs_updated_at_ms_nonneg CHECK (updated_at_ms IS NULL OR updated_at_ms >= 0), 
	CONSTRAINT fk_runs_task_id_tasks FOREIGN KEY(task_id) REFERENCES tasks (id), 
	CONSTRAINT fk_runs_trigger_id_triggers FOREIGN KEY(trigger_id) REFERENCES triggers (id), 
	CONSTRAINT fk_runs_retry_of_run_id_runs FOREIGN KEY(retry_of_run_id) REFERENCES runs (id)
);

CREATE INDEX ix_runs_created_at_ms_id ON runs (created_at_ms, id);

CREATE INDEX ix_runs_status_created_at_ms_id ON runs (status, created_at_ms, id);

CREATE INDEX ix_runs_task_id_created_at_ms_id ON runs (task_id, created_at_ms, id);

CREATE TABLE trigger_schedules (
	trigger_id VARCHAR(36) NOT NULL, 
	trigger_revision INTEGER NOT NULL, 
	next_fire_at_ms BIGINT, 
	last_scheduled_at_ms BIGINT, 
	state_version INTEGER NOT NULL, 
	claim_owner VARCHAR(64), 
	claim_token_hash VARCHAR(64), 
	claim_version INTEGER NOT NULL, 
	claim_expires_at_ms BIGINT, 
	updated_at_ms BIGINT NOT NULL, 
	CONSTRAINT pk_trigger_schedules PRIMARY KEY (trigger_id), 
	CONSTRAINT ck_trigger_schedules_versions_nonneg CHECK (state_version >= 0 AND claim_version >= 0), 
	CONSTRAINT ck_trigger_schedules_next_fire_at_ms_nonneg CHECK (next_fire_at_ms IS NULL OR next_fire_at_ms >= 0), 
	CONSTRAINT ck_trigger_schedules_last_scheduled_at_ms_nonneg CHECK (last_scheduled_at_ms IS NULL OR last_scheduled_at_ms >= 0), 
	CONSTRAINT ck_trigger_schedules_claim_expires_at_ms_nonneg CHECK (claim_expires_at_ms IS NULL OR claim_expires_at_ms >= 0), 
	CONSTRAINT ck_trigger_schedules_updated_at_ms_nonneg CHECK (updated_at_ms IS NULL OR updated_at_ms >= 0), 
	CONSTRAINT fk_trigger_schedules_trigger_id_triggers FOREIGN KEY(trigger_id) REFERENCES triggers (id)
);

CREATE INDEX ix_trigger_schedules_due ON trigger_schedules (next_fire_at_ms, trigger_id);

CREATE TABLE run_attempts (
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
	CONSTRAINT ck_run_attempts_token_after_claim CHECK (status = 'claimed' OR callback_token_hash IS NOT NULL OR status IN ('cancelled', 'lost')), 
	CONSTRAINT ck_run_attempts_deadline_at_ms_nonneg CHECK (deadline_at_ms IS NULL OR deadline_at_ms >= 0), 
	CONSTRAINT ck_run_attempts_lease_expires_at_ms_nonneg CHECK (lease_expires_at_ms IS NULL OR lease_expires_at_ms >= 0), 
	CONSTRAINT ck_run_attempts_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0), 
	CONSTRAINT ck_run_attempts_started_at_ms_nonneg CHECK (started_at_ms IS NULL OR started_at_ms >= 0), 
	CONSTRAINT ck_run_attempts_finished_at_ms_nonneg CHECK (finished_at_ms IS NULL OR finished_at_ms >= 0), 
	CONSTRAINT ck_run_attempts_updated_at_ms_nonneg CHECK (updated_at_ms IS NULL OR updated_at_ms >= 0), 
	CONSTRAINT fk_run_attempts_run_id_runs FOREIGN KEY(run_id) REFERENCES runs (id)
);

CREATE UNIQUE INDEX ix_run_attempts_one_active ON run_attempts (run_id) WHERE status IN ('claimed', 'running', 'starting');

CREATE INDEX ix_run_attempts_status_deadline_at_ms ON run_attempts (status, deadline_at_ms);

CREATE TABLE run_retry_policies (
	run_id VARCHAR(36) NOT NULL, 
	max_attempts INTEGER NOT NULL, 
	retry_on_lost BOOLEAN NOT NULL, 
	safety VARCHAR(16) NOT NULL, 
	backoff_base_ms BIGINT NOT NULL, 
	backoff_max_ms BIGINT NOT NULL, 
	next_attempt_at_ms BIGINT, 
	version INTEGER NOT NULL, 
	created_at_ms BIGINT NOT NULL, 
	updated_at_ms BIGINT NOT NULL, 
	CONSTRAINT pk_run_retry_policies PRIMARY KEY (run_id), 
	CONSTRAINT ck_run_retry_policies_max_attempts_range CHECK (max_attempts >= 1 AND max_attempts <= 16), 
	CONSTRAINT ck_run_retry_policies_safety CHECK (safety IN ('unknown', 'idempotent', 'deduplicated')), 
	CONSTRAINT ck_run_retry_policies_backoff_range CHECK (backoff_base_ms >= 0 AND backoff_base_ms <= backoff_max_ms AND backoff_max_ms <= 86400000), 
	CONSTRAINT ck_run_retry_policies_safe_retry CHECK (NOT (retry_on_lost AND max_attempts > 1 AND safety = 'unknown')), 
	CONSTRAINT ck_run_retry_policies_version_nonneg CHECK (version >= 0), 
	CONSTRAINT ck_run_retry_policies_next_attempt_at_ms_nonneg CHECK (next_attempt_at_ms IS NULL OR next_attempt_at_ms >= 0), 
	CONSTRAINT ck_run_retry_policies_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0), 
	CONSTRAINT ck_run_retry_policies_updated_at_ms_nonneg CHECK (updated_at_ms IS NULL OR updated_at_ms >= 0), 
	CONSTRAINT fk_run_retry_policies_run_id_runs FOREIGN KEY(run_id) REFERENCES runs (id)
);

CREATE INDEX ix_run_retry_policies_due ON run_retry_policies (next_attempt_at_ms, run_id);

CREATE TABLE trigger_events (
	id VARCHAR(36) NOT NULL, 
	trigger_id VARCHAR(36) NOT NULL, 
	trigger_revision INTEGER NOT NULL, 
	type VARCHAR(16) NOT NULL, 
	scheduled_for_ms BIGINT NOT NULL, 
	occurrences INTEGER NOT NULL, 
	run_id VARCHAR(36), 
	created_at_ms BIGINT NOT NULL, 
	CONSTRAINT pk_trigger_events PRIMARY KEY (id), 
	CONSTRAINT ck_trigger_events_type CHECK (type IN ('skipped', 'missed')), 
	CONSTRAINT ck_trigger_events_occurrences_positive CHECK (occurrences >= 1), 
	CONSTRAINT ck_trigger_events_scheduled_for_ms_nonneg CHECK (scheduled_for_ms IS NULL OR scheduled_for_ms >= 0), 
	CONSTRAINT ck_trigger_events_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0), 
	CONSTRAINT fk_trigger_events_trigger_id_triggers FOREIGN KEY(trigger_id) REFERENCES triggers (id), 
	CONSTRAINT fk_trigger_events_run_id_runs FOREIGN KEY(run_id) REFERENCES runs (id)
);

CREATE INDEX ix_trigger_events_trigger_id_created_at_ms ON trigger_events (trigger_id, created_at_ms);

CREATE TABLE run_dispatch_leases (
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
	CONSTRAINT ck_run_dispatch_leases_release_reason CHECK (release_reason IS NULL OR release_reason IN ('declined', 'shutdown', 'start_failed', 'lease_expired')), 
	CONSTRAINT ck_run_dispatch_leases_released_has_reason CHECK ((status = 'released') = (release_reason IS NOT NULL)), 
	CONSTRAINT ck_run_dispatch_leases_counters_positive CHECK (lease_generation >= 1 AND version >= 1), 
	CONSTRAINT ck_run_dispatch_leases_expires_at_ms_nonneg CHECK (expires_at_ms IS NULL OR expires_at_ms >= 0), 
	CONSTRAINT ck_run_dispatch_leases_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0), 
	CONSTRAINT ck_run_dispatch_leases_updated_at_ms_nonneg CHECK (updated_at_ms IS NULL OR updated_at_ms >= 0), 
	CONSTRAINT fk_run_dispatch_leases_attempt_id_run_attempts FOREIGN KEY(attempt_id) REFERENCES run_attempts (id), 
	CONSTRAINT fk_run_dispatch_leases_run_id_runs FOREIGN KEY(run_id) REFERENCES runs (id), 
	CONSTRAINT fk_run_dispatch_leases_session_id_worker_sessions FOREIGN KEY(session_id) REFERENCES worker_sessions (session_id)
);

CREATE UNIQUE INDEX ix_run_dispatch_leases_one_leased ON run_dispatch_leases (attempt_id) WHERE status = 'leased';

CREATE INDEX ix_run_dispatch_leases_status_expires_at_ms ON run_dispatch_leases (status, expires_at_ms);

CREATE TABLE run_events (
	id VARCHAR(36) NOT NULL, 
	run_id VARCHAR(36) NOT NULL, 
	sequence INTEGER NOT NULL, 
	type VARCHAR(48) NOT NULL, 
	actor_type VARCHAR(16) NOT NULL, 
	attempt_id VARCHAR(36), 
	dedupe_key VARCHAR(256), 
	payload_json TEXT NOT NULL, 
	created_at_ms BIGINT NOT NULL, 
	CONSTRAINT pk_run_events PRIMARY KEY (id), 
	CONSTRAINT uq_run_events_run_id_sequence UNIQUE (run_id, sequence), 
	CONSTRAINT ck_run_events_sequence_positive CHECK (sequence >= 1), 
	CONSTRAINT ck_run_events_payload_size CHECK (length(payload_json) <= 16384), 
	CONSTRAINT ck_run_events_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0), 
	CONSTRAINT fk_run_events_run_id_runs FOREIGN KEY(run_id) REFERENCES runs (id), 
	CONSTRAINT fk_run_events_attempt_id_run_attempts FOREIGN KEY(attempt_id) REFERENCES run_attempts (id)
);

CREATE UNIQUE INDEX ix_run_events_dedupe ON run_events (run_id, dedupe_key) WHERE dedupe_key IS NOT NULL;
