"""Worker labels and placement: which workers a task's required labels admit (pure logic)."""

from __future__ import annotations

import re
from typing import Iterable

from ..errors import BadInput
from .model import MAX_LABELS

_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:=/-]{0,63}")
LABEL_HINT = "1-64 letters, digits, '.', '_', ':', '=', '/' or '-', starting with a letter or digit"


def check_label(where: str, label: object) -> str:
    """A label as given (a worker's `labels`, a task's `--require-label`), or BadInput naming `where`."""
    if not isinstance(label, str) or not _LABEL.fullmatch(label):
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


def _named(workers: Iterable[tuple[str, Iterable[str]]]) -> str:
    return ", ".join(f"{w} [{','.join(labels) or '-'}]" for w, labels in workers) or "none"


def unplaced_warning(task: str, required: tuple[str, ...],
                     known: Iterable[tuple[str, Iterable[str]]] | None) -> str | None:
    """`task add/update`: a warning when no known worker has every required label (the task's
    runs would wait for one); None when one has, or nothing is required. `known` is every worker
    with a session, with its labels, or None on edge (the local runtime has no labels)."""
    if not required:
        return None
    need = ", ".join(required)
    if known is None:
        return (f"warning: task {task} requires label(s) {need}, and the edge runtime has no labels: its "
                f"runs wait here for ever (`qlactors task update {task} --no-require-label` lifts it)")
    workers = list(known)
    if any(qualifies(labels, required) for _, labels in workers):
        return None
    return (f"warning: no known worker has label(s) {need} (known: {_named(workers)}): runs of {task} "
            "wait until a worker with them registers (`labels` in its worker.toml)")


def placement_wait(required: tuple[str, ...],
                   serving: Iterable[tuple[str, Iterable[str]]] | None) -> str | None:
    """Why a queued run whose revision requires `required` cannot be offered now, or None when a
    serving worker qualifies. `serving`: the workers offers may go to now, with their labels;
    None on edge (the local runtime, which has no labels, runs what requires none)."""
    need = ", ".join(required)
    if serving is None:
        return None if not required else (f"it requires label(s) {need}, and the edge runtime has no "
                                          "labels: it never runs here")
    workers = list(serving)
    if not workers:
        return "no worker is online"
    if any(qualifies(labels, required) for _, labels in workers):
        return None
    return f"no online worker has label(s) {need} (online: {_named(workers)})"
