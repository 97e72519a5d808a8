"""Cluster recovery's settings and its page of cases, shared by the store's recovery and retirement
tests."""

from __future__ import annotations

from qlactors.domain.retry import RetryPolicy
from qlactors.domain.states import RetrySafety


GRACE_MS = 120_000


DRAIN_MS = 900_000


IDEMPOTENT = dict(retry=RetryPolicy(max_attempts=2, retry_on_lost=True, safety=RetrySafety.IDEMPOTENT))


def page_ids(cases, limit=16):
    page, _more = cases.page(limit)
    return [c.attempt_id for c in page]
