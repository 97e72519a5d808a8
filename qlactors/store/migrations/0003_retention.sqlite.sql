-- qlactors schema 3: retention. Tombstones of retired runs (so `logs` and `show` say "retired"),
-- and the indexes retention reads by: finished runs oldest first, overall and per task, and the
-- references to a run that must be cleared before it is deleted. And a task's own retention
-- bounds on its head (NULL: the global bound of the config).

CREATE TABLE run_tombstones (
	run_id VARCHAR(36) NOT NULL,
	task_id VARCHAR(36) NOT NULL,
	finished_at_ms BIGINT NOT NULL,
	retired_at_ms BIGINT NOT NULL,
	reason VARCHAR(16) NOT NULL,
	CONSTRAINT pk_run_tombstones PRIMARY KEY (run_id),
	CONSTRAINT ck_run_tombstones_reason CHECK (reason IN ('max_age', 'max_runs')),
	CONSTRAINT ck_run_tombstones_finished_at_ms_nonneg CHECK (finished_at_ms IS NULL OR finished_at_ms >= 0),
	CONSTRAINT ck_run_tombstones_retired_at_ms_nonneg CHECK (retired_at_ms IS NULL OR retired_at_ms >= 0),
	CONSTRAINT fk_run_tombstones_task_id_tasks FOREIGN KEY(task_id) REFERENCES tasks (id)
);

CREATE INDEX ix_run_tombstones_retired_at_ms_run_id ON run_tombstones (retired_at_ms, run_id);

CREATE INDEX ix_run_tombstones_task_id_retired_at_ms_run_id ON run_tombstones (task_id, retired_at_ms, run_id);

CREATE INDEX ix_runs_finished_at_ms_id ON runs (finished_at_ms, id) WHERE finished_at_ms IS NOT NULL;

CREATE INDEX ix_runs_task_id_finished_at_ms_id ON runs (task_id, finished_at_ms, id) WHERE finished_at_ms IS NOT NULL;

CREATE INDEX ix_runs_retry_of_run_id ON runs (retry_of_run_id) WHERE retry_of_run_id IS NOT NULL;

CREATE INDEX ix_trigger_events_run_id ON trigger_events (run_id) WHERE run_id IS NOT NULL;

ALTER TABLE tasks ADD COLUMN retention_max_age_ms BIGINT CONSTRAINT ck_tasks_retention_max_age_range CHECK (retention_max_age_ms IS NULL OR (retention_max_age_ms >= 3600000 AND retention_max_age_ms <= 315360000000));

ALTER TABLE tasks ADD COLUMN retention_max_runs INTEGER CONSTRAINT ck_tasks_retention_max_runs_range CHECK (retention_max_runs IS NULL OR (retention_max_runs >= 1 AND retention_max_runs <= 1000000));
