"""Worker labels and placement: which workers a task's required labels admit (pure logic)."""

from __future__ import annotations

import re
from typing import Iterable

from ..errors import BadInput
from .model import MAX_LABELS

_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:=/-]{0,63}$")
LABEL_HINT = "1-64 letters, digits, '.', '_', ':', '=', '/' or '-', starting with a letter or digit"


def check_label(where: str, label: object) -> str:
    """A label as given (a worker's `labels`, a task's `--require-label`), or BadInput naming `where`."""
    if not isinstance(label, str) or not _LABEL.match(label):
        raise BadInput(f"{where}: label {label!r} is not valid: use {LABEL_HINT}")
    return label


def check_labels(where: str, labels: Iterable[object]) -> tuple[str, ...]:
    """Every label checked, duplicates dropped, order kept; at most MAX_LABELS."""
    found = tuple(dict.fromkeys(check_label(where, label) for label in labels))
    if len(found) > MAX_LABELS:
        raise BadInput(f"{where}: at most {MAX_LABELS} labels, got {len(found)}")
    return found


def qualifies(worker_labels: Iterable[str], required: Iterable[str]) -> bool:
    """A worker qualifies for a task when its labels include every label the task requires."""
    return set(required) <= set(worker_labels)
