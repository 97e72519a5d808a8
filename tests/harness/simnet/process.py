"""Process faults (issue 26), test code only: hooks the rig installs by monkeypatching, for one
seed at a time, and removes afterwards.

- **Kill points.** Every write of the worker's Journal (before and after it) and the handling of
  every answer by the worker's actors (before and after it) is a kill point. The rig arms a
  worker with a `KillPlan` (which kind of point, how many of them to let pass); the point that
  fires marks the worker's incarnation dead and blocks its thread for good. From then on every
  kill point, every message handled and every actor started of that incarnation blocks too, so
  nothing more is written to its journal or handled. The rig then severs the worker's links
  (frames in flight to or from it are lost) and stops the runtime without its drain (no Leave,
  no Drain, no owed report settled): the launchers and jobs it spawned keep running as real
  child processes, and a new WorkerRuntime starts on the same state directory.
- **A replica killed between a commit and its answer.** An armed replica's Gateway drops the
  next answer it is about to send (the store call behind it has returned: committed) and every
  frame after it, and the rig restarts that Gateway.
- **A worker's wall clock.** `qlactors.clock.wall_ms` as the executor's modules imported it reads
  the system clock plus the offset of the worker whose actor thread calls it; the rig steps the
  offset back and forward.
- **Stops.** Every stop the Executor begins (`Launching.begin_stop`: a TERM, then a KILL, to the
  job's group by its identity) is recorded with its reason and whether the job's launcher was
  alive when it began.

Which worker a thread belongs to is set when one of the worker's actors starts in it (pykka runs
`on_start` in the actor's own thread), from the actor's state directory.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

# Journal methods that write (each is a kill point before and after it).
JOURNAL_WRITES = ("accept", "rebind", "activated", "timeout_intent", "shipped", "final_offset", "complete",
                  "set_state", "quarantine", "clear", "journal_pull", "clear_pull", "clear_offer", "owe",
                  "settle", "save_session")
KILL_KINDS = ("journal:before", "journal:after", "answer:before", "answer:after")
# The points a seed may name (a point fires when its name starts with the one named; "" is any).
KILL_NAMES = {
    "journal": ("journal.accept", "journal.set_state(launching)", "journal.set_state(started)", "journal.activated",
                "journal.rebind", "journal.owe", "journal.settle", "journal.complete", "journal.clear",
                "journal.save_session", "journal.journal_pull"),
    "answer": ("Welcome", "Offers", "Activated", "Ack(started)", "Ack(completed)", "Attested", "HeartbeatAck",
               "Ack(start_failed)", "Ack(decline)"),
}
# The executor's modules that read the wall clock (each imported `wall_ms` by name).
CLOCK_MODULES = ("registration", "session_policy", "launching", "receipt_consumer", "session_reports",
                 "local_receipts", "disk_reserve")


class SimKilled(Exception):
    """Raised in a dead incarnation's blocked threads when the seed ends, so they finish."""


@dataclass
class KillPlan:
    kind: str  # one of KILL_KINDS
    skip: int  # matching points to let pass first
    name: str = ""  # the point's name starts with it ("": any point of its kind)


@dataclass
class Incarnation:
    """One WorkerRuntime on a worker's state directory, from its start to its kill or stop."""

    number: int
    dead: threading.Event = field(default_factory=threading.Event)
    point: str | None = None  # the kill point that fired


@dataclass
class Stop:
    worker: str
    attempt_id: str
    reason: str
    at_s: float
    alive: bool  # the job's launcher was alive when the stop began


class WorkerHandle:
    """What the hooks know of one worker: its live incarnation, its kill plan, its clock offset."""

    def __init__(self, name: str, home: str, release: threading.Event) -> None:
        self.name, self.home = name, home
        self.incarnation = Incarnation(0)
        self.plan: KillPlan | None = None
        self.fired = threading.Event()
        self.offset_ms = 0
        self._release = release
        self._lock = threading.Lock()

    def new_incarnation(self) -> Incarnation:
        self.incarnation = Incarnation(self.incarnation.number + 1)
        self.fired.clear()
        return self.incarnation

    def arm(self, plan: KillPlan) -> None:
        with self._lock:
            self.plan = plan

    def disarm(self) -> None:
        with self._lock:
            self.plan = None

    def kill_now(self, point: str) -> None:
        with self._lock:
            self.plan = None
            inc = self.incarnation
            if not inc.dead.is_set():
                inc.point = point
                inc.dead.set()
                self.fired.set()

    def at_point(self, inc: Incarnation, kind: str, name: str, actor: Any = None) -> None:
        """A kill point of `inc`: block when it is dead, or when this is the point the plan picked."""
        if not inc.dead.is_set():
            with self._lock:
                plan = self.plan
                if plan is None or plan.kind != kind or inc is not self.incarnation \
                        or not name.startswith(plan.name):
                    return
                if plan.skip > 0:
                    plan.skip -= 1
                    return
                self.plan = None
                inc.point = f"{kind.replace(':', ' ')} {name}"
                inc.dead.set()
                self.fired.set()
        self.block(actor)

    def block(self, actor: Any = None) -> None:
        """This thread is the dead incarnation's: it does nothing more until the seed ends. Then
        the actor ends by SimKilled; its outbox and pidfds are closed here first, since its own
        `_close` would ask the (closed) bridge to unwatch them."""
        self._release.wait()
        for local in list(getattr(actor, "slots", None) or ()):
            if getattr(local, "pidfd", -1) >= 0:
                try:
                    os.close(local.pidfd)
                except OSError:
                    pass
                local.pidfd = -1
        out = getattr(actor, "out", None)
        if out is not None:
            out.close()
            actor.out = None
        raise SimKilled(self.name)


class Hooks:
    """The patches of one seed; `install()` and `remove()` (always, in a finally)."""

    def __init__(self, recorder_alive: Callable[[str], bool]) -> None:
        self.workers: dict[str, WorkerHandle] = {}  # by state directory
        self.release = threading.Event()
        self.tls = threading.local()
        self.stops: list[Stop] = []
        self.replica_armed: dict[int, str] = {}  # id(ctx) -> replica name, armed
        self.replica_fired: list[tuple[str, str]] = []  # (replica, the answer dropped)
        self.replica_kill = threading.Event()
        self.t0 = time.monotonic()
        self._alive = recorder_alive
        self._patched: list[tuple[Any, str, Any, bool]] = []

    # -- what the rig calls ---------------------------------------------------------------------

    def worker(self, name: str, home: str) -> WorkerHandle:
        handle = WorkerHandle(name, home, self.release)
        self.workers[home] = handle
        return handle

    def current(self) -> tuple[WorkerHandle, Incarnation] | None:
        return getattr(self.tls, "worker", None)

    def worker_name(self) -> str:
        cur = self.current()
        return cur[0].name if cur else ""

    def install(self) -> None:
        from qlactors.control.gateway import Gateway
        from qlactors.executor import launching
        from qlactors.executor.executor import Executor
        from qlactors.executor.journal.journal import Journal
        from qlactors.executor.log_sender import LogSender
        from qlactors.executor.receipt_consumer import ReceiptConsumer
        import importlib

        hooks = self
        for name in JOURNAL_WRITES:
            self._patch(Journal, name, self._journal_write(name, getattr(Journal, name)))
        for cls in (Executor, ReceiptConsumer, LogSender):
            self._patch(cls, "on_start", self._on_start(cls.on_start))
            self._patch(cls, "on_receive", self._on_receive(cls.on_receive))
        real_begin_stop = launching.Launching.begin_stop

        def begin_stop(self_, local, reason):
            cur = hooks.current()
            hooks.stops.append(Stop(cur[0].name if cur else "", local.attempt_id, str(reason),
                                    time.monotonic() - hooks.t0, hooks._alive(local.attempt_id)))
            return real_begin_stop(self_, local, reason)
        self._patch(launching.Launching, "begin_stop", begin_stop)
        real_to_peer = Gateway._to_peer

        def to_peer(self_, peer, message):
            if getattr(self_, "_simnet_dead", False):
                return  # a killed replica sends nothing more
            name = hooks.replica_armed.pop(id(self_.ctx), None)
            if name is not None and getattr(message, "answer_to", ""):
                self_._simnet_dead = True
                hooks.replica_fired.append((name, type(message).__name__))
                hooks.replica_kill.set()
                return
            if name is not None:
                hooks.replica_armed[id(self_.ctx)] = name  # not an answer: still armed
            return real_to_peer(self_, peer, message)
        self._patch(Gateway, "_to_peer", to_peer)
        from qlactors import clock

        def wall_ms() -> int:
            cur = hooks.current()
            return clock.wall_ms() + (cur[0].offset_ms if cur else 0)
        for mod in CLOCK_MODULES:
            module = importlib.import_module(f"qlactors.executor.{mod}")
            if hasattr(module, "wall_ms"):
                self._patch(module, "wall_ms", wall_ms)

    def remove(self) -> None:
        """Undo every patch, and let every blocked thread of a dead incarnation finish."""
        self.release.set()
        for obj, name, original, own in reversed(self._patched):
            if own:
                setattr(obj, name, original)
            else:
                delattr(obj, name)
        self._patched.clear()

    # -- the patches ------------------------------------------------------------------------------

    def _patch(self, obj: Any, name: str, new: Any) -> None:
        own = name in vars(obj)
        self._patched.append((obj, name, vars(obj)[name] if own else None, own))
        setattr(obj, name, new)

    def _on_start(self, real):
        hooks = self

        def on_start(self_):
            handle = hooks.workers.get(str(self_.ctx.config.home))
            if handle is not None:
                inc = handle.incarnation
                hooks.tls.worker = (handle, inc)
                hooks.tls.actor = self_
                if inc.dead.is_set():
                    handle.block(self_)
            return real(self_)
        return on_start

    def _on_receive(self, real):
        hooks = self

        def on_receive(self_, message):
            cur = hooks.current()
            if cur is None:
                return real(self_, message)
            handle, inc = cur
            if inc.dead.is_set():
                handle.block(self_)
            inner = getattr(message, "message", None)
            answer = getattr(inner, "answer_to", "") if inner is not None else ""
            if not answer:
                return real(self_, message)
            what = type(inner).__name__ + (f"({inner.of})" if hasattr(inner, "of") else "")
            handle.at_point(inc, "answer:before", what, self_)
            out = real(self_, message)
            handle.at_point(inc, "answer:after", what, self_)
            return out
        return on_receive

    def _journal_write(self, name: str, real):
        hooks = self

        def write(self_, *args, **kwargs):
            cur = hooks.current()
            if cur is None:
                return real(self_, *args, **kwargs)
            handle, inc = cur
            what = f"journal.{name}" + (f"({args[1]})" if name in ("set_state", "owe") and len(args) > 1 else "")
            actor = getattr(hooks.tls, "actor", None)
            handle.at_point(inc, "journal:before", what, actor)
            out = real(self_, *args, **kwargs)
            handle.at_point(inc, "journal:after", what, actor)
            return out
        return write
