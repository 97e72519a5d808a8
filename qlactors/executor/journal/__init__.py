"""Executor side: the executor's own journal (its records, the journal file of a worker)."""
