"""Children that tests signal start with the default dispositions, as a job or a CLI under a
terminal would. A test run started in the background by a non-interactive shell (`cmd &`), or
under `nohup`, ignores SIGINT and SIGQUIT (or SIGHUP), and an ignored signal stays ignored across
exec: a child that a test sends SIGINT would not die of it. The runtime's own spawn resets them
(process/launch.py `setsigdef`); this is the same for what the tests start themselves."""

from __future__ import annotations

import signal

RESET = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE)


def default_signals() -> None:
    """A `preexec_fn`: every signal a test may send back to its default disposition."""
    for sig in RESET:
        signal.signal(sig, signal.SIG_DFL)
