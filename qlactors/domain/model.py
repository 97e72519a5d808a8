"""Task definitions and their validation: what a user may ask qlactors to run, and within which bounds."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from ..errors import BadInput
from . import posix
from .numbers import parse_decimal
from .retry import RetryPolicy

MAX_TIMEOUT_MS = 365 * 24 * 3600 * 1000  # a year; anything longer is a typo, not a timeout
MAX_STOP_GRACE_MS = 30_000
DEFAULT_STOP_GRACE_MS = 1_000
MAX_CONCURRENT_LIMIT = 1024
MAX_ENV_ENTRIES = 256
# Every limit on what a job is given counts encoded bytes (qlactors.domain.posix), not characters.
# One argv item, the shell string or one env value: the wire's limit for one string
# (qlactors.wire.validators.MAX_STR_BYTES; a test keeps the two equal).
MAX_WORD_BYTES = 64 * 1024
MAX_ENV_VALUE_BYTES = MAX_WORD_BYTES
MAX_COMMAND_BYTES = 128 * 1024  # the argv items together
MAX_CWD_BYTES = 4096  # Linux's PATH_MAX: chdir refuses a longer path
MAX_LABELS = 32
MAX_QUEUED_LIMIT = 1024
MAX_RANDOM_DELAY_MS = 24 * 3600 * 1000
RESERVED_ENV_PREFIX = "QLACTORS_"
# The launcher's own shell variables are all q_*: a job's env of that name would be overwritten
# by the launcher's value (and stay exported), so the job would not get what the task says.
LAUNCHER_ENV_PREFIX = "q_"
SHELL = "/bin/sh"  # what runs a shell-string command

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")


class TaskSpecError(BadInput):
    """A task definition outside the allowed shape or bounds; `field` names the task field it
    refuses (the API's name), read from the option the message starts with when not given."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        option = message.split(" ", 1)[0].rstrip(":")
        self.field = field or OPTION_FIELDS.get(option)


# The CLI's options and the task fields (API, `--json`) they set.
OPTION_FIELDS = {"--timeout": "timeout_ms", "--stop-grace": "stop_grace_ms", "--max-concurrent": "max_concurrent",
                 "--max-queued": "max_queued", "--random-delay": "random_delay_ms", "--cwd": "cwd", "--env": "env",
                 "--keep-leftovers": "keep_leftovers", "--backoff": "retry.backoff_base_ms"}


@dataclass(frozen=True, slots=True)
class Command:
    """What to execute: an argv list, or one shell string run by `/bin/sh -c`."""

    argv: tuple[str, ...] = ()
    shell: str | None = None

    @classmethod
    def from_words(cls, words: list[str] | tuple[str, ...]) -> "Command":
        """One word containing white space is a shell string; several words are an argv."""
        words = tuple(words)
        if not words:
            raise TaskSpecError("no command given: put it after `--`, e.g. `-- echo hello`", "command")
        if len(words) == 1 and any(c.isspace() for c in words[0]):
            return cls(shell=words[0])
        return cls(argv=words)

    def to_json(self) -> dict[str, Any]:
        """The JSON form (database and `--json`): each word as `posix.to_json` writes it."""
        if self.shell is not None:
            return {"shell": posix.to_json(self.shell)}
        return {"argv": [posix.to_json(word) for word in self.argv]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Command":
        """Read `to_json`'s form back; PosixTextError (a ValueError) for any other shape."""
        if type(data) is dict and set(data) == {"shell"}:
            return cls(shell=posix.from_json(data["shell"]))
        if type(data) is dict and set(data) == {"argv"} and type(data["argv"]) is list:
            return cls(argv=tuple(posix.from_json(word) for word in data["argv"]))
        raise posix.PosixTextError('a command is {"shell": ...} or {"argv": [...]}')

    def exec_argv(self) -> tuple[str, ...]:
        """The argv to exec: a shell-string task becomes `/bin/sh -c STRING`."""
        if self.shell is not None:
            return (SHELL, "-c", self.shell)
        return tuple(self.argv)

    def display(self) -> str:
        """For humans: the shell string, or the words quoted as a shell would (`shlex.join`: pasted
        into a shell, they run the same argv); bytes that are not UTF-8 as `\\xNN`."""
        return posix.display(self.shell if self.shell is not None else shlex.join(self.argv))

    def validate(self) -> None:
        if self.shell is not None:
            if self.argv:
                raise TaskSpecError("a command is either an argv or a shell string, not both", "command")
            text = self.shell
            if not text.strip():
                raise TaskSpecError("the shell command is empty", "command")
        else:
            if not self.argv or not self.argv[0]:
                raise TaskSpecError("no command given: put it after `--`, e.g. `-- echo hello`", "command")
            text = "\0".join(self.argv)
        if "\0" in (self.shell or "") or any("\0" in a for a in self.argv):
            raise TaskSpecError("the command contains a NUL byte", "command")
        for i, word in enumerate((self.shell,) if self.shell is not None else self.argv):
            what = "the shell string" if self.shell is not None else f"argv item {i}"
            if _posix_length(what, word) > MAX_WORD_BYTES:
                raise TaskSpecError(f"{what} is over the {MAX_WORD_BYTES}-byte limit for one "
                                    "command word: shorten it, or put it in a script and run that", "command")
        if _posix_length("the command", text) > MAX_COMMAND_BYTES:
            raise TaskSpecError(f"the command is over the {MAX_COMMAND_BYTES}-byte limit for all "
                                "its words together: put it in a script and run that", "command")


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One revision's worth of a task: everything a run pins when it is admitted."""

    name: str
    command: Command
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_ms: int | None = None
    stop_grace_ms: int = DEFAULT_STOP_GRACE_MS
    max_concurrent: int = 1
    retry: RetryPolicy = field(default_factory=RetryPolicy)  # validated when built
    labels: tuple[str, ...] = ()
    keep_leftovers: bool = False  # leave what the job left in its process group running (§5)
    max_queued: int = 1  # cron fires that may wait `queued` under overlap `queue` (§8)
    random_delay_ms: int = 0  # the most a cron fire is delayed at random (§8); 0 = none

    def validated(self) -> "TaskSpec":
        """Return self when every field is within bounds, else raise TaskSpecError naming the field."""
        validate_name(self.name)
        self.command.validate()
        if self.cwd is not None:
            if not self.cwd.startswith("/"):
                raise TaskSpecError(f"--cwd must be an absolute path, got {posix.display(self.cwd)!r}")
            if "\0" in self.cwd:
                raise TaskSpecError("--cwd contains a NUL byte")
            if _posix_length("--cwd", self.cwd) > MAX_CWD_BYTES:
                raise TaskSpecError(f"--cwd is over the {MAX_CWD_BYTES}-byte path limit")
        _check_env(self.env)
        if self.timeout_ms is not None:
            _check_int("--timeout", self.timeout_ms, 1, MAX_TIMEOUT_MS, "milliseconds",
                       hint="give seconds between 0.001 and 31536000 (a year)")
        _check_int("--stop-grace", self.stop_grace_ms, 0, MAX_STOP_GRACE_MS, "milliseconds",
                   hint="give seconds between 0 and 30")
        _check_int("--max-concurrent", self.max_concurrent, 1, MAX_CONCURRENT_LIMIT, "runs",
                   hint=f"give a whole number between 1 and {MAX_CONCURRENT_LIMIT}")
        _check_int("--max-queued", self.max_queued, 1, MAX_QUEUED_LIMIT, "runs",
                   hint=f"give a whole number between 1 and {MAX_QUEUED_LIMIT}")
        _check_int("--random-delay", self.random_delay_ms, 0, MAX_RANDOM_DELAY_MS, "milliseconds",
                   hint="give seconds between 0 and 86400 (a day)")
        if type(self.keep_leftovers) is not bool:
            raise TaskSpecError("--keep-leftovers is a flag")
        if len(self.labels) > MAX_LABELS:
            raise TaskSpecError(f"at most {MAX_LABELS} labels", "labels")
        return self

    def with_changes(self, **changes: Any) -> "TaskSpec":
        return replace(self, **changes).validated()


def validate_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise TaskSpecError(
            f"invalid task name {name!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit", "name")
    return name


def _check_int(option: str, value: Any, low: int, high: int, unit: str, *, hint: str) -> None:
    if type(value) is not int or not low <= value <= high:
        raise TaskSpecError(f"{option} out of range ({value} {unit}): {hint}")


def _check_env(env: Mapping[str, str]) -> None:
    if len(env) > MAX_ENV_ENTRIES:
        raise TaskSpecError(f"at most {MAX_ENV_ENTRIES} --env entries", "env")
    for key, value in env.items():
        if not _ENV_NAME.match(key):
            raise TaskSpecError(f"--env {key!r}: not a valid variable name (letters, digits, '_')")
        for prefix in (RESERVED_ENV_PREFIX, LAUNCHER_ENV_PREFIX):
            if key.startswith(prefix):
                raise TaskSpecError(f"--env {key}: names starting with {prefix} are reserved")
        if "\0" in value or _posix_length(f"--env {key}", value) > MAX_ENV_VALUE_BYTES:
            raise TaskSpecError(f"--env {key}: value has a NUL byte or is over the "
                                f"{MAX_ENV_VALUE_BYTES}-byte limit for one value")


def _posix_length(what: str, text: str) -> int:
    """The length in bytes of a value given to a job; TaskSpecError when it stands for no bytes."""
    try:
        return len(posix.posix_bytes(text))
    except posix.PosixTextError as err:
        raise TaskSpecError(f"{what} {err}: give it as bytes (a command-line argument always is)") from None


def env_to_json(env: Mapping[str, str]) -> dict[str, Any]:
    """The JSON form of a task's environment (database and `--json`), names sorted."""
    return {key: posix.to_json(env[key]) for key in sorted(env)}


def env_from_json(data: Any) -> dict[str, str]:
    """Read `env_to_json`'s form back; PosixTextError (a ValueError) for any other shape."""
    if type(data) is not dict or any(type(key) is not str for key in data):
        raise posix.PosixTextError("an environment is a JSON object of names to values")
    return {key: posix.from_json(value) for key, value in data.items()}


def env_names_json(env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """What the API and `--json` say of a task's environment: each name, that it is set, and its
    value's size in bytes, never the value (values are where users keep cookies and tokens)."""
    return {key: {"set": True, "bytes": len(posix.posix_bytes(env[key]))} for key in sorted(env)}


def env_patched(data: Any, current: Mapping[str, str] | None) -> dict[str, str]:
    """A task's environment after `data` (a JSON object) is applied to `current` (None: a new task).

    A string (or `{"base64": ...}`) sets its name; `null` removes it; `{"set": true, ...}` (as the
    API shows a name) keeps the current value; a name not given is kept. PosixTextError (a
    ValueError) for another shape, and for a kept or removed name of a new task (its value cannot
    be read back: it must be given).
    """
    if type(data) is not dict or any(type(key) is not str for key in data):
        raise posix.PosixTextError("an environment is a JSON object of names to values")
    env = dict(current or {})
    for key, value in data.items():
        shown = type(value) is dict and value.get("set") is True and "base64" not in value
        if value is None or shown:
            if current is None:
                raise posix.PosixTextError(f"{key}: give its value as a string (values are never read back, "
                                           "so a task shown by the API cannot be copied with them)")
            if value is None:
                env.pop(key, None)
            elif key not in env:
                raise posix.PosixTextError(f"{key}: the task has no such variable to keep; give its value")
            continue
        env[key] = posix.from_json(value)
    return env


def parse_env_pairs(pairs: list[str]) -> dict[str, str]:
    """Turn `K=V` words into a mapping; a name given twice is refused (which one was meant?)."""
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise TaskSpecError(f"--env {pair!r}: expected NAME=VALUE")
        if key in env:
            raise TaskSpecError(f"--env {key!r} is given twice; give each name once")
        env[key] = value
    return env


def seconds_to_ms(option: str, text: str) -> int:
    """Parse a user's seconds (digits, optional fraction; docs/cli.md "Numbers") into whole ms.

    qlactors counts milliseconds: a value finer than that (`0.0001`, `1.2345`) is refused rather
    than rounded, so no non-zero input can silently become 0 ("no timeout").
    """
    seconds = parse_decimal(option, text, "seconds", TaskSpecError)
    if seconds < 0:
        raise TaskSpecError(f"{option}: {text} is negative; give a number of seconds >= 0")
    if seconds > MAX_TIMEOUT_MS // 1000:
        raise TaskSpecError(f"{option}: {text} seconds is absurd; the limit is 31536000 (a year)")
    ms = seconds * 1000
    if ms != ms.to_integral_value():
        raise TaskSpecError(f"{option}: {text} is finer than a millisecond; give at most 3 decimals "
                            "(the smallest non-zero value is 0.001)")
    return int(ms)
