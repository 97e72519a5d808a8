"""The audit trail's pure rules (qlactors/domain/audit.py): who may be recorded as a change's
author, and which of a task's fields an update changed (names only, never values)."""

from __future__ import annotations

import pytest

from qlactors.domain.audit import MAX_ACTOR_NAME, changed_fields, check_actor_name
from qlactors.domain.model import Command, TaskSpec
from qlactors.domain.retry import RetryPolicy
from qlactors.errors import BadInput


@pytest.mark.parametrize("name", ["alice", "a", "ci bot", "Ünïcode", "x" * MAX_ACTOR_NAME])
def test_a_printable_name_of_1_to_128_characters_is_an_actor(name):
    assert check_actor_name(name) == name


@pytest.mark.parametrize("name", ["", "x" * (MAX_ACTOR_NAME + 1), "a\nb", "a\x1b[31m", "a\udcff", None, 5, b"alice"])
def test_anything_else_is_refused(name):
    with pytest.raises(BadInput, match=r"1 to 128 printable characters.*nothing was written"):
        check_actor_name(name)


def test_changed_fields_names_every_differing_field_sorted_and_no_value():
    before = TaskSpec(name="t", command=Command.from_words(["echo", "secret-word"]), env={"TOKEN": "s3cret"})
    after = TaskSpec(name="t", command=Command.from_words(["echo", "other"]), env={"TOKEN": "changed"},
                     timeout_ms=5_000, retry=RetryPolicy(max_attempts=2), labels=("gpu",))
    assert changed_fields(before, after) == ["command", "env", "labels", "retry", "timeout_ms"]
    assert changed_fields(before, before) == []
