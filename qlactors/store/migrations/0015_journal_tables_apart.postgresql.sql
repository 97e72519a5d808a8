-- qlactors schema 15 (docs/architecture.md, "The journal owns its tables"): the executor's journal
-- tables are the executor side's own (qlactors/executor/journal/schema.py). A PostgreSQL database
-- is a control database: it never held a journal row (an edge file holds its journal beside the
-- runs; a worker keeps its own journal file), so its empty copies go.

DROP TABLE IF EXISTS executor_owed;
DROP TABLE IF EXISTS executor_session;
DROP TABLE IF EXISTS executor_pulls;
DROP TABLE IF EXISTS executor_journal;
