"""Who made a change, and which of a task's fields it changed: the audit trail's pure rules
(schema 16: `run_events.actor_name`, `task_events`)."""

from __future__ import annotations

from dataclasses import fields

from ..errors import BadInput
from .model import TaskSpec

MAX_ACTOR_NAME = 128  # run_events.actor_name, task_events.actor_name: VARCHAR(128)


def check_actor_name(name: object) -> str:
    """The name of the person behind a change (an API token's name, the CLI's user): 1 to 128
    printable characters, else BadInput (nothing is written)."""
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_ACTOR_NAME or not name.isprintable():
        raise BadInput(f"the name recorded as the author of a change must be 1 to {MAX_ACTOR_NAME} printable "
                       f"characters, not {name!r}; nothing was written")
    return name


def changed_fields(before: TaskSpec, after: TaskSpec) -> list[str]:
    """The names of the TaskSpec fields that differ (sorted): what a `task_events` row records of
    an update. Only names: never a command's words, an environment value or any output."""
    return sorted(f.name for f in fields(TaskSpec) if getattr(before, f.name) != getattr(after, f.name))
