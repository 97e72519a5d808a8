"""Shared: in-process messages between actors (never on the wire): frozen, slotted, plain values."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Tick:
    """The cadence timer fired (or a nudge arrived): run a Scheduler cycle now."""

    reason: str = "tick"


@dataclass(frozen=True, slots=True)
class StepRequest:
    """Scheduler -> Recovery/Retry: run one bounded page for cycle `cycle`."""

    cycle: int


@dataclass(frozen=True, slots=True)
class StepDone:
    """Recovery/Retry -> Scheduler: the page for `cycle` finished (ok=False: it failed)."""

    cycle: int
    step: str
    ok: bool
    detail: str = ""
    pending: bool = False  # the actor still has (or just did) work: the runtime is not idle
    more: bool = False  # its page was full: the Scheduler runs another cycle right after this one


@dataclass(frozen=True, slots=True)
class StepTimeout:
    """Bridge timer -> Scheduler: step `step` of `cycle` did not answer within its deadline."""

    cycle: int
    step: str


@dataclass(frozen=True, slots=True)
class CycleDone:
    """Scheduler -> Supervisor: a cycle ended; wake again no later than `next_due_ms` (wall clock)."""

    ok: bool
    next_due_ms: int | None = None
    stops: tuple = ()
    work_waiting: bool = False
    idle: bool = False  # nothing in flight, queued, lost or unresolved: the idle tick may apply


@dataclass(frozen=True, slots=True)
class Redeliver:
    """Bridge timer -> an actor: handling `message` met an unavailable database (which changed
    nothing); handle it again. `tries` counts the failures so far, for the backoff."""

    message: object
    tries: int
    since: float = 0.0  # monotonic time of its first failure: retries stop when they outlast
    # `store_outage_stop_ms` (the message then fails the actor, for the Supervisor to restart)


@dataclass(frozen=True, slots=True)
class ActorFailed:
    """Any actor -> Supervisor: an actor died on an exception (pykka stops it)."""

    name: str
    error: str
    step_timeout: bool = False  # silent past its step deadline (the Scheduler reports it)


@dataclass(frozen=True, slots=True)
class Resume:
    """An actor to itself, when the Supervisor restarted it: take back, from the database and the
    journal, what the dead instance had been told (pykka drops a dead actor's queued messages).
    A message, not work in `on_start`, so a database outage is retried instead of failing it."""


@dataclass(frozen=True, slots=True)
class AttemptEnded:
    """Supervisor -> Recovery: the executor attests that an attempt's process ended without a completion.

    `stopped_by`: what the executor last sent the job's group (`term`, `kill`) or `exit`, when it
    says: a receipt published after the attestation then completes with the stop it names."""

    run_id: str
    attempt_id: str
    stopped_by: str | None = None


@dataclass(frozen=True, slots=True)
class Consume:
    """Executor -> ReceiptConsumer: the launcher of `attempt_id` exited; consume its receipt."""

    run_id: str
    attempt_id: str
    recheck: bool = False
    stopped_by: str = "exit"  # how the launcher ended as the executor saw it: exit, term, kill
    # The control side has the attempt's end already (a not-running attestation was answered):
    # with no receipt, the journal row is finished as a completion's answer finishes one.
    end_known: bool = False


@dataclass(frozen=True, slots=True)
class NoReceipt:
    """ReceiptConsumer -> Executor: no usable receipt for `attempt_id` (missing or quarantined)."""

    run_id: str
    attempt_id: str
    quarantined: bool = False
    stopped_by: str = "exit"


@dataclass(frozen=True, slots=True)
class StopCheck:
    """Bridge timer -> Executor: the stop grace of `attempt_id` is over; escalate if it still runs."""

    attempt_id: str
    phase: str  # "term" (TERM was sent) or "kill" (KILL was sent)


@dataclass(frozen=True, slots=True)
class Cleanup:
    """Bridge timer -> ReceiptConsumer: journal-driven receipt cleanup and quarantine retention."""


@dataclass(frozen=True, slots=True)
class ResendCompleted:
    """Bridge timer -> ReceiptConsumer: send again each Completed still unanswered."""


@dataclass(frozen=True, slots=True)
class Drain:
    """Profile -> Supervisor: stop admitting work (shutdown has begun)."""

    cancel_running: bool = False


@dataclass(frozen=True, slots=True)
class DrainSession:
    """Worker profile -> Executor at SIGTERM: decline the offers never launched and leave the
    session (`draining`, then `offline`); `done` is set once `offline` is answered, and
    `no_session` too when there was no session to leave (none was ever opened, or it had ended)."""

    done: threading.Event = field(compare=False)
    no_session: threading.Event = field(default_factory=threading.Event, compare=False)


@dataclass(frozen=True, slots=True)
class StartupPass:
    """Profile -> Recovery (ask): examine every candidate, page after page, before admission opens."""


@dataclass(frozen=True, slots=True)
class ToWorkers:
    """Supervisor -> Gateway after a cycle: send these stop orders, and nudge when work waits."""

    stops: tuple = ()
    nudge: bool = False


@dataclass(frozen=True, slots=True)
class WakeAt:
    """Gateway -> Supervisor: a deadline was committed; run a cycle no later than `due_ms`."""

    due_ms: int


@dataclass(frozen=True, slots=True)
class HeartbeatDue:
    """The Executor's heartbeat timer (cluster sessions only)."""


@dataclass(frozen=True, slots=True)
class OwedDue:
    """The Executor's timer: send again the reports it still owes (executor_owed.py)."""


@dataclass(frozen=True, slots=True)
class RegisterDue:
    """The Executor's timer: its Register is still unanswered (executor_owed.py)."""


@dataclass(frozen=True, slots=True)
class SessionOpen:
    """Executor -> ReceiptConsumer: the session the worker's reports now name."""

    worker_id: str
    session_id: str
    generation: int


@dataclass(frozen=True, slots=True)
class ShipLog:
    """Executor -> LogSender (cluster): ship this attempt's log from `acked_offset`."""

    run_id: str
    attempt_id: str
    token_hash: str  # the callback token's hash, which authenticates each chunk
    path: str
    acked_offset: int = 0
    worker_id: str = ""


@dataclass(frozen=True, slots=True)
class LogFinal:
    """ReceiptConsumer -> LogSender: the completion named this final offset; ship up to it, then stop."""

    attempt_id: str
    final_offset: int


@dataclass(frozen=True, slots=True)
class ShipTick:
    """The LogSender's timer: at least every second while a log has new bytes."""
