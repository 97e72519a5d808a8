"""The one result vocabulary (qlactors/domain/results.py): the wire's answer literals are its
values, an Outcome holds only its words, and no module of the package spells a result word as a
quoted literal (issue 19 rule 4)."""

from __future__ import annotations

import ast
import pathlib
from typing import get_args

import pytest

import qlactors
from qlactors.domain.results import SETTLED, Outcome, Result
from qlactors.wire import messages as m

PACKAGE = pathlib.Path(qlactors.__file__).parent
# Words that mean only a result: a quoted one outside the vocabulary's own module is a second
# spelling. ("cancelled" and "requested" are also run states and event words, so not scanned.)
RESULT_ONLY = {Result.APPLIED, Result.ALREADY_TERMINAL, Result.FENCED, Result.REFUSED, Result.SUPERSEDED,
               Result.ALREADY_REQUESTED}
# Where such a word is quoted for another reason, each with why.
ALLOWED = {
    ("wire/messages.py", "applied"), ("wire/messages.py", "already_terminal"), ("wire/messages.py", "fenced"),
    ("wire/messages.py", "refused"), ("wire/messages.py", "superseded"),  # the wire's Literal types (compared below)
    ("store/dispatch/session_rules.py", "superseded"),  # a session's mismatch reason (a detail word, not a result)
    ("store/dispatch/session_rules.py", "fenced"),  # the heartbeat answer's `fenced` field, by name in its JSON
}


@pytest.mark.parametrize("literal", [m.AckResult, m.AttestResult])
def test_every_answer_word_the_wire_carries_is_a_result(literal):
    words = set(get_args(literal))
    assert words and words <= {r.value for r in Result}


def test_the_wire_answer_words_are_exactly_the_results_of_fenced_reports():
    assert set(get_args(m.AckResult)) == {"applied", "already_terminal", "fenced", "refused"}
    assert set(get_args(m.AttestResult)) == {"applied", "fenced", "refused", "superseded"}
    assert m.ACK_RESULTS == frozenset(get_args(m.AckResult))


def test_a_result_equals_and_hashes_as_its_word():
    assert Result.APPLIED == "applied" and "applied" in SETTLED and "fenced" not in SETTLED
    assert {Result.REFUSED: 1}["refused"] == 1
    assert f"{Result.ALREADY_TERMINAL}" == "already_terminal"


def test_an_outcome_holds_a_result_even_when_built_from_its_word():
    outcome = Outcome("already_terminal", None, "succeeded")
    assert outcome.result is Result.ALREADY_TERMINAL and outcome.settled and not outcome.applied
    assert Outcome(Result.APPLIED) == Outcome("applied")
    assert Outcome(Result.FENCED, "lease_token").settled is False


@pytest.mark.parametrize("word", ["", "ok", "Applied", "cancel", None, 1])
def test_an_outcome_refuses_a_word_outside_the_vocabulary(word):
    with pytest.raises(ValueError):
        Outcome(word)


def _quoted_result_words(source: str) -> list[tuple[int, str]]:
    """Every string constant of `source` that is a result-only word, with its line."""
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in RESULT_ONLY]


def test_no_module_quotes_a_result_word():
    found, allowed_seen = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "domain/results.py":
            continue
        for line, word in _quoted_result_words(path.read_text()):
            if (rel, word) in ALLOWED:
                allowed_seen.add((rel, word))
            else:
                found.append(f"{rel}:{line}: {word!r}")
    assert not found, "spell these as qlactors.domain.results.Result members:\n" + "\n".join(found)
    assert allowed_seen == ALLOWED, f"allowed but no longer quoted (drop them): {ALLOWED - allowed_seen}"


def test_the_scan_sees_a_quoted_result_word():
    src = 'def f(msg):\n    return msg.result == "fenced" or "applied"\nx = "cancelled"\n'
    assert sorted(_quoted_result_words(src)) == [(2, "applied"), (2, "fenced")]
