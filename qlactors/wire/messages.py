"""Wire: every message the executor side and the control side exchange: one frozen, flat class per kind.

Size: every kind in one module, in the order docs/protocol.md lists them (the codec reads them all).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Literal, get_args

# Field metadata: the protocol version that added a field. A frame of an older version does not
# carry it (the field takes its default); a frame of that version or later must.
SINCE = "since"

# The codec reads everything it checks from these annotations (see codec.py): plain `int`, `bool`
# and `str`, `X | None`, `list[str]`, `dict[str, str]`, `Literal[...]` of strings, `str`
# narrowed by one of the two markers below through `Annotated`, and `PosixStr` (alone, as the
# item of a list or as the value of a map), `bytes` (at most MAX_CHUNK_BYTES), and `list[R]` of a
# record R: a frozen dataclass without KIND whose fields follow the same rules (a batch of offers,
# the renewals of a heartbeat). A field of any other type makes
# `import qlactors.wire.codec` fail, so a message the codec cannot check is never sent.
#
# Classes are keyword-only: most fields are ints or strs, and a report that swaps
# `session_generation` and `lease_generation` positionally would be fenced for no visible reason.
# Credentials (`lease_token`, the callback `token`) and the job's `env` stay out of `repr`, so a
# message in a log line or a traceback leaks none of them.
#
# The exchange (protocol 4, SEMANTICS.md §9 Exchange): every executor-side message is a request
# with a `request_id`, the same on every copy of it; every control-side answer names the request
# it answers in `answer_to`. Nudge and StopRequested answer nothing, and neither does a refusal
# of a frame that could not be read (`answer_to` ""): none of them counts as hearing a replica.


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
# What an Attest answer may say besides an Ack's words: the attempt was superseded (a later
# attempt, or it ended meanwhile): the worker stops the process by its exact identity.
AttestResult = Literal["applied", "fenced", "refused", "superseded"]
# What a worker attests about an attempt's process (SEMANTICS.md §9 Re-attest).
AttestFact = Literal["running", "stopped", "ended", "ended_with_receipt", "never_launched",
                     "launch_unknown"]
# The most bytes one LogChunk carries (SEMANTICS.md §13).
MAX_CHUNK_BYTES = 128 * 1024
# Same values as qlactors.domain.states.CancelReason (a test keeps them equal).
StopReason = Literal["user", "policy", "timeout", "shutdown"]
# How a stopped process ended as far as the executor saw: on its own, after SIGTERM, after SIGKILL.
StoppedBy = Literal["exit", "term", "kill"]
# How far a draining worker has gone (SEMANTICS.md §9 Drain): no more offers, then gone.
LeaveStatus = Literal["draining", "offline"]

ACK_RESULTS: frozenset[str] = frozenset(get_args(AckResult))
ATTEST_FACTS: frozenset[str] = frozenset(get_args(AttestFact))
STOP_REASONS: frozenset[str] = frozenset(get_args(StopReason))
STOPPED_BY: frozenset[str] = frozenset(get_args(StoppedBy))


# --- records: nested inside messages, never sent alone (no KIND) ---------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class OfferSlot:
    """One (offer id, lease token) pair of a Pull, journalled by the worker before it is sent."""

    offer_id: Id  # chosen by the executor, fresh per new pull
    lease_token: str = field(repr=False)  # fresh secret; the store keeps its hash


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRef:
    """A lease as its holder quotes it: in a heartbeat's renewals and in an Attest."""

    run_id: Id  # the attempt's run
    attempt_id: Id  # the attempt the lease is for
    offer_id: Id  # the offer that granted it
    lease_generation: int  # as offered (or as re-bound)
    lease_token: str = field(repr=False)  # the secret of the Pull that took it


@dataclass(frozen=True, slots=True, kw_only=True)
class Unactivated:
    """A lease of the session whose attempt was never activated, listed in Welcome."""

    run_id: Id  # the attempt's run
    attempt_id: Id  # the attempt never activated
    offer_id: Id  # the offer that granted the lease
    lease_generation: int  # as offered


@dataclass(frozen=True, slots=True, kw_only=True)
class Renewed:
    """A lease a heartbeat renewed: its new version and expiry (database time)."""

    attempt_id: Id  # the attempt whose lease was renewed
    lease_generation: int  # the renewed lease
    lease_version: int  # for information: the version never fences
    expires_at_ms: int | None  # None on edge (leases live with the runtime)


@dataclass(frozen=True, slots=True, kw_only=True)
class FencedLease:
    """A lease a heartbeat could not renew: the worker stops that process and attests it."""

    attempt_id: Id  # the attempt whose lease was not renewed
    lease_generation: int  # the lease quoted
    reason: str  # lease_released, lease_completed, lease_token, attempt_lost, ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Offer:
    """One claimed attempt, leased to the pulling worker (SEMANTICS.md §4.1); items of Offers."""

    run_id: Id  # the attempt's run
    attempt_id: Id  # the attempt this is about
    attempt_number: int  # 1 for a run's first attempt
    offer_id: Id  # one of the Pull's offer ids
    lease_generation: int  # quoted back in every fenced report
    lease_version: int  # for information
    lease_expires_at_ms: int | None  # database time; None on edge
    argv: list[PosixStr]  # the command as an argv (program first)
    cwd: PosixStr | None  # working directory; None for the executor's default
    env: dict[str, PosixStr] = field(repr=False)  # the job's environment (never logged)
    timeout_ms: int | None  # None: no timeout
    stop_grace_ms: int  # time between SIGTERM and SIGKILL when stopping
    log_cap_bytes: int  # the most log bytes kept; the rest is dropped and counted
    keep_leftovers: bool = False  # leave what the job left in its process group running when it ends


# --- executor side -> control side ---------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Register:
    """A worker opens a session, or resumes one; answered by Welcome (or a refused Ack).

    The worker id of a cluster message is its key's, from the allow-list; `worker_id` may be
    empty (the worker learns its id in Welcome) and is refused when it names another worker.
    A resume quotes the session and its secret: accepted within the session lease on the same
    boot, and the secret rotates; otherwise the worker registers anew (generation + 1).
    """

    KIND: ClassVar[str] = "register"

    request_id: Id  # chosen once per request, the same on every copy; its answer names it
    register_id: Id  # names this registration on every copy and every replica: a repeat gets the same session
    worker_id: str  # "" or the id bound to the peer's authenticated CurveZMQ key
    capacity: int  # how many attempts the worker runs at once
    boot_id: str  # the host's /proc/sys/kernel/random/boot_id, so a reboot is visible
    labels: list[str]  # the worker's configured labels (placement, SEMANTICS.md §9 Offers)
    protocol_min: int  # the oldest protocol version this worker speaks
    protocol_max: int  # the newest
    worker_clock_ms: int  # the worker's clock now, for the clock skew `workers` shows
    resume_session_id: Id | None  # the session to resume; None: register a new one
    resume_generation: int | None  # its generation
    resume_secret: str | None = field(repr=False)  # the secret Welcome gave; its hash is stored


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """Numbered per session; renews the session lease and every lease the worker holds (§9 Renewal).

    Always answered by HeartbeatAck; a repeat with the same `seq` gets the stored answer.
    """

    KIND: ClassVar[str] = "heartbeat"

    request_id: Id  # chosen once per request, the same on every copy; its answer names it
    worker_id: str  # the worker's id, bound to its CurveZMQ key
    session_id: Id  # from Welcome
    session_generation: int  # from Welcome
    seq: int  # 1, 2, ... per session
    free_slots: int  # capacity not taken by attempts between Offer and their end
    worker_clock_ms: int  # the worker's clock now (clock skew)
    renewals: list[LeaseRef]  # every lease the worker holds


@dataclass(frozen=True, slots=True, kw_only=True)
class Pull:
    """Ask for up to len(offers) offers; answered by Offers (empty: nothing to do now).

    The pairs are journalled before the Pull is sent. A lost answer is recovered by pulling
    again with the same pairs: the same offers come back and no second lease is taken.
    """

    KIND: ClassVar[str] = "pull"

    request_id: Id  # chosen once per request, the same on every copy; its answer names it
    worker_id: str  # the worker's id, bound to its CurveZMQ key
    session_id: Id  # the session, from Welcome
    session_generation: int  # from Welcome; an older generation is fenced
    pull_id: Id  # names this batch, so a late answer is matched to its Pull
    offers: list[OfferSlot]  # one pair per free slot asked for


@dataclass(frozen=True, slots=True, kw_only=True)
class FencedReport:
    """The fence every report about an offered attempt quotes in full (SEMANTICS.md §9).

    Not a message itself (it has no KIND): Activate, Started, StartFailed and Decline inherit
    these fields. Any mismatch answers `fenced` and changes nothing; the lease version is sent
    for information and never fences.
    """

    request_id: Id  # chosen once per request, the same on every copy; its answer names it
    worker_id: str  # the worker's id, bound to its CurveZMQ key
    session_id: Id  # the session, from Welcome
    session_generation: int  # from Welcome; an older generation is fenced
    run_id: Id  # the attempt's run
    attempt_id: Id  # the attempt this is about
    offer_id: Id  # the offer that granted the lease
    lease_generation: int  # as offered
    lease_token: str = field(repr=False)  # the secret sent with the Pull that took the lease
    lease_version: int  # as last heard, for information


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
class Decline(FencedReport):
    """An offer this worker will not start (draining, or unknown after a restart). Answered by Ack.

    The lease is released (`declined`) and the attempt is offered again.
    """

    KIND: ClassVar[str] = "decline"

    reason: str  # why, for logs


@dataclass(frozen=True, slots=True, kw_only=True)
class Completed:
    """A completion receipt, forwarded as read (SEMANTICS.md §5). Answered by Ack.

    Authenticated by the callback token, not by the fence: it is the fact of how the process
    ended and lands from any later session of the same worker. The session fields say who
    forwarded it, for logs.
    """

    KIND: ClassVar[str] = "completed"

    request_id: Id  # chosen once per request, the same on every copy; its answer names it
    worker_id: str  # the worker's id, bound to its CurveZMQ key
    session_id: Id  # the session, from Welcome
    session_generation: int  # from Welcome
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
    final_log_offset: int | None = None  # the log's final offset (§13); None on edge (a local file)
    # A cluster worker's verdict on its own clock: the job finished before the deadline it
    # derived at activation (§5). None on edge, where the control side compares one clock.
    finished_in_time: bool | None = None  # see above


@dataclass(frozen=True, slots=True, kw_only=True)
class LogChunk:
    """Bytes of an attempt's log at `offset` (SEMANTICS.md §13). Answered by LogAck.

    Authenticated like Completed (the worker id and the attempt's callback token hash), not by
    the lease, so the tail still lands after the worker registered anew.
    """

    KIND: ClassVar[str] = "log_chunk"

    request_id: Id  # chosen once per request, the same on every copy; its answer names it
    worker_id: str  # the worker's id, bound to its CurveZMQ key
    run_id: Id  # the attempt's run
    attempt_id: Id  # whose log this is
    callback_token_hash: Sha256Hex  # as sent in Activate
    offset: int  # where `data` starts in the log
    data: bytes  # at most MAX_CHUNK_BYTES
    checksum: Sha256Hex  # SHA-256 of `data`


@dataclass(frozen=True, slots=True, kw_only=True)
class Attest:
    """The worker's evidence about an attempt's process (SEMANTICS.md §9 Re-attest). Answered by Attested.

    Sent from the current session; `lease` quotes the lease it is about, which may belong to an
    older session of the same worker (`lease_session_id`, `lease_session_generation`). `running`
    carries the process identity and a fresh (offer id, lease token) pair: the control side
    re-binds the lease to the current session. On edge the quote may be absent (a journal row
    from before schema 6): the control side then judges by its own records.
    """

    KIND: ClassVar[str] = "attest"

    request_id: Id  # chosen once per request, the same on every copy; its answer names it
    worker_id: str  # the worker's id, bound to its CurveZMQ key
    session_id: Id  # the current session, from Welcome
    session_generation: int  # its generation
    run_id: Id  # the attempt's run
    attempt_id: Id  # the attempt this is about
    lease: LeaseRef | None  # the lease quoted
    lease_session_id: Id | None  # the session that lease belongs to
    lease_session_generation: int | None  # and its generation
    fact: AttestFact  # running | stopped | ended | ended_with_receipt | never_launched | launch_unknown
    stopped_by: StoppedBy | None  # how it ended, when known
    new_slot: OfferSlot | None  # `running`: the pair the re-bound lease takes
    boot_id: str | None  # `running`: the identity seen alive: boot id,
    pid: int | None  # launcher pid,
    pgid: int | None  # the job's process group,
    start_ticks: int | None  # and the launcher's start ticks


@dataclass(frozen=True, slots=True, kw_only=True)
class Leave:
    """The worker drains its session (SIGTERM, SEMANTICS.md §9 Drain). Answered by Ack.

    `draining`: offer it nothing more (its reports still count); `offline`: it is going away, its
    running jobs left running. Either marks the session drained: recovery counts it as ended only
    a drain grace after it ended. Fenced when the session is not the worker's current one.
    """

    KIND: ClassVar[str] = "leave"

    request_id: Id  # chosen once per request, the same on every copy; its answer names it
    worker_id: str  # the worker's id, bound to its CurveZMQ key
    session_id: Id  # the session, from Welcome
    session_generation: int  # its generation
    status: LeaveStatus  # draining | offline


# --- control side -> executor side ---------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Welcome:
    """A session is open (or resumed); every later message of the worker quotes it."""

    KIND: ClassVar[str] = "welcome"

    answer_to: Id  # the request_id of the request answered ("" answers nothing: an unreadable frame)
    worker_id: str  # the worker's id (on a cluster: from the allow-list)
    session_id: Id  # the session's id, chosen by the control side
    session_generation: int  # 1 for the worker's first session, + 1 for each new one
    resumed: bool  # True: the quoted session goes on
    resume_secret: str = field(repr=False)  # quote it to resume after a restart; rotates each time
    protocol: int  # the protocol version agreed
    heartbeat_ms: int  # how often to send Heartbeat
    session_lease_ms: int | None  # None on edge (the session lives with the runtime)
    run_lease_ms: int | None  # how long a run lease lasts between renewals; None on edge
    unactivated: list[Unactivated]  # this session's leases never activated: decline the unknown
    # Protocol 5: the session's last stored heartbeat number (0 for a new session): a resumed
    # worker numbers on from it, whatever its clock did. None: a protocol-4 frame (not carried).
    heartbeat_seq: int | None = field(default=None, metadata={SINCE: 5})  # protocol 5; None in a 4 frame


@dataclass(frozen=True, slots=True, kw_only=True)
class Offers:
    """The answer to a Pull: up to one offer per pair (empty: nothing to do now)."""

    KIND: ClassVar[str] = "offers"

    answer_to: Id  # the request_id of the request answered ("" answers nothing: an unreadable frame)
    worker_id: str  # the worker the offers are leased to
    session_id: Id  # its session
    session_generation: int  # and its generation
    pull_id: Id  # the Pull answered
    offers: list[Offer]  # at most one per pair of the Pull, within one frame


@dataclass(frozen=True, slots=True, kw_only=True)
class Activated:
    """The attempt is `starting`: the executor may spawn now."""

    KIND: ClassVar[str] = "activated"

    answer_to: Id  # the request_id of the request answered ("" answers nothing: an unreadable frame)
    run_id: Id  # the attempt's run
    attempt_id: Id  # the attempt this is about
    offer_id: Id  # the offer that granted the lease
    lease_version: int  # for information
    deadline_at_ms: int | None  # database time at which the attempt times out; None: never


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatAck:
    """The answer to a Heartbeat: the session lease and each quoted lease renewed or fenced."""

    KIND: ClassVar[str] = "heartbeat_ack"

    answer_to: Id  # the request_id of the request answered ("" answers nothing: an unreadable frame)
    seq: int  # the Heartbeat answered
    session_ended: bool  # True: register anew (the session is superseded, expired or revoked)
    session_expires_at_ms: int | None  # database time; None on edge
    renewed: list[Renewed]  # the leases renewed
    fenced: list[FencedLease]  # stop these processes by exact identity and attest it
    detail: str  # why, when the session ended
    # Protocol 5: with detail `stale_seq`, the session's stored heartbeat number: the worker jumps
    # past it. None otherwise, and in a protocol-4 frame (not carried).
    last_seq: int | None = field(default=None, metadata={SINCE: 5})  # protocol 5; None in a 4 frame


@dataclass(frozen=True, slots=True, kw_only=True)
class Ack:
    """The control side's answer to a report (and the refusal of a frame it cannot read)."""

    KIND: ClassVar[str] = "ack"

    answer_to: Id  # the request_id of the request answered ("" answers nothing: an unreadable frame)
    of: Id  # the KIND answered; "unknown" when the frame could not be decoded
    run_id: Id  # the report's run; empty when the answered message names none
    attempt_id: Id  # likewise
    offer_id: Id  # the report's offer id; empty when it names none
    result: AckResult  # applied | already_terminal | fenced | refused
    detail: str  # why, for logs: the mismatched fence field, a decode error naming both versions


@dataclass(frozen=True, slots=True, kw_only=True)
class Attested:
    """The answer to an Attest; on `applied` for `running`, the re-bound lease."""

    KIND: ClassVar[str] = "attested"

    answer_to: Id  # the request_id of the request answered ("" answers nothing: an unreadable frame)
    run_id: Id  # the attempt's run
    attempt_id: Id  # the attempt attested
    fact: AttestFact  # the fact answered
    result: AttestResult  # applied | fenced | refused | superseded (stop the process)
    offer_id: Id | None  # `running` applied: the re-bound lease's offer id
    lease_generation: int | None  # its generation
    lease_version: int | None  # its version, for information
    lease_expires_at_ms: int | None  # its expiry (database time)
    detail: str  # why, for logs


@dataclass(frozen=True, slots=True, kw_only=True)
class LogAck:
    """The answer to a LogChunk: where the control side's copy ends now."""

    KIND: ClassVar[str] = "log_ack"

    answer_to: Id  # the request_id of the request answered ("" answers nothing: an unreadable frame)
    attempt_id: Id  # whose log
    result: AckResult  # applied (appended or a repeat of what is stored) | refused (gap, conflict)
    acked_offset: int  # the stored log's length: ship from here
    detail: str  # why, when refused


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
    Register, Heartbeat, Pull, Activate, Started, StartFailed, Decline, Completed, LogChunk, Attest, Leave)
CONTROL_TO_EXECUTOR: tuple[type, ...] = (
    Welcome, Offers, Activated, HeartbeatAck, Ack, Attested, LogAck, StopRequested, Nudge)

# kind tag -> class; the codec refuses every kind not in here.
MESSAGES: dict[str, type] = {cls.KIND: cls for cls in EXECUTOR_TO_CONTROL + CONTROL_TO_EXECUTOR}
