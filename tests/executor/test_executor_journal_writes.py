"""What one launch costs the executor's journal (issue 27: the attempt machine journals a phase
change before its effect wherever a restart could not re-derive it, and no more often than the
code before it did; the edge-cost issue wants fewer). Counted on the Executor with the real
ReceiptConsumer and store, one job from its offer to its cleared row; docs/recovery.md lists what
each write covers."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from qlactors.wire import messages as m

from actor_harness import wait_until
from actor_rigs import make_exe, spec  # noqa: F401 - fixtures


class CountingStore:
    """The journal's store, counting its write transactions by the journal method that opened each."""

    def __init__(self, store: Any) -> None:
        self._store, self.writes = store, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    @contextmanager
    def write(self, **kw: Any) -> Iterator[Any]:
        import traceback
        self.writes.append(traceback.extract_stack(limit=3)[0].name)
        with self._store.write(**kw) as conn:
            yield conn


def test_a_launch_costs_the_journal_six_commits_each_of_which_a_restart_needs(make_exe):
    rig = make_exe()
    journal = rig.ctx.executor_side.journal
    pull = rig.welcome()
    journal.store = counting = CountingStore(journal.store)
    rig.repo.tasks.add(spec("job", ["/bin/sh", "-c", "exit 0"]), actor_name="tester")
    rig.repo.runs.request("job")
    offer = rig.offer_for(pull)
    rig.send_offers(pull, offer)
    rig.activate(rig.peer.expect(m.Activate))
    started = rig.peer.expect(m.Started)
    rig.ack_started(started)
    rig.ack_completed(rig.peer.expect(m.Completed, strict=False))
    wait_until(lambda: journal.get(offer.attempt_id) is None, what="its row cleared")
    # accepted (a restart gives it back), launching before the spawn (never spawned twice),
    # started with the identity (adopted), the Started owed and settled, the row cleared last.
    assert counting.writes == ["accept", "set_state", "set_state", "owe", "settle", "clear"]
