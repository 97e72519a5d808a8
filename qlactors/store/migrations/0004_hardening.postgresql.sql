-- qlactors schema 4 (the hardening issue): per-task leftover handling, a bound on queued cron
-- fires and a random delay (task revisions); a run's not-before time (the random delay applied);
-- and `cancelled` as a lease release reason (a cancel of an offered, never-activated attempt).

ALTER TABLE task_revisions ADD COLUMN keep_leftovers BOOLEAN NOT NULL DEFAULT false;

ALTER TABLE task_revisions ADD COLUMN max_queued INTEGER NOT NULL DEFAULT 1;

ALTER TABLE task_revisions ADD COLUMN random_delay_ms BIGINT NOT NULL DEFAULT 0;

ALTER TABLE runs ADD COLUMN not_before_ms BIGINT;

ALTER TABLE task_revisions ADD CONSTRAINT ck_task_revisions_max_queued_range CHECK (max_queued >= 1 AND max_queued <= 1024);

ALTER TABLE task_revisions ADD CONSTRAINT ck_task_revisions_random_delay_range CHECK (random_delay_ms >= 0 AND random_delay_ms <= 86400000);

ALTER TABLE runs ADD CONSTRAINT ck_runs_not_before_ms_nonneg CHECK (not_before_ms IS NULL OR not_before_ms >= 0);

ALTER TABLE run_dispatch_leases DROP CONSTRAINT ck_run_dispatch_leases_release_reason;

ALTER TABLE run_dispatch_leases ADD CONSTRAINT ck_run_dispatch_leases_release_reason CHECK (release_reason IS NULL OR release_reason IN ('declined', 'shutdown', 'start_failed', 'lease_expired', 'cancelled'));
