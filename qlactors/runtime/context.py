"""Shared: what every actor of a runtime process uses, whichever side it is on: the directory of
actors by name, the fatal switch, and the shared part of the context.

Each side extends it with its own typed context (control/context.py, executor/context.py); edge,
both sides in one process, builds one of each over the same shared part (profiles/edge.py).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import pykka
import zmq

from ..config import Config
from ..store.health import StoreHealth
from ..wire.bridge import Bridge

log = logging.getLogger("qlactors.actors")


class Directory:
    """Current actor refs by name. The Supervisor replaces a ref when it restarts an actor."""

    def __init__(self) -> None:
        self._refs: dict[str, pykka.ActorRef] = {}
        self._lock = threading.Lock()

    def set(self, name: str, ref: pykka.ActorRef | None) -> None:
        with self._lock:
            if ref is None:
                self._refs.pop(name, None)
            else:
                self._refs[name] = ref

    def get(self, name: str) -> pykka.ActorRef | None:
        with self._lock:
            return self._refs.get(name)

    def tell(self, name: str, message: Any) -> bool:
        """Deliver if the actor is alive; False when it is not (it is being restarted, or stopped)."""
        ref = self.get(name)
        if ref is None:
            return False
        try:
            ref.tell(message)
            return True
        except pykka.ActorDeadError:
            return False

    def named(self, name: str) -> "Named":
        return Named(self, name)

    def names(self) -> list[str]:
        with self._lock:
            return list(self._refs)


@dataclass(frozen=True, slots=True)
class Named:
    """A `tell`-able stand-in for whichever actor currently holds a name (used by the bridge)."""

    directory: Directory
    name: str

    def tell(self, message: Any) -> None:
        if not self.directory.tell(self.name, message):
            log.warning("event=undeliverable to=%s message=%s", self.name, type(message).__name__)


@dataclass
class Fatal:
    """Set once when the runtime must stop (an actor kept failing, or the Supervisor died)."""

    event: threading.Event = field(default_factory=threading.Event)
    reason: str = ""
    on_trip: Callable[[], None] | None = None  # wakes whoever waits for the stop (the main thread)

    def trip(self, reason: str) -> None:
        if not self.event.is_set():
            self.reason = reason
            self.event.set()
            if self.on_trip is not None:
                self.on_trip()


@dataclass(kw_only=True)
class SharedContext:
    """Its config, ZeroMQ context, bridge, directory of actors, fatal switch, the health of its
    database, and whether work may be admitted. Every actor (runtime/actor.py) and `watch_store`
    read it; the Supervisor too, with `each_cycle`.

    `admitting` is the one piece of state the two sides share on edge (on a cluster each process
    has its own). Written by the Runner (set once startup recovery is done, or at once where no
    Recovery runs), the Supervisor (cleared on Drain) and the profile's shutdown (cleared); read
    by the Gateway and the Scheduler (control side: no offers, nudges or cron admission before
    startup recovery is done and while draining), by the Executor (executor side: no pulls then),
    and by Recovery and the ReceiptConsumer (whether their start is a restart).
    """

    config: Config
    zmq: zmq.Context
    bridge: Bridge
    directory: Directory
    fatal: Fatal
    admitting: threading.Event
    health: StoreHealth
    """The health of this process's database: the store's (control side, edge) or a worker's journal's."""
    each_cycle: tuple[Callable[[], None], ...] = ()
    """Run by the Supervisor after every cycle (a replica: its allow-list and its row in `status`)."""

    def shared(self) -> dict:
        """The shared part as keyword arguments, to build the other side's context over it (edge)."""
        return {"config": self.config, "zmq": self.zmq, "bridge": self.bridge, "directory": self.directory,
                "fatal": self.fatal, "admitting": self.admitting, "health": self.health,
                "each_cycle": self.each_cycle}
