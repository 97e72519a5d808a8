-- qlactors schema 18 (issue 28: notifications). notification_rules.secret: a webhook's HMAC key
-- (never read back). notification_outbox: the run's facts at its transition (its latest attempt's
-- exit code and number, the run's error code and times), copied by the INSERT that queues the row,
-- so that a notification delivered after retention deleted the run still says what happened; the
-- rows queued before are filled here from what their runs hold now (NULL where the run is gone:
-- what schema 17 would have sent). notification_outbox.claimed_by and notification_deliverers: a
-- claim names the `qlactors web` process holding it, and holds only while that process refreshes
-- its row (released at once when it stops). A claim made under schema 17 (claimed_until_ms) is
-- honoured until it runs out.

ALTER TABLE notification_rules ADD COLUMN secret TEXT;

ALTER TABLE notification_outbox ADD COLUMN claimed_by VARCHAR(36);

ALTER TABLE notification_outbox ADD COLUMN exit_code INTEGER;

ALTER TABLE notification_outbox ADD COLUMN error_code VARCHAR(64);

ALTER TABLE notification_outbox ADD COLUMN attempt_number INTEGER;

ALTER TABLE notification_outbox ADD COLUMN run_created_at_ms BIGINT;

ALTER TABLE notification_outbox ADD COLUMN started_at_ms BIGINT;

ALTER TABLE notification_outbox ADD COLUMN finished_at_ms BIGINT;

UPDATE notification_outbox SET
	exit_code = (SELECT a.exit_code FROM run_attempts a WHERE a.run_id = notification_outbox.run_id
		ORDER BY a.number DESC LIMIT 1),
	attempt_number = (SELECT max(a.number) FROM run_attempts a WHERE a.run_id = notification_outbox.run_id),
	error_code = (SELECT r.error_code FROM runs r WHERE r.id = notification_outbox.run_id),
	run_created_at_ms = (SELECT r.created_at_ms FROM runs r WHERE r.id = notification_outbox.run_id),
	started_at_ms = (SELECT r.started_at_ms FROM runs r WHERE r.id = notification_outbox.run_id),
	finished_at_ms = (SELECT r.finished_at_ms FROM runs r WHERE r.id = notification_outbox.run_id);

CREATE INDEX ix_notification_outbox_claimed_by ON notification_outbox (claimed_by);

CREATE TABLE notification_deliverers (
	id VARCHAR(36) NOT NULL, 
	host VARCHAR(255) NOT NULL, 
	pid INTEGER NOT NULL, 
	started_at_ms BIGINT NOT NULL, 
	seen_at_ms BIGINT NOT NULL, 
	CONSTRAINT pk_notification_deliverers PRIMARY KEY (id), 
	CONSTRAINT ck_notification_deliverers_started_at_ms_nonneg CHECK (started_at_ms IS NULL OR started_at_ms >= 0), 
	CONSTRAINT ck_notification_deliverers_seen_at_ms_nonneg CHECK (seen_at_ms IS NULL OR seen_at_ms >= 0)
);
