"""The actor-level rigs: each actor started alone with the real store, a test peer on its real ZeroMQ
endpoint (SupervisorRig, ExecutorRig, ReceiptRig, Flights) and their fixtures; they stand on
tests/harness/actor_harness.py."""

from __future__ import annotations

import os
import secrets
import time
from typing import Any

import msgpack
import pytest

from qlactors.control.gateway import Gateway, fence_of
from qlactors.domain.model import Command, TaskSpec
from qlactors.domain.receipt import Receipt, encode_receipt, token_hash
from qlactors.executor.executor import Executor
from qlactors.executor.receipt_consumer import ReceiptConsumer
from qlactors.ids import new_id
from qlactors.process.identity import read_boot_id
from qlactors.runtime.signals import StepDone, StepRequest
from qlactors.runtime.supervisor import Supervisor
from qlactors.store.dispatch.dispatch import Dispatch
from qlactors.store.records import Fence
from qlactors.wire import messages as m
from qlactors.wire.offers import offer_record

from actor_harness import (
    ActorHarness, ack_message, offers_message, register_message, unique_endpoint, welcome_message,
)


BOOT_ID = read_boot_id()


def spec(name: str = "job", words: list[str] | None = None, **kw: Any) -> TaskSpec:
    return TaskSpec(name=name, command=Command.from_words(words or ["echo", "hi"]), **kw)


def _body(**fields: Any) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


def new_token() -> str:
    return secrets.token_urlsafe(32)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class SupervisorRig:
    """The Gateway and the Supervisor under test, their peer (a DEALER playing an executor) and
    the harness; `ref` is the Gateway, which answers every report."""

    def __init__(self, h: ActorHarness, ref, peer, supervisor) -> None:
        self.h, self.ref, self.peer, self.supervisor = h, ref, peer, supervisor

    @property
    def session(self):
        return self.h.ctx.executor_side.session

    @property
    def repo(self):
        return self.h.repo

    def register(self, **kw: Any) -> m.Welcome:
        self.peer.send(register_message(self.session.worker_id, BOOT_ID, **kw))
        return self.peer.expect(m.Welcome)

    def pull_message(self, slots: int = 1, pairs: list[tuple[str, str]] | None = None, **kw: Any) -> m.Pull:
        """A Pull with `pairs` (offer id, lease token), or `slots` fresh ones."""
        if pairs is None:
            pairs = [(secrets.token_hex(8), new_token()) for _ in range(slots)]
        s = self.session
        fields = dict(worker_id=s.worker_id, session_id=s.session_id, session_generation=s.generation,
                      pull_id=secrets.token_hex(8),
                      offers=[m.OfferSlot(offer_id=o, lease_token=t) for o, t in pairs])
        fields.update(kw)
        fields.setdefault("request_id", fields["pull_id"])
        return m.Pull(**fields)

    def pull(self, offer_id: str | None = None, lease_token: str | None = None, **kw: Any) -> tuple[Any, str, str]:
        """One pair asked for: (the answer, its offer id, its lease token)."""
        offer_id = offer_id or secrets.token_hex(8)
        lease_token = lease_token or new_token()
        self.peer.send(self.pull_message(pairs=[(offer_id, lease_token)], **kw))
        return self.peer.recv(), offer_id, lease_token

    def no_offers(self, pull_id: str) -> m.Offers:
        """The answer to a Pull of this session when there is nothing to offer."""
        s = self.session
        return m.Offers(answer_to=pull_id, worker_id=s.worker_id, session_id=s.session_id, session_generation=s.generation,
                        pull_id=pull_id, offers=[])

    def fence(self, offer: m.Offer, token_of_lease: str, **kw: Any) -> dict[str, Any]:
        s = self.session
        fence = dict(worker_id=s.worker_id, session_id=s.session_id,
                     session_generation=s.generation, run_id=offer.run_id,
                     attempt_id=offer.attempt_id, offer_id=offer.offer_id,
                     lease_generation=offer.lease_generation, lease_token=token_of_lease,
                     lease_version=offer.lease_version)
        fence.update(kw)
        return fence

    def offered(self, name: str = "job", **task: Any) -> tuple[m.Offer, str]:
        """A task, a queued run and a real offer for it; (offer, lease token)."""
        self.repo.tasks.add(spec(name, **task), actor_name="tester")
        self.repo.runs.request(name)
        answer, _, lease_token = self.pull()
        assert isinstance(answer, m.Offers) and len(answer.offers) == 1, answer
        return answer.offers[0], lease_token

    def activated(self, name: str = "job", **task: Any) -> tuple[m.Offer, str, str, m.Activated]:
        """(offer, lease token, callback token, Activated) of an attempt now `starting`."""
        offer, lease_token = self.offered(name, **task)
        token = new_token()
        self.peer.send(m.Activate(request_id=new_id(), **self.fence(offer, lease_token), callback_token_hash=token_hash(token),
                                  log_artifact_id="ab/attempt.log"))
        return offer, lease_token, token, self.peer.expect(m.Activated)

    def started(self, offer: m.Offer, lease_token: str, activated: m.Activated, pid: int = 4242) -> m.Ack:
        self.peer.send(m.Started(request_id=new_id(), **self.fence(offer, lease_token, lease_version=activated.lease_version),
                                 boot_id=BOOT_ID, pid=pid, pgid=pid, start_ticks=99))
        return self.peer.expect(m.Ack)

    def completed(self, offer: m.Offer, token: str, exit_code: int = 0, **kw: Any) -> m.Ack:
        s = self.session
        fields = dict(worker_id=s.worker_id, session_id=s.session_id, session_generation=s.generation,
                      run_id=offer.run_id, attempt_id=offer.attempt_id, schema_version=1,
                      callback_sequence=1, token=token, started_at_ms=now_ms() - 5,
                      finished_at_ms=now_ms(), exit_code=exit_code, log_dropped_bytes=0)
        fields.update(kw)
        self.peer.send(m.Completed(request_id=new_id(), **fields))
        ack = self.peer.expect(m.Ack)
        if ack.result in ("applied", "already_terminal"):  # a freed slot: the executor pulls again
            self.peer.expect(m.Nudge)
        return ack

    def alive(self) -> bool:
        return self.ref.is_alive() and not self.h.ctx.fatal.event.is_set()


def start_supervised_gateway(h: ActorHarness, endpoint: str) -> SupervisorRig:
    """The real Gateway and Supervisor in `h` (bound at `endpoint`), Recovery and the Scheduler
    stubbed, admission open, and a worker's socket connected."""
    h.bridge.route_control(h.directory.named("gateway"))
    h.stub("recovery")
    h.stub("scheduler")
    h.start_bridge()
    h.ctx.admitting.set()
    supervisor = h.start("supervisor", Supervisor, {})
    ref = h.start("gateway", Gateway)
    return SupervisorRig(h, ref, h.dealer(endpoint), supervisor)


@pytest.fixture
def sup(tmp_path, store_url):
    """The Gateway and the Supervisor on SQLite and on PostgreSQL (the cluster's face too)."""
    endpoint = unique_endpoint("control")
    h = ActorHarness(tmp_path, control_bind=endpoint, database_url=store_url)
    try:
        yield start_supervised_gateway(h, endpoint)
    finally:
        h.close()


class ExecutorRig:
    """The Executor under test and a peer that plays the control side with the real store.

    The peer answers with what the Supervisor would: genuine leases, activations and completions
    made through Dispatch and CompletionService, so every id and fence is real.
    """

    def __init__(self, h: ActorHarness, ref, peer, register: m.Register) -> None:
        self.h, self.ref, self.peer, self.register = h, ref, peer, register

    @property
    def repo(self):
        return self.h.repo

    @property
    def ctx(self):
        return self.h.ctx

    def welcome(self) -> m.Pull:
        self.peer.send(welcome_message(self.ctx.executor_side.session))
        return self.peer.expect(m.Pull)

    def offer_for(self, pull: m.Pull, slot: int = 0) -> m.Offer:
        """A genuine lease of the next queued run, taken with the `slot`-th pair of `pull`."""
        pair = pull.offers[slot]
        view = self.ctx.control_side.dispatch.offers.one(pull.worker_id, pull.session_id, pull.session_generation, pair.offer_id,
                                       token_hash(pair.lease_token),
                                       log_cap_bytes=self.h.config.runtime.log_cap_bytes)
        assert view is not None, "no queued run to offer"
        return offer_record(view)

    def send_offers(self, pull: m.Pull, *offers: m.Offer) -> None:
        """Answer `pull` with `offers` (none: nothing to do now)."""
        self.peer.send(offers_message(pull, *offers))

    def activate(self, act: m.Activate) -> m.Activated:
        result = self.ctx.control_side.dispatch.reports.activate(fence_of(act, act.worker_id), act.callback_token_hash, act.log_artifact_id)
        assert result.result == "applied", result
        activated = m.Activated(answer_to=act.request_id, run_id=act.run_id, attempt_id=act.attempt_id, offer_id=act.offer_id,
                                lease_version=result.value.lease_version, deadline_at_ms=result.value.deadline_at_ms)
        self.peer.send(activated)
        return activated

    def ack_started(self, started: m.Started) -> None:
        outcome = self.ctx.control_side.dispatch.reports.started(fence_of(started, started.worker_id), started.boot_id, started.pid, started.pgid,
                                            started.start_ticks)
        assert outcome.result == "applied", outcome
        self.peer.send(ack_message("started", started.run_id, started.attempt_id, "applied",
                                   offer_id=started.offer_id, answer_to=started.request_id))

    def ack_completed(self, completed: m.Completed) -> str:
        receipt = Receipt(schema_version=completed.schema_version, run_id=completed.run_id,
                          attempt_id=completed.attempt_id, callback_sequence=completed.callback_sequence,
                          token=completed.token, started_at_ms=completed.started_at_ms,
                          finished_at_ms=completed.finished_at_ms, exit_code=completed.exit_code)
        # As the Gateway does: what the executor sent the group decides a stop's outcome (a job its
        # TERM killed within the cancel's clock tick is still `cancelled`).
        outcome = self.ctx.control_side.completion.complete(completed.run_id, completed.attempt_id, receipt,
                                               completed.log_dropped_bytes, completed.stopped_by)
        self.peer.send(ack_message("completed", completed.run_id, completed.attempt_id, outcome.result,
                                   outcome.detail or ""))
        return outcome.result

    def launch(self, words: list[str], **task: Any) -> tuple[m.Offer, m.Activate, m.Started]:
        """Welcome, a queued run of a new task, Offer, Activate, Activated: the launcher runs."""
        pull = self.welcome()
        self.repo.tasks.add(spec("job", words, **task), actor_name="tester")
        self.repo.runs.request("job")
        offer = self.offer_for(pull)
        self.send_offers(pull, offer)
        act = self.peer.expect(m.Activate)
        self.activate(act)
        started = self.peer.expect(m.Started)
        self.h.track_group(started.pgid)
        return offer, act, started

    def alive(self) -> bool:
        return self.ref.is_alive()


@pytest.fixture
def make_exe(tmp_path):
    """start(before=fn(h)) -> ExecutorRig: the real Executor (and by default the real ReceiptConsumer)."""
    harnesses: list[ActorHarness] = []

    def start(*, before=None, real_receipts: bool = True, slots: int = 1) -> ExecutorRig:
        endpoint = unique_endpoint("exec")
        h = ActorHarness(tmp_path, control_connect=endpoint, slots=slots)
        harnesses.append(h)
        peer = h.router(endpoint)  # bind before the bridge connects
        h.route_executor_side()
        h.stub("supervisor")
        h.start_bridge()
        h.ctx.admitting.set()
        if before is not None:
            before(h)
        if real_receipts:
            h.start("receipts", ReceiptConsumer)
        else:
            h.stub("receipts")
        ref = h.start("executor", Executor)
        register = peer.expect(m.Register)
        return ExecutorRig(h, ref, peer, register)

    yield start
    for h in harnesses:
        h.close()


class ReceiptRig:
    def __init__(self, h: ActorHarness, ref, peer) -> None:
        self.h, self.ref, self.peer = h, ref, peer
        self._tasks = 0

    @property
    def ctx(self):
        return self.h.ctx

    def journalled_attempt(self, token: str) -> tuple[str, str]:
        """A real attempt activated with `token`'s hash, and its executor journal row (`started`)."""
        self._tasks += 1
        name = f"job{self._tasks}"
        self.h.repo.tasks.add(spec(name), actor_name="tester")
        run_id = self.h.repo.runs.request(name).run.id
        s = self.ctx.executor_side.session
        lease_hash = token_hash(new_token())
        view = self.ctx.control_side.dispatch.offers.one(s.worker_id, s.session_id, s.generation, secrets.token_hex(8), lease_hash,
                                       log_cap_bytes=0)
        assert view.run_id == run_id
        assert self.ctx.control_side.dispatch.reports.activate(view.fence(lease_hash), token_hash(token), "ab/x.log").result == "applied"
        attempt_id = view.attempt_id
        self.ctx.executor_side.journal.accept(attempt_id, run_id, str(self.ctx.executor_side.logs.path_for(run_id, attempt_id)),
                                str(self.ctx.executor_side.receipts.final_path(attempt_id)), token_hash(token))
        self.ctx.executor_side.journal.set_state(attempt_id, "started")
        return run_id, attempt_id

    def plant(self, run_id: str, attempt_id: str, token: str, exit_code: int = 0, data: bytes | None = None):
        if data is None:
            data = encode_receipt(Receipt(schema_version=1, run_id=run_id, attempt_id=attempt_id,
                                          callback_sequence=1, token=token, started_at_ms=now_ms() - 10,
                                          finished_at_ms=now_ms(), exit_code=exit_code))
        self.ctx.executor_side.receipts.shard_dir(attempt_id)
        path = self.ctx.executor_side.receipts.final_path(attempt_id)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        return path

    def answer(self, completed: m.Completed, result: str | None = None, detail: str = "") -> str:
        """Answer as the Supervisor would (the real CompletionService, its refusal's reason as the
        detail), or with a forced `result` and `detail`."""
        if result is None:
            receipt = Receipt(schema_version=completed.schema_version, run_id=completed.run_id,
                              attempt_id=completed.attempt_id, callback_sequence=completed.callback_sequence,
                              token=completed.token, started_at_ms=completed.started_at_ms,
                              finished_at_ms=completed.finished_at_ms, exit_code=completed.exit_code)
            outcome = self.ctx.control_side.completion.complete(completed.run_id, completed.attempt_id, receipt,
                                                   completed.log_dropped_bytes)
            result, detail = outcome.result, outcome.detail or ""
        self.peer.send(ack_message("completed", completed.run_id, completed.attempt_id, result, detail))
        return result


@pytest.fixture
def rc(tmp_path):
    endpoint = unique_endpoint("receipts")
    h = ActorHarness(tmp_path, control_connect=endpoint)
    try:
        peer = h.router(endpoint)
        h.route_executor_side()
        h.stub("executor")
        h.stub("supervisor")
        h.start_bridge()
        ref = h.start("receipts", ReceiptConsumer)
        yield ReceiptRig(h, ref, peer)
    finally:
        h.close()


@pytest.fixture
def sched(tmp_path):
    h = ActorHarness(tmp_path)
    try:
        h.start_bridge()
        h.ctx.admitting.set()
        yield h
    finally:
        h.close()


def step_stub(h: ActorHarness, name: str, *, ok: bool = True, silent: bool = False) -> None:
    def answer(message: Any) -> None:
        if isinstance(message, StepRequest) and not silent:
            h.directory.tell("scheduler", StepDone(message.cycle, name, ok, "" if ok else f"{name} broke"))

    h.stub(name, answer)


class Flights:
    """Attempts in flight, made with the real Dispatch operations under a given session."""

    def __init__(self, h: ActorHarness, session, repo=None) -> None:
        self.h, self.session = h, session
        self.repo = repo or h.repo
        self.dispatch = Dispatch.open(self.repo.store)
        self.n = 0
        self.repo.tasks.add(spec("many", max_concurrent=1024), actor_name="tester")

    def make(self, stage: str, identity=None, token: str | None = None) -> tuple[str, str]:
        d, s = self.dispatch, self.session
        run_id = self.repo.runs.request("many").run.id
        if stage == "queued":
            return run_id, self.repo.runs.get(run_id).attempts[0].id
        self.n += 1
        lease_hash = token_hash(new_token())
        view = d.offers.one(s.worker_id, s.session_id, s.generation, f"offer-{self.n}", lease_hash, log_cap_bytes=0)
        assert view is not None and view.run_id == run_id
        fence: Fence = view.fence(lease_hash)
        if stage in ("starting", "running"):
            assert d.reports.activate(fence, token_hash(token or new_token()), "ab/x.log").result == "applied"
        if stage == "running":
            i = identity
            assert d.reports.started(fence, i.boot_id, i.pid, i.pgid, i.start_ticks).result == "applied"
        return run_id, view.attempt_id


def plant_receipt(h: ActorHarness, run_id: str, attempt_id: str, token: str, exit_code: int) -> Any:
    h.ctx.executor_side.receipts.shard_dir(attempt_id)
    path = h.ctx.executor_side.receipts.final_path(attempt_id)
    path.write_bytes(encode_receipt(Receipt(schema_version=1, run_id=run_id, attempt_id=attempt_id,
                                            callback_sequence=1, token=token, started_at_ms=now_ms() - 10,
                                            finished_at_ms=now_ms(), exit_code=exit_code)))
    return path


@pytest.fixture
def rec(tmp_path):
    h = ActorHarness(tmp_path, session_capacity=4096)
    try:
        h.stub("scheduler")
        yield h
    finally:
        h.close()
