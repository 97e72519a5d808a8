"""Executor side: one attempt's phases as a pure machine — `decide(phase, event) -> Decision`.

What an executor does with an attempt it holds (or finds in its journal after a restart) depends
on its phase and on the event: an answer, a timer, a Welcome, the launcher's exit, a probe's
fact. `decide` returns the next phase and the effects to carry out, in order, as plain values;
it reads no clock, no journal and no process: what it needs to know besides the phase comes in
the event's facts, which the Executor reads from its owners before it asks (the journal's owed
rows, the session open now, the lease held now). The table below answers every phase × event
pair — a transition or an explicit `ignored` with its reason (tests/executor/test_attempt.py
fails when a phase or an event is added without one) — and `docs/architecture.md` shows it.

A restart forgets every phase: each journal row not held is `UNPROBED` again and its probe's
fact (executor/evidence.py) decides (`PROBED`), so the phase a restarted worker rebuilds comes
from its journal, /proc, a receipt and its owed rows alone (docs/recovery.md lists the writes).

An answer settles the owed report it names before `decide` sees it (owed_reports.py), except an
applied re-bind, which `JOURNAL_REBIND` settles in the same transaction.

Size: one table that answers every phase × event pair, read whole.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Mapping, Union

from ..domain.results import Result
from . import evidence as ev


class AttemptPhase(str, enum.Enum):
    OFFERED = "offered"  # in an Offers answer, not journalled yet
    ACTIVATING = "activating"  # journalled `accepted`; its Activate repeated until answered
    REFUSED = "activation_refused"  # Activate refused between sessions: never launched, held until a Welcome
    LAUNCHING = "launching"  # journalled `launching` before the spawn: a restart never spawns it again
    LAUNCHED = "launched"  # spawned, identity journalled (`started`), Started owed
    RUNNING = "running"  # Started answered, or a survivor re-bound to the current session
    REBINDING = "rebinding"  # a `running` Attest owed with a fresh slot; its renewals held
    STOPPING = "stopping"  # TERM sent to the job's group by exact identity
    KILLING = "killing"  # KILL sent; the launcher drains and publishes
    EXITED = "exited"  # the launcher ended: its receipt (or its absence) is the ReceiptConsumer's
    REPORTED = "reported"  # its end answered: done
    DECLINING = "declining"  # a drain's Decline owed, the slot held until answered
    GIVEN_BACK = "given_back"  # never launched here: `never_launched` owed, the slot free
    START_FAILED = "start_failed"  # nothing spawned: StartFailed owed, the slot free
    RELEASED = "released"  # never launched, nothing owed (declined, fenced, left to expire)
    UNPROBED = "unprobed"  # a journal row not held (a restart, a Welcome): its probe decides
    UNDECIDED = "undecided"  # attested `launch_unknown`: waits for an operator, asked again


class EventKind(str, enum.Enum):
    ACCEPT = "accept"  # an offer answering the Pull waited for
    OFFER_NOT_WAITED = "offer_not_waited"  # an offer of a Pull no longer waited for
    ACTIVATE_DUE = "activate_due"  # a heartbeat interval without an answer to the Activate
    ACTIVATED = "activated"  # the first `Activated` of the Activate sent for the offer held
    ACTIVATE_REFUSED = "activate_refused"  # the Activate answered fenced or refused
    SPAWNED = "spawned"  # the launcher runs (the SPAWN effect's own result)
    SPAWN_FAILED = "spawn_failed"  # nothing was spawned (cwd gone, exec failed)
    STARTED_APPLIED = "started_applied"
    STARTED_REFUSED = "started_refused"  # Started not accepted (`same_lease`: under the lease held)
    NEW_SESSION = "new_session"  # a Welcome of a session other than the lease's
    SESSION_ENDED = "session_ended"  # the session ended, was superseded or revoked: registering anew
    REBIND_APPLIED = "rebind_applied"  # the `running` Attest answered applied
    REBIND_SUPERSEDED = "rebind_superseded"
    REBIND_FENCED = "rebind_fenced"
    STOP_REQUESTED = "stop_requested"  # cancel or timeout, from the control side
    DEADLINE_PASSED = "deadline_passed"  # cut off from every replica, past its own deadline (§7)
    LEASE_FENCED = "lease_fenced"  # a heartbeat's answer: the lease is not this worker's any more
    DRAIN = "drain"  # SIGTERM: nothing is accepted or launched any more
    DECLINE_APPLIED = "decline_applied"  # the drain's Decline answered applied or fenced
    DECLINE_REFUSED = "decline_refused"  # ... refused: activated meanwhile
    TERM_ELAPSED = "term_elapsed"  # the stop grace went by
    KILL_ELAPSED = "kill_elapsed"  # the launcher's own TERM, grace, KILL and drain went by
    EXITED = "exited"  # the launcher's pidfd fired
    PROBED = "probed"  # a journal row's evidence (`fact`)
    ASK_AGAIN = "ask_again"  # every few heartbeats, for a `launch_unknown` row
    END_KNOWN = "end_known"  # the control side has the attempt's end (an answer to an Attest)
    REPORT_SETTLED = "report_settled"  # its Completed answered
    RESTARTED = "restarted"  # the worker process started again: memory is gone


class Effect(str, enum.Enum):
    JOURNAL_ACCEPT = "journal_accept"
    CREATE_LOG = "create_log"
    SEND_ACTIVATE = "send_activate"
    JOURNAL_LAUNCHING = "journal_launching"
    SPAWN = "spawn"
    JOURNAL_STARTED = "journal_started"
    WATCH = "watch"
    ADOPT = "adopt"  # open the survivor's pidfd and watch it (gone: EXITED)
    OWE_STARTED = "owe_started"
    OWE_START_FAILED = "owe_start_failed"
    OWE_GIVE_BACK = "owe_give_back"
    OWE_DECLINE = "owe_decline"
    OWE_ATTEST_RUNNING = "owe_attest_running"  # journalled with the fresh slot before it is sent
    OWE_ATTEST_LAUNCH_UNKNOWN = "owe_attest_launch_unknown"
    JOURNAL_REBIND = "journal_rebind"  # the slot's lease, settling the Attest
    JOURNAL_TIMEOUT_INTENT = "journal_timeout_intent"
    JOURNAL_CLEAR = "journal_clear"
    SIGNAL_TERM = "signal_term"
    SIGNAL_KILL = "signal_kill"
    RELEASE_SLOT = "release_slot"
    PULL = "pull"
    CONSUME = "consume"  # hand the attempt to the ReceiptConsumer
    PROBE_LATER = "probe_later"  # /proc unreadable: on a later heartbeat


P, E, X = AttemptPhase, EventKind, Effect
TERMINAL = frozenset({P.REPORTED, P.GIVEN_BACK, P.START_FAILED, P.RELEASED})
LIVE = frozenset({P.LAUNCHED, P.RUNNING, P.REBINDING, P.STOPPING, P.KILLING})  # a process of it may run
STOPS = frozenset({X.SIGNAL_TERM, X.SIGNAL_KILL})


@dataclass(frozen=True, slots=True)
class Event:
    """An event and the facts `decide` needs besides the phase (read by the Executor)."""

    kind: EventKind
    draining: bool = False  # a SIGTERM drain runs
    session_open: bool = True  # a session is open here now
    same_lease: bool = True  # STARTED_REFUSED: about the lease held now
    running_owed: bool = False  # a (later) `running` Attest about the attempt is still owed
    report_owed: bool = False  # another report about the attempt is owed (it may keep the process)
    session_fence: bool = False  # REBIND_FENCED: fenced for the session it was sent from
    sent_from_current: bool = True  # ... and that session is still the current one here
    newer_lease: bool = False  # REBIND_FENCED: a newer lease was learnt since it was sent
    lease_current: bool = True  # REBIND_APPLIED: the re-bound lease is the current session's
    pair_known: bool = False  # OFFER_NOT_WAITED: the pair its Pull journalled is known
    own_records: bool = False  # edge: recovery judges by its own records, leases live with the process
    fact: str = ""  # PROBED: the evidence (executor/evidence.py)


@dataclass(frozen=True, slots=True)
class Decision:
    phase: AttemptPhase
    effects: tuple[Effect, ...] = ()
    ignored: str = ""  # why nothing happens (an ignored pair, or a guard that holds it back)
    stop_cause: str = ""  # why the machine stops the job itself (SIGNAL_TERM effects)


Rule = Union[Decision, str, Callable[[AttemptPhase, Event], Decision]]


def decide(phase: AttemptPhase, event: Event) -> Decision:
    """The next phase and the effects of `event` in `phase` (see the module docstring)."""
    rule = TABLE[phase][event.kind]
    if isinstance(rule, Decision):
        return rule
    if isinstance(rule, str):
        return Decision(phase, ignored=rule)
    return rule(phase, event)


def _to(phase: AttemptPhase, *effects: Effect, cause: str = "") -> Decision:
    return Decision(phase, tuple(effects), stop_cause=cause)


# -- the rules that read an event's facts ----------------------------------------------------------

def _accept(_p: P, e: Event) -> Decision:
    if e.draining:
        return _to(P.DECLINING, X.OWE_DECLINE)
    return _to(P.ACTIVATING, X.JOURNAL_ACCEPT, X.CREATE_LOG, X.SEND_ACTIVATE)


def _not_waited(_p: P, e: Event) -> Decision:
    if e.own_records:  # edge: leases live with the process, given back and judged by its records
        return _to(P.GIVEN_BACK, X.OWE_GIVE_BACK)
    return _to(P.RELEASED, X.OWE_DECLINE) if e.pair_known else _to(P.RELEASED)  # else left to expire


def _activate_due(p: P, e: Event) -> Decision:
    return Decision(p, ignored="draining: declined, never launched") if e.draining else _to(p, X.SEND_ACTIVATE)


def _activated(p: P, e: Event) -> Decision:
    if e.draining:
        return Decision(p, ignored="draining: never launched; its Decline is answered refused")
    return _to(P.LAUNCHING, X.JOURNAL_LAUNCHING, X.SPAWN)


def _activate_refused(_p: P, e: Event) -> Decision:
    if not e.session_open:
        return Decision(P.REFUSED, ignored="between sessions: the next Welcome gives it back")
    give_back = () if e.own_records else (X.OWE_GIVE_BACK,)
    return _to(P.GIVEN_BACK, X.RELEASE_SLOT, *give_back, X.JOURNAL_CLEAR, X.PULL)


def _started_refused(p: P, e: Event) -> Decision:
    if not e.same_lease:
        return Decision(P.RUNNING, ignored="about an older lease: the one held now goes on")
    return _to(P.STOPPING, X.SIGNAL_TERM, cause="started_refused")


def _reattest(p: P, e: Event) -> Decision:
    if e.running_owed:
        return Decision(P.REBINDING, ignored="a running Attest is owed: re-sent unchanged, its answer decides")
    return _to(P.REBINDING, X.OWE_ATTEST_RUNNING)


def _rebind_applied(_p: P, e: Event) -> Decision:
    if e.running_owed:
        return _to(P.REBINDING, X.JOURNAL_REBIND)  # a later attestation decides
    if not e.lease_current:  # re-bound to a session that has ended since: again from the current one
        return _to(P.REBINDING, X.JOURNAL_REBIND, X.OWE_ATTEST_RUNNING)
    return _to(P.RUNNING, X.JOURNAL_REBIND)


def _rebind_superseded(p: P, e: Event) -> Decision:
    if e.running_owed:
        return Decision(p, ignored="the answer to an earlier attestation: a later one decides")
    return _to(P.STOPPING, X.SIGNAL_TERM, cause=Result.SUPERSEDED)


def _rebind_fenced(p: P, e: Event) -> Decision:
    if e.running_owed:
        return Decision(p, ignored="the answer to an earlier attestation: a later one decides")
    if e.session_fence:
        if e.sent_from_current:
            return Decision(p, ignored="its session is still current here: the next Welcome attests again")
        return _to(p, X.OWE_ATTEST_RUNNING)
    if e.newer_lease:
        return _to(p, X.OWE_ATTEST_RUNNING)
    if e.report_owed:
        return Decision(p, ignored="another report about it is owed: its answer may keep the process")
    return _to(P.STOPPING, X.SIGNAL_TERM, cause="rebind_fenced")


def _probed(p: P, e: Event) -> Decision:
    fact = e.fact
    if fact == ev.NEVER_LAUNCHED:
        return _to(P.GIVEN_BACK, X.JOURNAL_CLEAR, X.OWE_GIVE_BACK)
    if fact == ev.RUNNING:
        if e.own_records or e.running_owed:  # edge: nothing to re-bind; else the owed one decides
            return _to(P.RUNNING if e.own_records else P.REBINDING, X.ADOPT)
        return _to(P.REBINDING, X.ADOPT, X.OWE_ATTEST_RUNNING)
    if fact in (ev.ENDED_WITH_RECEIPT, ev.ENDED, ev.REBOOTED) or e.own_records:
        return _to(P.EXITED, X.CONSUME)
    if fact == ev.LAUNCH_UNKNOWN:  # maybe spawned, maybe not: never relaunched, never "ended"
        return _to(P.UNDECIDED, X.OWE_ATTEST_LAUNCH_UNKNOWN)
    return _to(P.UNPROBED, X.PROBE_LATER)  # unreadable /proc is not evidence (§10)


def _ask_again(p: P, e: Event) -> Decision:
    if e.report_owed:
        return Decision(p, ignored="its attestation is still owed")
    return _to(p, X.OWE_ATTEST_LAUNCH_UNKNOWN)


def _restarted(_p: P, _e: Event) -> Decision:
    return _to(P.UNPROBED)


# -- the table -------------------------------------------------------------------------------------

_EXIT = _to(P.EXITED, X.RELEASE_SLOT, X.CONSUME)
_GIVE_BACK = _to(P.GIVEN_BACK, X.JOURNAL_CLEAR, X.RELEASE_SLOT, X.OWE_GIVE_BACK)
_FENCED_UNLAUNCHED = _to(P.RELEASED, X.JOURNAL_CLEAR, X.RELEASE_SLOT)  # never will be under this lease
_STOP = _to(P.STOPPING, X.SIGNAL_TERM)
_TIMEOUT = _to(P.STOPPING, X.JOURNAL_TIMEOUT_INTENT, X.SIGNAL_TERM)
_LEASE_STOP = _to(P.STOPPING, X.SIGNAL_TERM, cause="lease_fenced")
NO_PROCESS = "no process of it runs here"
NOT_HELD = "not held here"
DONE = "over for this executor"


# The events by what they are about: a row names the groups (or single events) it ignores, so an
# event added to `EventKind` but to no row and no group is missing from every row (the test fails).
OFFER = (E.ACCEPT, E.OFFER_NOT_WAITED)
ACTIVATION = (E.ACTIVATE_DUE, E.ACTIVATED, E.ACTIVATE_REFUSED)
SPAWN = (E.SPAWNED, E.SPAWN_FAILED)
STARTED = (E.STARTED_APPLIED, E.STARTED_REFUSED)
REBIND = (E.REBIND_APPLIED, E.REBIND_SUPERSEDED, E.REBIND_FENCED)
STOP = (E.STOP_REQUESTED, E.DEADLINE_PASSED, E.LEASE_FENCED)
STOP_TIMERS = (E.TERM_ELAPSED, E.KILL_ELAPSED)
DECLINE = (E.DECLINE_APPLIED, E.DECLINE_REFUSED)
SESSION = (E.NEW_SESSION, E.SESSION_ENDED, E.DRAIN)
ROW = (E.PROBED, E.ASK_AGAIN, E.END_KNOWN)
END = (E.EXITED, E.REPORT_SETTLED)


def _row(answers: Mapping[EventKind, Rule], reason: str, *ignored: EventKind | tuple[EventKind, ...]
         ) -> dict[EventKind, Rule]:
    """A phase's answers, and the events it ignores for `reason` (never filled in: see OFFER...)."""
    row: dict[EventKind, Rule] = dict(answers)
    for item in ignored:
        for kind in item if isinstance(item, tuple) else (item,):
            if kind in row:
                raise ValueError(f"{kind} answered and ignored in one row")
            row[kind] = reason
    return row


def _while_stopping(rule: Callable[[AttemptPhase, Event], Decision]) -> Callable[[AttemptPhase, Event], Decision]:
    """`rule` for a process being stopped: its journal and owed effects, in the same phase, never
    a second stop (a stop is under way)."""
    def stopping(phase: AttemptPhase, event: Event) -> Decision:
        d = rule(phase, event)
        kept = tuple(x for x in d.effects if x not in STOPS)
        return Decision(phase, kept, ignored=d.ignored or ("" if kept else "a stop is under way"))
    return stopping


_ALIVE: dict[EventKind, Rule] = {  # a launched process, not being stopped
    E.NEW_SESSION: _reattest, E.SESSION_ENDED: "keeps running: the next Welcome re-binds it",
    E.STOP_REQUESTED: _STOP, E.DEADLINE_PASSED: _TIMEOUT, E.LEASE_FENCED: _LEASE_STOP,
    E.DRAIN: "keeps running: the journal keeps it for the restart", E.EXITED: _EXIT, E.RESTARTED: _restarted,
    # A stop's timer outlives the Executor instance that began the stop (bridge timers are kept by
    # the actor's name): the new instance, which adopted the launcher, goes on with that stop.
    E.TERM_ELAPSED: _to(P.KILLING, X.SIGNAL_KILL),
    E.KILL_ELAPSED: "stop inconclusive: the launcher's own drain did not end it",
}
_STOPPING: dict[EventKind, Rule] = {
    E.EXITED: _EXIT, E.RESTARTED: _restarted, E.NEW_SESSION: _while_stopping(_reattest),
    E.REBIND_APPLIED: _while_stopping(_rebind_applied), E.REBIND_SUPERSEDED: _while_stopping(_rebind_superseded),
    E.REBIND_FENCED: _while_stopping(_rebind_fenced),
}
_STARTED_ANSWERS: dict[EventKind, Rule] = {E.STARTED_APPLIED: _to(P.RUNNING), E.STARTED_REFUSED: _started_refused}
_UNLAUNCHED_STOPS = (E.STOP_REQUESTED, E.DEADLINE_PASSED)
BUSY = "a stop is under way"

TABLE: dict[AttemptPhase, dict[EventKind, Rule]] = {
    P.OFFERED: _row({E.ACCEPT: _accept, E.OFFER_NOT_WAITED: _not_waited}, "not accepted yet",
                    ACTIVATION, SPAWN, STARTED, REBIND, STOP, STOP_TIMERS, DECLINE, SESSION, ROW, END, E.RESTARTED),
    P.ACTIVATING: _row({
        E.ACTIVATE_DUE: _activate_due, E.ACTIVATED: _activated, E.ACTIVATE_REFUSED: _activate_refused,
        E.NEW_SESSION: _GIVE_BACK, E.SESSION_ENDED: "held: the next Welcome gives it back",
        E.LEASE_FENCED: _FENCED_UNLAUNCHED, E.DRAIN: _to(P.DECLINING, X.OWE_DECLINE), E.RESTARTED: _restarted,
    }, NO_PROCESS, OFFER, SPAWN, STARTED, REBIND, _UNLAUNCHED_STOPS, STOP_TIMERS, DECLINE, ROW, END),
    P.REFUSED: _row({
        E.NEW_SESSION: _GIVE_BACK, E.LEASE_FENCED: _FENCED_UNLAUNCHED, E.RESTARTED: _restarted,
        E.ACTIVATED: "a late answer to an earlier copy: refused since, never launched",
    }, NO_PROCESS, OFFER, E.ACTIVATE_DUE, E.ACTIVATE_REFUSED, SPAWN, STARTED, REBIND, _UNLAUNCHED_STOPS,
        STOP_TIMERS, DECLINE, E.SESSION_ENDED, E.DRAIN, ROW, END),
    P.LAUNCHING: _row({
        E.SPAWNED: _to(P.LAUNCHED, X.JOURNAL_STARTED, X.WATCH, X.OWE_STARTED),
        E.SPAWN_FAILED: _to(P.START_FAILED, X.OWE_START_FAILED, X.JOURNAL_CLEAR, X.RELEASE_SLOT, X.PULL),
        E.RESTARTED: _restarted,
    }, "the spawn is under way in this handler", OFFER, ACTIVATION, STARTED, REBIND, STOP, STOP_TIMERS, DECLINE,
        SESSION, ROW, END),
    P.LAUNCHED: _row({**_ALIVE, **_STARTED_ANSWERS}, "launched: not about this phase",
                     OFFER, ACTIVATION, SPAWN, REBIND, DECLINE, ROW, E.REPORT_SETTLED),
    P.RUNNING: _row({**_ALIVE, **_STARTED_ANSWERS}, "running: not about this phase",
                    OFFER, ACTIVATION, SPAWN, REBIND, DECLINE, ROW, E.REPORT_SETTLED),
    P.REBINDING: _row({
        **_ALIVE, E.LEASE_FENCED: "its renewals are held: the re-bind's answer decides",
        E.REBIND_APPLIED: _rebind_applied, E.REBIND_SUPERSEDED: _rebind_superseded,
        E.REBIND_FENCED: _rebind_fenced,
    }, "a running Attest is owed: its answer decides", OFFER, ACTIVATION, SPAWN, STARTED, DECLINE,
        ROW, E.REPORT_SETTLED),
    P.STOPPING: _row({**_STOPPING, E.TERM_ELAPSED: _to(P.KILLING, X.SIGNAL_KILL)}, BUSY,
                     OFFER, ACTIVATION, SPAWN, STARTED, STOP, E.KILL_ELAPSED, DECLINE, E.SESSION_ENDED, E.DRAIN,
                     ROW, E.REPORT_SETTLED),
    P.KILLING: _row({**_STOPPING, E.KILL_ELAPSED: "stop inconclusive: the launcher's own drain did not end it"},
                    BUSY, OFFER, ACTIVATION, SPAWN, STARTED, STOP, E.TERM_ELAPSED, DECLINE, E.SESSION_ENDED,
                    E.DRAIN, ROW, E.REPORT_SETTLED),
    P.EXITED: _row({E.REPORT_SETTLED: _to(P.REPORTED), E.END_KNOWN: _to(P.EXITED, X.CONSUME),
                    E.RESTARTED: _restarted}, "ended: its receipt decides",
                   OFFER, ACTIVATION, SPAWN, STARTED, REBIND, STOP, STOP_TIMERS, DECLINE, SESSION, E.PROBED,
                   E.ASK_AGAIN, E.EXITED),
    P.REPORTED: _row({}, DONE, OFFER, ACTIVATION, SPAWN, STARTED, REBIND, STOP, STOP_TIMERS, DECLINE, SESSION, ROW,
                     END, E.RESTARTED),
    P.DECLINING: _row({
        E.DECLINE_APPLIED: _FENCED_UNLAUNCHED, E.DECLINE_REFUSED: _to(P.GIVEN_BACK, X.RELEASE_SLOT, X.OWE_GIVE_BACK),
        E.ACTIVATE_REFUSED: _activate_refused, E.NEW_SESSION: _GIVE_BACK, E.LEASE_FENCED: _FENCED_UNLAUNCHED,
        E.RESTARTED: _restarted,
    }, "draining: its Decline's answer decides", OFFER, E.ACTIVATE_DUE, E.ACTIVATED, SPAWN, STARTED, REBIND,
        _UNLAUNCHED_STOPS, STOP_TIMERS, E.SESSION_ENDED, E.DRAIN, ROW, END),
    P.GIVEN_BACK: _row({}, DONE, OFFER, ACTIVATION, SPAWN, STARTED, REBIND, STOP, STOP_TIMERS, DECLINE, SESSION,
                       ROW, END, E.RESTARTED),
    P.START_FAILED: _row({}, DONE, OFFER, ACTIVATION, SPAWN, STARTED, REBIND, STOP, STOP_TIMERS, DECLINE, SESSION,
                         ROW, END, E.RESTARTED),
    P.RELEASED: _row({}, DONE, OFFER, ACTIVATION, SPAWN, STARTED, REBIND, STOP, STOP_TIMERS, DECLINE, SESSION,
                     ROW, END, E.RESTARTED),
    P.UNPROBED: _row({E.PROBED: _probed, E.NEW_SESSION: "every row not held is probed at a Welcome: PROBED decides"},
                     NOT_HELD, OFFER, ACTIVATION, SPAWN, STARTED, REBIND, STOP, STOP_TIMERS, DECLINE, E.SESSION_ENDED,
                     E.DRAIN, E.ASK_AGAIN, E.END_KNOWN, END, E.RESTARTED),
    P.UNDECIDED: _row({E.ASK_AGAIN: _ask_again, E.END_KNOWN: _to(P.EXITED, X.CONSUME),
                       E.NEW_SESSION: _to(P.UNPROBED), E.RESTARTED: _restarted}, NOT_HELD,
                      OFFER, ACTIVATION, SPAWN, STARTED, REBIND, STOP, STOP_TIMERS, DECLINE, E.SESSION_ENDED, E.DRAIN,
                      E.PROBED, END),
}
