-- qlactors schema 14 (SEMANTICS.md §9 Sessions, duplicate keys): a session's note; `duplicate`
-- on a session opened by taking the worker's key back from a second live process presenting it
-- (that process is refused at its next Register while the session is young).

ALTER TABLE worker_sessions ADD COLUMN note VARCHAR(32);
