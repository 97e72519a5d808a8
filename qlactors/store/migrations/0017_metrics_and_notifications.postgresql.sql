-- qlactors schema 17 (issue 20: metrics and notifications). run_outcome_counts: per task and
-- state (terminal, or `lost`), the runs that reached it, their run times' sum and cumulative
-- histogram, updated in the transition's own transaction so that retention never lowers a
-- counter. notification_rules: where to tell about runs reaching some states (a task's, or every
-- task's); notification_outbox: one row per rule asking about a transition, written in its
-- transaction; notification_deliveries: each try to deliver one.

CREATE TABLE run_outcome_counts (
	task_id VARCHAR(36) NOT NULL, 
	state VARCHAR(16) NOT NULL, 
	finished BIGINT NOT NULL, 
	timed BIGINT NOT NULL, 
	duration_ms_sum BIGINT NOT NULL, 
	le_1s BIGINT NOT NULL, 
	le_5s BIGINT NOT NULL, 
	le_15s BIGINT NOT NULL, 
	le_60s BIGINT NOT NULL, 
	le_300s BIGINT NOT NULL, 
	le_900s BIGINT NOT NULL, 
	le_3600s BIGINT NOT NULL, 
	le_21600s BIGINT NOT NULL, 
	CONSTRAINT pk_run_outcome_counts PRIMARY KEY (task_id, state), 
	CONSTRAINT ck_run_outcome_counts_state CHECK (state IN ('cancelled', 'failed', 'lost', 'succeeded', 'timed_out')), 
	CONSTRAINT fk_run_outcome_counts_task_id_tasks FOREIGN KEY(task_id) REFERENCES tasks (id)
);

CREATE TABLE notification_rules (
	id VARCHAR(36) NOT NULL, 
	task_id VARCHAR(36), 
	on_states VARCHAR(128) NOT NULL, 
	kind VARCHAR(16) NOT NULL, 
	target TEXT NOT NULL, 
	actor_name VARCHAR(128) NOT NULL, 
	created_at_ms BIGINT NOT NULL, 
	removed_at_ms BIGINT, 
	CONSTRAINT pk_notification_rules PRIMARY KEY (id), 
	CONSTRAINT ck_notification_rules_kind CHECK (kind IN ('webhook', 'apprise', 'command')), 
	CONSTRAINT ck_notification_rules_target_size CHECK (length(target) <= 4096), 
	CONSTRAINT ck_notification_rules_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0), 
	CONSTRAINT ck_notification_rules_removed_at_ms_nonneg CHECK (removed_at_ms IS NULL OR removed_at_ms >= 0), 
	CONSTRAINT fk_notification_rules_task_id_tasks FOREIGN KEY(task_id) REFERENCES tasks (id)
);

CREATE TABLE notification_outbox (
	id VARCHAR(96) NOT NULL, 
	run_id VARCHAR(36) NOT NULL, 
	rule_id VARCHAR(36) NOT NULL, 
	task_id VARCHAR(36) NOT NULL, 
	state VARCHAR(16) NOT NULL, 
	status VARCHAR(16) NOT NULL, 
	tries INTEGER NOT NULL, 
	next_try_at_ms BIGINT NOT NULL, 
	claimed_until_ms BIGINT, 
	created_at_ms BIGINT NOT NULL, 
	delivered_at_ms BIGINT, 
	CONSTRAINT pk_notification_outbox PRIMARY KEY (id), 
	CONSTRAINT ck_notification_outbox_status CHECK (status IN ('pending', 'delivered', 'gave_up')), 
	CONSTRAINT ck_notification_outbox_next_try_at_ms_nonneg CHECK (next_try_at_ms IS NULL OR next_try_at_ms >= 0), 
	CONSTRAINT ck_notification_outbox_claimed_until_ms_nonneg CHECK (claimed_until_ms IS NULL OR claimed_until_ms >= 0), 
	CONSTRAINT ck_notification_outbox_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0), 
	CONSTRAINT ck_notification_outbox_delivered_at_ms_nonneg CHECK (delivered_at_ms IS NULL OR delivered_at_ms >= 0), 
	CONSTRAINT fk_notification_outbox_rule_id_notification_rules FOREIGN KEY(rule_id) REFERENCES notification_rules (id)
);

CREATE INDEX ix_notification_outbox_run_id ON notification_outbox (run_id);

CREATE INDEX ix_notification_outbox_status_next_try_at_ms ON notification_outbox (status, next_try_at_ms);

CREATE TABLE notification_deliveries (
	id VARCHAR(36) NOT NULL, 
	outbox_id VARCHAR(96) NOT NULL, 
	run_id VARCHAR(36) NOT NULL, 
	try_number INTEGER NOT NULL, 
	ok BOOLEAN NOT NULL, 
	detail VARCHAR(512) NOT NULL, 
	at_ms BIGINT NOT NULL, 
	CONSTRAINT pk_notification_deliveries PRIMARY KEY (id), 
	CONSTRAINT ck_notification_deliveries_at_ms_nonneg CHECK (at_ms IS NULL OR at_ms >= 0)
);

CREATE INDEX ix_notification_deliveries_run_id ON notification_deliveries (run_id);
