"""The executor's attempt machine (executor/attempt.py), pure: its table answers every phase ×
event pair, chosen rows hold what SEMANTICS.md §9-§10 and issue 26 ask, and random sequences of
events — restarts, new sessions, lost, late and repeated answers included — never spawn twice,
never stop a process while a report that could keep it is owed, and end a healthy job with its
own exit. The world below stands for what the Executor reads from its owners (journal, owed rows,
/proc) before it asks `decide`."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qlactors.executor import evidence as ev
from qlactors.executor.attempt import (LIVE, TABLE, TERMINAL, AttemptPhase, Decision, Effect, Event, EventKind,
                                       decide)

P, E, X = AttemptPhase, EventKind, Effect

FACT_VARIANTS = [dict(), dict(draining=True), dict(session_open=False), dict(same_lease=False),
                 dict(running_owed=True), dict(report_owed=True), dict(session_fence=True),
                 dict(session_fence=True, sent_from_current=False), dict(newer_lease=True),
                 dict(lease_current=False), dict(pair_known=True), dict(own_records=True)] + [
    dict(fact=f) for f in ev.FACTS] + [dict(fact=ev.RUNNING, running_owed=True), dict(fact=ev.RUNNING, own_records=True)]


def test_every_phase_answers_every_event():
    assert set(TABLE) == set(AttemptPhase)
    for phase, row in TABLE.items():
        assert set(row) == set(EventKind), f"{phase}: no answer for {set(EventKind) - set(row)}"


@pytest.mark.parametrize("phase", list(AttemptPhase))
def test_every_answer_is_a_decision_and_terminal_phases_do_nothing(phase):
    for kind in EventKind:
        for facts in FACT_VARIANTS:
            d = decide(phase, Event(kind, **facts))
            assert isinstance(d, Decision) and isinstance(d.phase, AttemptPhase)
            assert all(isinstance(x, Effect) for x in d.effects)
            if phase in TERMINAL:
                assert d == Decision(phase, ignored=d.ignored) and d.ignored
            if X.SIGNAL_TERM in d.effects or X.SIGNAL_KILL in d.effects:
                assert phase in LIVE, (phase, kind)
            if X.SPAWN in d.effects:
                assert (phase, kind) == (P.ACTIVATING, E.ACTIVATED)
                assert d.effects.index(X.JOURNAL_LAUNCHING) < d.effects.index(X.SPAWN)


def test_a_restart_forgets_every_held_phase_and_its_probe_decides():
    for phase in AttemptPhase:
        d = decide(phase, Event(E.RESTARTED))
        kept = phase in TERMINAL or phase in (P.UNPROBED, P.OFFERED)  # OFFERED: nothing journalled to forget
        assert d.phase is (phase if kept else P.UNPROBED)
    assert decide(P.UNPROBED, Event(E.PROBED, fact=ev.NEVER_LAUNCHED)).effects == (X.JOURNAL_CLEAR, X.OWE_GIVE_BACK)
    assert decide(P.UNPROBED, Event(E.PROBED, fact=ev.RUNNING)) == Decision(
        P.REBINDING, (X.ADOPT, X.OWE_ATTEST_RUNNING))
    assert decide(P.UNPROBED, Event(E.PROBED, fact=ev.RUNNING, running_owed=True)) == Decision(
        P.REBINDING, (X.ADOPT,))  # issue 26: the owed Attest is re-sent unchanged, never a second one
    assert decide(P.UNPROBED, Event(E.PROBED, fact=ev.LAUNCH_UNKNOWN)).phase is P.UNDECIDED
    assert decide(P.UNPROBED, Event(E.PROBED, fact=ev.UNREADABLE)) == Decision(P.UNPROBED, (X.PROBE_LATER,))


def test_a_rebind_refusal_stops_only_when_nothing_could_keep_the_process():
    fenced = Event(E.REBIND_FENCED)
    assert decide(P.REBINDING, fenced).effects == (X.SIGNAL_TERM,)
    for keeps in (dict(running_owed=True), dict(report_owed=True), dict(session_fence=True)):
        assert X.SIGNAL_TERM not in decide(P.REBINDING, Event(E.REBIND_FENCED, **keeps)).effects, keeps
    assert decide(P.REBINDING, Event(E.REBIND_FENCED, session_fence=True, sent_from_current=False)).effects == (
        X.OWE_ATTEST_RUNNING,)
    assert decide(P.REBINDING, Event(E.STARTED_REFUSED)).effects == ()
    assert decide(P.STOPPING, Event(E.REBIND_SUPERSEDED)) == Decision(P.STOPPING, ignored="a stop is under way")


def test_a_stop_timer_that_outlived_the_executor_instance_goes_on_with_the_stop():
    """The bridge keeps a stop's timer by the actor's name: a restarted Executor (memory gone, the
    launcher adopted: RUNNING) gets the TERM grace's end and sends the KILL the stop was heading to
    (tests/runtime/test_actor_restarts.py, mid-stop)."""
    for phase in (P.LAUNCHED, P.RUNNING, P.REBINDING):
        assert decide(phase, Event(E.TERM_ELAPSED)) == Decision(P.KILLING, (X.SIGNAL_KILL,))
        assert decide(phase, Event(E.KILL_ELAPSED)).effects == ()


# -- random sequences ----------------------------------------------------------------------------

class _Crash(Exception):
    pass


@dataclass
class World:
    """One attempt, the worker around it and a control side that answers what is owed."""

    hostile: bool
    phase: AttemptPhase = P.OFFERED
    journal: str = ""  # "", accepted, launching, started, cleared
    process: str = "none"  # none, running, exited
    stopped_by: str = "exit"
    spawns: int = 0
    signals: list[str] = field(default_factory=list)
    owed: list[list] = field(default_factory=list)  # [kind, session sent from, generation quoted, stored answer]
    store_gen: int = 1  # the lease generation the control side holds
    lease_gen: int = 1  # ... and the one the worker's journal holds
    session: int = 1  # the worker's current session
    store_session: int = 1  # the session the control side holds current
    lease_session: int = 1
    draining: bool = False
    final: str | None = None
    queue: list[Event] = field(default_factory=list)
    crash_in: int | None = None  # the process dies after this many more effects (a `crash` step)

    def kinds(self) -> list[str]:
        return [o[0] for o in self.owed]

    def feed(self, event: Event) -> None:
        self.queue.append(event)
        while self.queue:
            self._step(self.queue.pop(0))

    def _step(self, event: Event) -> None:
        d = decide(self.phase, event)
        if d.stop_cause:  # the machine stops the job on its own: nothing owed may keep it
            assert "attest_running" not in self.kinds(), (self.phase, event, self.owed)
            if d.stop_cause == "rebind_fenced":
                assert not self.owed, (self.phase, event, self.owed)
        self.phase = d.phase
        for effect in d.effects:
            self._apply(effect)
            if self.crash_in is not None:
                self.crash_in -= 1
                if self.crash_in <= 0:
                    raise _Crash(effect)

    def _apply(self, x: Effect) -> None:
        if x is X.JOURNAL_ACCEPT:
            self.journal, self.lease_session = "accepted", self.session
        elif x is X.JOURNAL_LAUNCHING:
            self.journal = "launching"
        elif x is X.SPAWN:
            assert self.spawns == 0 and self.process == "none", "a second spawn of one attempt"
            self.spawns, self.process = 1, "running"
            self.queue.append(Event(E.SPAWNED))
        elif x is X.JOURNAL_STARTED:
            self.journal = "started"
        elif x is X.JOURNAL_CLEAR:
            self.journal = "cleared"
        elif x.name.startswith("OWE_"):
            kind = x.name[4:].lower()
            assert kind != "give_back" or self.spawns == 0, "never_launched said of a spawned attempt"
            self.owed.append([kind, self.lease_session if kind == "started" else self.session, self.lease_gen, None])
        elif x in (X.SIGNAL_TERM, X.SIGNAL_KILL):
            self.signals.append(x.name)
            if self.process == "running":
                self.stopped_by = "term"
        elif x is X.ADOPT and self.process != "running":
            self.queue.append(Event(E.EXITED))
        elif x is X.CONSUME:
            assert self.process == "exited"
            self.final = self.stopped_by

    def fact(self) -> str:
        if self.journal == "accepted":
            return ev.NEVER_LAUNCHED
        if self.journal == "launching" and self.process == "none":
            return ev.LAUNCH_UNKNOWN
        return ev.RUNNING if self.process == "running" else ev.ENDED_WITH_RECEIPT

    # -- what happens around the attempt --------------------------------------------------------

    def answer(self, i: int, verdict: int) -> None:
        if not self.owed:
            return
        report = self.owed[i % len(self.owed)]
        kind, sent, quoted, stored = report
        if kind == "attest_running" and stored is None and verdict % 4 == 3 and sent == self.store_session \
                and quoted == self.store_gen:
            self.store_gen += 1  # committed by the control side, its answer lost: a repeat gets it
            report[3] = ("applied", self.store_gen)
            return
        self.owed.remove(report)
        ended = sent != self.store_session
        running_owed = "attest_running" in self.kinds()
        if kind == "started":
            if not ended and self.hostile and verdict % 3 == 0:
                self.feed(Event(E.STARTED_REFUSED, same_lease=sent == self.lease_session))
            elif not ended:
                self.feed(Event(E.STARTED_APPLIED))
        elif kind == "attest_running":
            common = dict(running_owed=running_owed, report_owed=bool(self.owed))
            if stored is not None:
                self.lease_session, self.lease_gen = sent, stored[1]
                self.feed(Event(E.REBIND_APPLIED, lease_current=sent == self.session, **common))
            elif ended:
                self.feed(Event(E.REBIND_FENCED, session_fence=True, sent_from_current=sent == self.session,
                                **common))
            elif quoted != self.store_gen:  # the lease quoted is not the worker's any more
                self.feed(Event(E.REBIND_FENCED, newer_lease=self.lease_gen != quoted, **common))
            elif self.hostile and verdict % 3 == 1:
                self.feed(Event(E.REBIND_SUPERSEDED, **common))
            elif self.hostile and verdict % 3 == 2:
                self.feed(Event(E.REBIND_FENCED, **common))
            else:
                self.store_gen += 1
                self.lease_session, self.lease_gen = sent, self.store_gen
                self.feed(Event(E.REBIND_APPLIED, lease_current=sent == self.session, **common))

    def new_session(self) -> None:
        self.store_session += 1
        self.session = self.store_session
        self.feed(Event(E.SESSION_ENDED))
        if self.lease_session != self.session or self.phase in (P.UNPROBED, P.UNDECIDED):
            self.feed(Event(E.NEW_SESSION, running_owed="attest_running" in self.kinds(), draining=self.draining))
        if self.phase is P.UNPROBED and self.journal in ("accepted", "launching", "started"):
            self.feed(Event(E.PROBED, fact=self.fact(), running_owed="attest_running" in self.kinds()))

    def restart(self) -> None:
        self.feed(Event(E.RESTARTED))
        self.draining = False
        self.new_session()

    def exit(self) -> None:
        if self.process == "running":
            self.process = "exited"
            if self.phase in LIVE:
                self.feed(Event(E.EXITED))

    def step(self, name: str, a: int, b: int) -> None:
        try:
            self._do(name, a, b)
        except _Crash:  # between two effects: what was journalled and owed stays, memory goes
            self.queue.clear()
            self.crash_in = None
            self.restart()

    def _do(self, name: str, a: int, b: int) -> None:
        if name == "crash":
            self.crash_in = a % 4 + 1
        elif name == "accept":
            self.feed(Event(E.ACCEPT, draining=self.draining))
        elif name == "activated":
            self.feed(Event(E.ACTIVATED, draining=self.draining))
        elif name == "activate_due":
            self.feed(Event(E.ACTIVATE_DUE, draining=self.draining))
        elif name == "answer":
            self.answer(a, b)
        elif name == "new_session":
            self.new_session()
        elif name == "restart":
            self.restart()
        elif name == "exit":
            self.exit()
        elif name == "ask_again":
            self.feed(Event(E.ASK_AGAIN, report_owed=bool(self.owed)))
        elif name == "stop":
            self.feed(Event([E.STOP_REQUESTED, E.LEASE_FENCED, E.DEADLINE_PASSED][a % 3]))
        elif name == "drain":
            self.draining = True
            self.feed(Event(E.DRAIN))


HEALTHY = ["accept", "activated", "activate_due", "answer", "answer", "new_session", "restart", "exit",
           "ask_again", "crash"]
STEP = st.tuples(st.sampled_from(HEALTHY + ["stop", "drain"]), st.integers(0, 9), st.integers(0, 9))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(HEALTHY), st.integers(0, 9), st.integers(0, 9)), max_size=40))
def test_a_healthy_job_is_never_stopped_and_ends_with_its_own_exit(steps):
    """No stop asked, no lease taken away: restarts, new sessions and lost or late answers never
    make the machine signal the job, and the report it ends with is the job's own exit."""
    w = World(hostile=False)
    for name, a, b in [("accept", 0, 0)] + steps:
        w.step(name, a, b)
    assert w.signals == []
    assert w.spawns <= 1
    w.crash_in = None
    w.exit()
    if w.phase in (P.UNPROBED, P.UNDECIDED):
        w.restart()  # its probe finds it ended
    if w.spawns:
        assert w.final == "exit", (w.phase, w.journal)


@settings(max_examples=600, deadline=None)
@given(st.lists(STEP, max_size=30))
def test_never_two_spawns_nor_a_stop_while_a_report_could_keep_the_process(steps):
    """Refusals, supersessions, fences, stops and drains as well: one spawn at most, and the
    machine's own stops only when no owed report could keep the process (World._step)."""
    w = World(hostile=True)
    for name, a, b in [("accept", 0, 0)] + steps:
        w.step(name, a, b)
    assert w.spawns <= 1


# -- the table in docs/architecture.md -----------------------------------------------------------

DOC = "docs/architecture.md"
BEGIN, END_MARK = "<!-- attempt-table:begin -->", "<!-- attempt-table:end -->"


def render_table() -> str:
    """Every answered pair (ignored pairs left out), each outcome its facts can give."""
    lines = ["| phase | event | next phase: effects |", "| --- | --- | --- |"]
    for phase, row in TABLE.items():
        for kind in EventKind:
            outcomes: list[str] = []
            for facts in FACT_VARIANTS:
                d = decide(phase, Event(kind, **facts))
                if d.ignored and not d.effects and d.phase is phase:
                    continue
                text = d.phase.value + (": " + ", ".join(x.value for x in d.effects) if d.effects else "")
                if text not in outcomes:
                    outcomes.append(text)
            if outcomes:
                lines.append(f"| {phase.value} | {kind.value} | {' / '.join(outcomes)} |")
    return "\n".join(lines)


def test_the_documented_table_is_the_machine():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / DOC).read_text()
    documented = text.split(BEGIN, 1)[1].split(END_MARK, 1)[0].strip()
    assert documented == render_table(), (
        f"{DOC} between {BEGIN} and {END_MARK} should read:\n{render_table()}")
