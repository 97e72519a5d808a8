"""Worker labels and placement (qlactors/domain/labels.py): the label grammar, the MAX_LABELS
bound, which workers a task's required labels admit, and the warnings a user reads."""

from __future__ import annotations

import pytest

from qlactors.domain.labels import (
    LABEL_HINT,
    check_label,
    check_labels,
    placement_wait,
    qualifies,
    unplaced_warning,
)
from qlactors.domain.model import MAX_LABELS
from qlactors.errors import BadInput


@pytest.mark.parametrize("label", ["a", "Z", "0", "gpu", "zone=eu-1", "arch:arm64", "rack/7.b_c",
                                   "a" * 64, "9" + "-" * 63])
def test_a_label_of_1_to_64_allowed_characters_starting_alphanumeric_is_returned_as_given(label):
    assert check_label("worker.toml labels", label) == label


# A trailing newline is refused too (the grammar is matched whole: `$` alone used to let "gpu\n" in).


@pytest.mark.parametrize("label", ["", "a" * 65, "-gpu", ".gpu", "_gpu", "=x", "/x", "gpu fast", "gpu,cpu",
                                   "gpü", "ｇｐｕ", "x@y", "x*", "\ngpu", "gpu\tx",
                                   "gpu\n", "a" * 64 + "\n"])
def test_a_label_outside_the_grammar_is_refused_naming_where_the_label_and_the_hint(label):
    with pytest.raises(BadInput) as err:
        check_label("--require-label", label)
    assert str(err.value) == f"--require-label: label {label!r} is not valid: use {LABEL_HINT}"


@pytest.mark.parametrize("label", [None, 5, b"gpu", ["gpu"], True])
def test_a_label_that_is_no_string_is_refused(label):
    with pytest.raises(BadInput, match=r"^labels: label .* is not valid: use 1-64 letters"):
        check_label("labels", label)


def test_check_labels_drops_duplicates_and_keeps_the_first_order():
    assert check_labels("labels", ["b", "a", "b", "c", "a"]) == ("b", "a", "c")
    assert check_labels("labels", iter(())) == ()


def test_exactly_max_labels_distinct_labels_are_accepted():
    labels = [f"l{i}" for i in range(MAX_LABELS)]
    assert check_labels("labels", labels) == tuple(labels)


def test_one_label_over_max_labels_is_refused_with_the_bound_and_the_count():
    assert MAX_LABELS == 32  # the bound worker.toml, `--require-label` and the store share (model.py)
    labels = [f"l{i}" for i in range(MAX_LABELS + 1)]
    with pytest.raises(BadInput) as err:
        check_labels("worker.toml labels", labels)
    assert str(err.value) == f"worker.toml labels: at most {MAX_LABELS} labels, got {MAX_LABELS + 1}"


def test_the_bound_counts_distinct_labels_not_repeats():
    labels = [f"l{i}" for i in range(MAX_LABELS)] * 3
    assert len(check_labels("labels", labels)) == MAX_LABELS


def test_check_labels_refuses_the_first_bad_label_even_within_the_bound():
    with pytest.raises(BadInput, match=r"^labels: label 'bad label' is not valid"):
        check_labels("labels", ["ok", "bad label"])


@pytest.mark.parametrize("worker, required, expected", [
    ((), (), True),
    (("gpu",), (), True),
    (("gpu", "eu"), ("gpu",), True),
    (("gpu", "eu"), ("eu", "gpu"), True),
    (("gpu",), ("gpu", "eu"), False),
    ((), ("gpu",), False),
    (("GPU",), ("gpu",), False),  # labels are case-sensitive
])
def test_a_worker_qualifies_when_its_labels_include_every_required_one(worker, required, expected):
    assert qualifies(worker, required) is expected
    assert qualifies(iter(worker), iter(required)) is expected  # any iterables, read once


def test_no_warning_when_nothing_is_required_even_on_edge():
    assert unplaced_warning("t", (), None) is None
    assert unplaced_warning("t", (), []) is None


def test_edge_warns_that_a_task_requiring_labels_waits_for_ever():
    assert unplaced_warning("build", ("gpu", "eu"), None) == (
        "warning: task build requires label(s) gpu, eu, and the edge runtime has no labels: its runs "
        "wait here for ever (`qlactors task update build --no-require-label` lifts it)")


def test_no_warning_when_a_known_worker_has_every_required_label():
    known = [("w1", ["cpu"]), ("w2", ["gpu", "eu", "x"])]
    assert unplaced_warning("build", ("gpu", "eu"), known) is None


def test_the_warning_lists_the_known_workers_and_their_labels_when_none_qualifies():
    known = [("w1", ["cpu"]), ("w2", []), ("w3", ["gpu"])]
    assert unplaced_warning("build", ("gpu", "eu"), known) == (
        "warning: no known worker has label(s) gpu, eu (known: w1 [cpu], w2 [-], w3 [gpu]): runs of "
        "build wait until a worker with them registers (`labels` in its worker.toml)")
    assert "(known: none)" in unplaced_warning("build", ("gpu",), [])


def test_placement_on_edge_runs_what_requires_nothing_and_never_what_requires_labels():
    assert placement_wait((), None) is None
    assert placement_wait(("gpu",), None) == ("it requires label(s) gpu, and the edge runtime has no "
                                               "labels: it never runs here")


def test_placement_without_an_online_worker_says_so_whatever_is_required():
    assert placement_wait((), []) == "no worker is online"
    assert placement_wait(("gpu",), iter([])) == "no worker is online"


def test_placement_waits_naming_the_online_workers_when_none_qualifies():
    serving = [("w1", ("cpu", "eu")), ("w2", ())]
    assert placement_wait(("gpu",), serving) == "no online worker has label(s) gpu (online: w1 [cpu,eu], w2 [-])"
    assert placement_wait(("eu",), serving) is None
    assert placement_wait((), serving) is None
