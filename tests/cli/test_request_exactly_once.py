"""A manual `run` or `retry` carries a key chosen before its first try: a try whose commit outcome
is unknown is repeated with the same key and re-reads the run, never admits a second one."""

import pytest

import qlactors.cli.runtime_commands as rc
from qlactors.errors import StoreUnavailable
from store_helpers import spec


def test_a_commit_whose_answer_was_lost_is_re_read_not_admitted_again(repo, monkeypatch):
    monkeypatch.setattr(rc, "FIRST_RETRY_S", 0.0)
    repo.tasks.add(spec("once"), actor_name="tester")
    keys, answers = [], []

    def request(key):
        keys.append(key)
        admission = repo.runs.request("once", idempotency_key=key)
        answers.append(admission)
        if len(keys) == 1:  # committed, but the answer never came back
            raise StoreUnavailable("connection reset during commit")
        return admission

    admission = rc.exactly_once(request, "the run of once", "`qlactors runs`")
    assert len(set(keys)) == 1 and len(keys) == 2
    assert answers[0].run.id == admission.run.id and admission.created is False
    assert [r.id for r in repo.runs.list(task="once").runs] == [admission.run.id]


def test_when_every_try_fails_the_error_says_it_may_have_been_applied(monkeypatch):
    monkeypatch.setattr(rc, "FIRST_RETRY_S", 0.0)
    keys = []

    def request(key):
        keys.append(key)
        raise StoreUnavailable("database is unavailable")

    with pytest.raises(StoreUnavailable, match="may have been applied: `qlactors runs` shows whether"):
        rc.exactly_once(request, "the run of t", "`qlactors runs`")
    assert len(keys) == rc.REQUEST_TRIES and len(set(keys)) == 1
