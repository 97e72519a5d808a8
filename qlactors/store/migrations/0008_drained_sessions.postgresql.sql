-- qlactors schema 8 (cluster recovery, SEMANTICS.md §9 Drain, §10 step 1): when a session was
-- drained (a planned stop, `end_session` draining or offline). Such a session counts as ended
-- for the idempotent evidence only a drain grace after it ended; one superseded or revoked
-- without a drain counts from its `ended_at_ms`.

ALTER TABLE worker_sessions ADD COLUMN drained_at_ms BIGINT CONSTRAINT ck_worker_sessions_drained_at_ms_nonneg CHECK (drained_at_ms IS NULL OR drained_at_ms >= 0);
