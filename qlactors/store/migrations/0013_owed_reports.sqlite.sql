-- qlactors schema 13 (protocol 4, SEMANTICS.md §9 Owed reports): the reports an executor owes
-- the control side, journalled before they are sent and kept until their own answer; a journal
-- row cleared while one of them was owed waits for it (`clear_pending`).

ALTER TABLE executor_journal ADD COLUMN clear_pending BOOLEAN NOT NULL DEFAULT 0;

CREATE TABLE executor_owed (
	request_id VARCHAR(36) NOT NULL, 
	kind VARCHAR(32) NOT NULL, 
	attempt_id VARCHAR(36), 
	body BLOB NOT NULL, 
	created_at_ms BIGINT NOT NULL, 
	CONSTRAINT pk_executor_owed PRIMARY KEY (request_id), 
	CONSTRAINT ck_executor_owed_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0)
);

CREATE INDEX ix_executor_owed_attempt_id ON executor_owed (attempt_id);

CREATE INDEX ix_executor_owed_created_at_ms ON executor_owed (created_at_ms, request_id);
