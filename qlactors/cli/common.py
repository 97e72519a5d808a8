"""What every command module shares: the exit statuses, the stderr voice, who the user is (for the
record), and which attempt a `logs` reads (edge and cluster alike). A leaf: it imports no other
command module."""

from __future__ import annotations

import argparse
import sys

from ..domain.states import AttemptStatus
from ..domain.audit import check_actor_name
from ..errors import BadInput, NotFound

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE = 0, 1, 2
EXIT_TIMED_OUT, EXIT_CANCELLED, EXIT_FAILED_NO_CODE, EXIT_DOWN, EXIT_WAIT_TIMEOUT = 124, 130, 125, 3, 75


def say(line: str) -> None:
    print(f"qlactors: {line}", file=sys.stderr, flush=True)


def operator_name() -> str:
    """Who says it, for the record (the author of a change, `confirm-stopped --by`'s default): the
    login name (`$LOGNAME`, `$USER` and the like, else the account's)."""
    import getpass

    try:
        name = getpass.getuser()
    except (KeyError, OSError):  # no name in the environment and none for this uid
        raise BadInput("cannot tell who you are (no $USER, and no account for this uid): set USER to "
                       "your name (confirm-stopped also takes --by NAME); nothing was changed") from None
    return check_actor_name(name)


def pick_attempt(repo, args: argparse.Namespace):
    """The run and the attempt `logs` reads: `--attempt N`, else the latest."""
    run_view = repo.runs.get(args.run_id)
    attempts = run_view.attempts
    if args.attempt is not None:
        attempts = tuple(a for a in attempts if a.number == args.attempt)
        if not attempts:
            raise NotFound(f"run {args.run_id} has no attempt {args.attempt}")
    return run_view, attempts[-1]


def not_started(run_id: str, attempt) -> str:
    """Why an attempt has no output: it has not started yet, or it ended before it could."""
    if AttemptStatus(attempt.state).terminal:
        why = attempt.state + (f", {attempt.error_code}" if attempt.error_code else "")
        return f"run {run_id} attempt {attempt.number} never started ({why}): it has no output"
    return (f"run {run_id} has not started yet (attempt {attempt.number} {attempt.state}): no output "
            f"so far; `qlactors logs -f {run_id}` waits for it")
