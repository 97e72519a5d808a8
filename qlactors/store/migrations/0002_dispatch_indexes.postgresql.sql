-- qlactors schema 2: indexes for the dispatch query (a task's dispatched runs; the oldest queued run).

CREATE INDEX ix_runs_task_id_status ON runs (task_id, status);

CREATE INDEX ix_runs_status_queued_at_ms_id ON runs (status, queued_at_ms, id);
