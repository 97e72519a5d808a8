-- qlactors schema 10 (SEMANTICS.md §9 Register once, Revoked and retired): the register id of
-- the Register that opened a session and of the resume that last rotated its secret, so a
-- repeated Register (a re-sent copy, or the same one reaching another replica) gets the same
-- session, generation and secret; and who ended a session (`revoked`, `retired`): such a session
-- is never resumed, even one its worker had drained.

ALTER TABLE worker_sessions ADD COLUMN register_id VARCHAR(64);

ALTER TABLE worker_sessions ADD COLUMN resume_register_id VARCHAR(64);

ALTER TABLE worker_sessions ADD COLUMN ended_by VARCHAR(16) CONSTRAINT ck_worker_sessions_ended_by CHECK (ended_by IN ('revoked', 'retired'));
