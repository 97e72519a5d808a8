"""Actors that can be made to fail on demand (breakable) under a real Supervisor; shared by the restart
and restart-during-outage tests."""

from __future__ import annotations

import pykka
import pytest

from qlactors.profiles.edge import ORDER
from qlactors.runtime.supervisor import Supervisor

from actor_harness import WAIT_S, ActorHarness, unique_endpoint, wait_until


class Boom:
    """A test-only message: the actor that receives it raises, as a bug in a handler would."""


@pytest.fixture
def breakable(monkeypatch):
    """Make every runtime actor class (and any restarted instance of it) fail on Boom."""

    def boom(_msg, _peer):
        raise RuntimeError("boom")

    for _name, cls in [*ORDER, ("supervisor", Supervisor)]:
        original = cls.handlers
        monkeypatch.setattr(cls, "handlers", lambda self, original=original: {**original(self), Boom: boom})


class Rig:
    """An executor-side harness with the real Supervisor restarting the children it is given."""

    def __init__(self, h: ActorHarness, peer, names: tuple[str, ...]) -> None:
        self.h, self.peer = h, peer
        classes = dict(ORDER)
        self.factories = {name: (lambda cls=classes[name]: cls.start(h.ctx.side_of(cls))) for name in names}
        self.supervisor = h.start("supervisor", Supervisor, self.factories)

    def fail(self, name: str) -> pykka.ActorRef:
        """Make actor `name` fail for real; returns the instance that replaced it."""
        old = self.h.directory.get(name)
        old.tell(Boom())
        return wait_until(lambda: (ref := self.h.directory.get(name)) is not old and ref is not None
                          and ref.is_alive() and ref, what=f"{name} restarted")

    def close(self) -> None:
        for name in self.h.directory.names():  # restarted instances are not in the harness's list
            ref = self.h.directory.get(name)
            if ref is not None and ref.is_alive():
                ref.stop(timeout=WAIT_S)


@pytest.fixture
def make_rig(tmp_path, breakable):
    made: list[tuple[Rig, ActorHarness]] = []

    def make(*names: str, **runtime: int) -> Rig:
        endpoint = unique_endpoint("exec")
        h = ActorHarness(tmp_path, control_connect=endpoint, **runtime)
        peer = h.router(endpoint)
        h.route_executor_side()
        h.start_bridge()
        h.ctx.admitting.set()
        rig = Rig(h, peer, names)
        made.append((rig, h))
        return rig

    yield make
    for rig, h in made:
        rig.close()
        h.close()
