"""Every message the executor side and the control side exchange: one frozen, flat class per kind."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Literal, get_args

# The codec reads everything it checks from these annotations (see codec.py): plain `int`, `bool`
# and `str`, `X | None`, `list[str]`, `dict[str, str]`, `Literal[...]` of strings, `str`
# narrowed by one of the two markers below through `Annotated`, and `PosixStr` (alone, as the
# item of a list or as the value of a map). A field of any other type makes
# `import qlactors.wire.codec` fail, so a message the codec cannot check is never sent.
#
# Classes are keyword-only: most fields are ints or strs, and a report that swaps
# `session_generation` and `lease_generation` positionally would be fenced for no visible reason.
# Credentials (`lease_token`, the callback `token`) and the job's `env` stay out of `repr`, so a
# message in a log line or a traceback leaks none of them.


@dataclass(frozen=True, slots=True)
class MaxLen:
    """Annotation marker: a string of at most `chars` characters."""

    chars: int


@dataclass(frozen=True, slots=True)
class Matches:
    """Annotation marker: a string that `pattern` matches in full."""

    pattern: str


@dataclass(frozen=True, slots=True)
class PosixBytes:
    """Annotation marker: a `str` holding POSIX bytes (qlactors.domain.posix).

    It travels as a msgpack `str` when its bytes are valid UTF-8 and as `bin` when they are not;
    a `bin` is read back with `surrogateescape`, so the job gets exactly the bytes it was given.
    The 64 KiB string limit counts those bytes.
    """


# An argv item, an env value or a working directory: what the job gets, byte for byte.
PosixStr = Annotated[str, PosixBytes()]

MAX_ID_CHARS = 64

# A run, attempt, offer or session id.
Id = Annotated[str, MaxLen(MAX_ID_CHARS)]
# A SHA-256 digest as 64 lowercase hex digits.
Sha256Hex = Annotated[str, Matches("[0-9a-f]{64}")]

AckResult = Literal["applied", "already_terminal", "fenced", "refused"]
# Same values as qlactors.domain.states.CancelReason (a test keeps them equal).
StopReason = Literal["user", "policy", "timeout", "shutdown"]
# How a stopped process ended as far as the executor saw: on its own, after SIGTERM, after SIGKILL.
StoppedBy = Literal["exit", "term", "kill"]

ACK_RESULTS: frozenset[str] = frozenset(get_args(AckResult))
STOP_REASONS: frozenset[str] = frozenset(get_args(StopReason))
STOPPED_BY: frozenset[str] = frozenset(get_args(StoppedBy))


# --- executor side -> control side ---------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Register:
    """A worker opens a session; answered by Welcome (generation + 1 on every new session)."""

    KIND: ClassVar[str] = "register"

    worker_id: str  # must equal the id bound to the peer's authenticated CurveZMQ key
    capacity: int  # how many attempts the worker runs at once
    boot_id: str  # the host's /proc/sys/kernel/random/boot_id, so a reboot is visible


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """The worker is alive: renews the session lease and reports free capacity."""

    KIND: ClassVar[str] = "heartbeat"

    worker_id: str  # the worker's id, bound to its CurveZMQ key
    session_id: Id  # from Welcome
    session_generation: int  # from Welcome; an older generation is fenced
    free_slots: int  # capacity not taken by attempts between Offer and their end


@dataclass(frozen=True, slots=True, kw_only=True)
class Pull:
    """Ask for one offer; answered by Offer or Idle.

    A lost answer is recovered by pulling again with the same `offer_id` and `lease_token`: the
    control side answers with the same offer and takes no second lease.
    """

    KIND: ClassVar[str] = "pull"

    worker_id: str  # the worker's id, bound to its CurveZMQ key
    session_id: Id  # the session, from Welcome
    session_generation: int  # from Welcome; an older generation is fenced
    free_slots: int  # capacity free now; the control side never offers beyond it
    offer_id: Id  # fresh per new pull, chosen by the executor
    lease_token: str = field(repr=False)  # fresh secret per new pull; the store keeps its hash


@dataclass(frozen=True, slots=True, kw_only=True)
class FencedReport:
    """The fence every report about an offered attempt quotes in full (SEMANTICS.md §9).

    Not a message itself (it has no KIND): Activate, Started, StartFailed and Renew inherit these
    fields. The control side checks every one under the attempt's lock; any mismatch or an
    expired lease answers `fenced` and changes nothing.
    """

    worker_id: str  # the worker's id, bound to its CurveZMQ key
    session_id: Id  # the session, from Welcome
    session_generation: int  # from Welcome; an older generation is fenced
    run_id: Id  # the attempt's run
    attempt_id: Id  # the attempt this is about
    offer_id: Id  # the offer that granted the lease
    lease_generation: int  # as offered
    lease_token: str = field(repr=False)  # the secret sent with the Pull that took the lease
    lease_version: int  # as last heard: from Offer or Activated, + 1 after each applied Renew


@dataclass(frozen=True, slots=True, kw_only=True)
class Activate(FencedReport):
    """The executor accepted and journalled the offer; asks for `claimed -> starting`.

    Answered by Activated, or by Ack `fenced` / `refused`, after which nothing is spawned.
    """

    KIND: ClassVar[str] = "activate"

    callback_token_hash: Sha256Hex  # SHA-256 of the callback token; the token never leaves the executor
    log_artifact_id: str  # names the attempt's log file on the executor


@dataclass(frozen=True, slots=True, kw_only=True)
class Started(FencedReport):
    """The launcher runs; its durable identity (SEMANTICS.md §4.5). Answered by Ack."""

    KIND: ClassVar[str] = "started"

    boot_id: str  # the host's boot id when the launcher was read
    pid: int  # the launcher's pid
    pgid: int  # its process group, shared with the job
    start_ticks: int  # /proc/PID/stat field 22: start time in clock ticks since boot


@dataclass(frozen=True, slots=True, kw_only=True)
class StartFailed(FencedReport):
    """The spawn failed and no receipt appeared: end the attempt `failed`. Answered by Ack."""

    KIND: ClassVar[str] = "start_failed"

    reason: str  # what failed, for the run's events (never the job's env or output)


@dataclass(frozen=True, slots=True, kw_only=True)
class Renew(FencedReport):
    """Extend the run lease. After an `applied` Ack the next report quotes `lease_version + 1`."""

    KIND: ClassVar[str] = "renew"


@dataclass(frozen=True, slots=True, kw_only=True)
class Completed:
    """A completion receipt, forwarded as read (SEMANTICS.md §5). Answered by Ack.

    Authenticated by the callback token, not by the fence: it is the fact of how the process
    ended and lands even after the session that launched it is gone. The session fields say who
    forwarded it, for logs.
    """

    KIND: ClassVar[str] = "completed"

    worker_id: str  # the worker's id, bound to its CurveZMQ key
    session_id: Id  # the session, from Welcome
    session_generation: int  # from Welcome; an older generation is fenced
    run_id: Id  # the attempt's run
    attempt_id: Id  # the attempt this is about
    schema_version: int  # the receipt's schemaVersion
    callback_sequence: int  # the receipt's callbackSequence
    token: str = field(repr=False)  # the callback token; its SHA-256 must match the activation's
    started_at_ms: int  # the launcher's clock when the job started
    finished_at_ms: int  # the launcher's clock when the job ended
    exit_code: int  # 0..255; 128 + N after signal N
    log_dropped_bytes: int | None  # bytes the log cap dropped; None when no count was found
    output_open: int = 0  # the receipt's outputOpen (schema 2; 0 for schema 1)
    stopped_by: StoppedBy = "exit"  # what the executor last sent the job's group before the end


@dataclass(frozen=True, slots=True, kw_only=True)
class Attest:
    """The executor's own evidence about an attempt's process, for recovery. Answered by Ack.

    `running=True`: the exact identity is still alive. `running=False` with `conclusive=True`:
    the executor saw the process end (for example its pidfd fired);
    with `conclusive=False` the process is merely not found, which recovery may not treat as
    proof.
    """

    KIND: ClassVar[str] = "attest"

    worker_id: str  # the worker's id, bound to its CurveZMQ key
    session_id: Id  # the session, from Welcome
    session_generation: int  # from Welcome; an older generation is fenced
    run_id: Id  # the attempt's run
    attempt_id: Id  # the attempt this is about
    running: bool  # the process with the attempt's exact identity is alive
    conclusive: bool  # the executor observed the end itself; only meaningful when not running
    stopped_by: StoppedBy | None  # how it ended, when known; None while running or unknown


# --- control side -> executor side ---------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Welcome:
    """A session is open; every later message of the worker quotes it."""

    KIND: ClassVar[str] = "welcome"

    worker_id: str  # the worker's id, bound to its CurveZMQ key
    session_id: Id  # the new session's id, chosen by the control side
    session_generation: int  # 1 for the worker's first session, + 1 for each new one


@dataclass(frozen=True, slots=True, kw_only=True)
class Offer:
    """One claimed attempt, leased to the pulling worker; answers a Pull (SEMANTICS.md §4.1)."""

    KIND: ClassVar[str] = "offer"

    worker_id: str  # the worker's id, bound to its CurveZMQ key
    session_id: Id  # the session, from Welcome
    session_generation: int  # from Welcome; an older generation is fenced
    run_id: Id  # the attempt's run
    attempt_id: Id  # the attempt this is about
    attempt_number: int  # 1 for a run's first attempt
    offer_id: Id  # the Pull's offer id
    lease_generation: int  # quoted back in every fenced report
    lease_version: int  # the version the first report (Activate) quotes
    argv: list[PosixStr]  # the command as an argv (program first)
    cwd: PosixStr | None  # working directory; None for the executor's default
    env: dict[str, PosixStr] = field(repr=False)  # the job's environment (never logged)
    timeout_ms: int | None  # None: no timeout
    stop_grace_ms: int  # time between SIGTERM and SIGKILL when stopping
    log_cap_bytes: int  # the most log bytes kept; the rest is dropped and counted
    keep_leftovers: bool = False  # leave what the job left in its process group running when it ends


@dataclass(frozen=True, slots=True, kw_only=True)
class Idle:
    """Nothing to offer for this Pull; pull again later, or at once on a Nudge."""

    KIND: ClassVar[str] = "idle"

    offer_id: Id  # the Pull's offer id, so a late Idle is matched to its Pull


@dataclass(frozen=True, slots=True, kw_only=True)
class Activated:
    """The attempt is `starting`: the executor may spawn now."""

    KIND: ClassVar[str] = "activated"

    run_id: Id  # the attempt's run
    attempt_id: Id  # the attempt this is about
    offer_id: Id  # the offer that granted the lease
    lease_version: int  # the version the next report quotes
    deadline_at_ms: int | None  # database time at which the attempt times out; None: never


@dataclass(frozen=True, slots=True, kw_only=True)
class Ack:
    """The control side's answer to a report (and the refusal of a frame it cannot read)."""

    KIND: ClassVar[str] = "ack"

    of: Id  # the KIND answered; "unknown" when the frame could not be decoded
    run_id: Id  # the report's run; empty when the answered message names none
    attempt_id: Id  # likewise
    result: AckResult  # applied | already_terminal | fenced | refused
    detail: str  # why, for logs: the mismatched fence field, a decode error naming both versions


@dataclass(frozen=True, slots=True, kw_only=True)
class StopRequested:
    """Stop the attempt's process: SIGTERM to its group, SIGKILL after the grace (SEMANTICS.md §7)."""

    KIND: ClassVar[str] = "stop_requested"

    run_id: Id  # the attempt's run
    attempt_id: Id  # the attempt this is about
    reason: StopReason  # the committed cancel reason: user | policy | timeout | shutdown
    grace_ms: int  # time between SIGTERM and SIGKILL


@dataclass(frozen=True, slots=True, kw_only=True)
class Nudge:
    """Something changed on the control side (new work, a cancel): pull and act now."""

    KIND: ClassVar[str] = "nudge"


EXECUTOR_TO_CONTROL: tuple[type, ...] = (
    Register, Heartbeat, Pull, Activate, Started, StartFailed, Renew, Completed, Attest)
CONTROL_TO_EXECUTOR: tuple[type, ...] = (
    Welcome, Offer, Idle, Activated, Ack, StopRequested, Nudge)

# kind tag -> class; the codec refuses every kind not in here.
MESSAGES: dict[str, type] = {cls.KIND: cls for cls in EXECUTOR_TO_CONTROL + CONTROL_TO_EXECUTOR}
