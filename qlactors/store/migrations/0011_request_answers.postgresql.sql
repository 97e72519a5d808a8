-- qlactors schema 11 (SEMANTICS.md §9 Owed reports, Pull once): the answer ledger. The first
-- answer to each worker request (Pull, Activate, Started, StartFailed, Decline, Completed,
-- Attest, Leave), by the request's id, written in the transaction of its effect: a repeat gets
-- it again. The result is the store operation's own, as JSON; rows are pruned after a retention.

CREATE TABLE worker_requests (
	worker_id VARCHAR(128) NOT NULL, 
	request_id VARCHAR(64) NOT NULL, 
	kind VARCHAR(16) NOT NULL, 
	result_json TEXT NOT NULL, 
	created_at_ms BIGINT NOT NULL, 
	CONSTRAINT pk_worker_requests PRIMARY KEY (worker_id, request_id), 
	CONSTRAINT ck_worker_requests_kind CHECK (kind IN ('pull', 'activate', 'started', 'start_failed', 'decline', 'completed', 'attest', 'leave')), 
	CONSTRAINT ck_worker_requests_created_at_ms_nonneg CHECK (created_at_ms IS NULL OR created_at_ms >= 0)
);

CREATE INDEX ix_worker_requests_created_at_ms ON worker_requests (created_at_ms);
