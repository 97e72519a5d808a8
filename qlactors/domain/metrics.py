"""The run-duration histogram's buckets (seconds), shared by the schema's counter columns
(`run_outcome_counts.le_<b>s`) and `/metrics`. Changing them is a migration."""

from __future__ import annotations

DURATION_BUCKETS_S: tuple[int, ...] = (1, 5, 15, 60, 300, 900, 3600, 21600)
