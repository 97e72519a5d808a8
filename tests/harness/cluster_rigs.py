"""A worker's Executor against cluster sessions (ClusterRig), and a cluster Gateway; shared by the
executor's re-attest, exchange, drain and deadline tests and the Gateway's peer tests."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from qlactors.control.gateway import Gateway
from qlactors.control.session_policy import ClusterSessions
from qlactors.domain.receipt import token_hash
from qlactors.domain.resume_secret import resume_secret
from qlactors.executor.executor import Executor
from qlactors.executor.receipt_consumer import ReceiptConsumer
from qlactors.ids import new_id
from qlactors.runtime.signals import HeartbeatDue
from qlactors.wire import messages as m

from actor_harness import WAIT_S, ActorHarness, unique_endpoint, wait_until, welcome_message
from actor_rigs import BOOT_ID, ExecutorRig, new_token, spec


LEASES = dict(heartbeat_ms=600_000, session_lease_ms=60_000, run_lease_ms=60_000)  # no timer fires
RESUME_SECRET = functools.partial(resume_secret, b"r" * 40)  # the replicas' key, for ClusterSessions


class ClusterRig(ExecutorRig):
    """An ExecutorRig whose sessions are cluster sessions registered in the store, answered by the
    control side's real `ClusterSessions`; heartbeats are sent when the test says so."""

    def __init__(self, h: ActorHarness, ref, peer, register: m.Register) -> None:
        super().__init__(h, ref, peer, register)
        self.control = ClusterSessions(h.ctx.control_side.dispatch, None, h.ctx.control_side.control, **LEASES, resume_secret=RESUME_SECRET)
        self.worker_id = h.ctx.executor_side.session.worker_id
        self.secrets: dict[str, str] = {}  # session id -> the resume secret its Welcome gave

    def new_session(self):
        """A new generation in the store (the older sessions end, as a Register does)."""
        secret = new_token()
        session = self.ctx.control_side.dispatch.sessions.register(
            self.worker_id, self.h.config.runtime.slots, boot_id=BOOT_ID, session_lease_ms=LEASES["session_lease_ms"],
            resume_secret_hash=token_hash(secret))
        self.secrets[session.session_id] = secret
        return session

    def welcome_to(self, session, **timings: int) -> None:
        secret = self.secrets.get(session.session_id) or new_token()
        self.peer.send(welcome_message(session, resume_secret=secret, **{**LEASES, **timings}))

    def heartbeat(self) -> m.Heartbeat:
        self.ref.tell(HeartbeatDue())
        return self.peer.expect(m.Heartbeat, strict=False)

    def answer_heartbeat(self, beat: m.Heartbeat) -> m.HeartbeatAck:
        ack, _stops = self.control.heartbeat(beat, self.worker_id)
        self.peer.send(ack)
        return ack

    def answer_attest(self, attest: m.Attest) -> m.Attested:
        answer = self.control.attest(attest, self.worker_id)
        self.peer.send(answer)
        return answer

    def restart_executor(self, *, receipts: bool = False) -> m.Register:
        """The worker's process dies and a new one starts on its state directory: the Executor (and
        with `receipts` the ReceiptConsumer) is stopped where it is (nothing it was sent since is
        handled) and a new one starts on the same journal; the jobs it launched run on. The new
        instance's Register."""
        if receipts:
            self.h.directory.get("receipts").stop(timeout=WAIT_S)
            self.h.start("receipts", ReceiptConsumer)
        self.ref.stop(timeout=WAIT_S)
        self.ref = self.h.start("executor", Executor)
        return self.peer.expect(m.Register, strict=False)

    def resume(self, register: m.Register, **fields: Any) -> m.Welcome:
        """The Welcome a replica gives a restarted worker's `register`: its session resumed (the
        store checks the saved secret; the secret rotates), numbering its heartbeats on from the
        stored number as ClusterSessions does (`heartbeat_seq=None`: a protocol-4 replica's)."""
        secret = new_token()
        session = self.ctx.control_side.dispatch.sessions.resume(
            self.worker_id, register.resume_session_id, register.resume_generation, token_hash(register.resume_secret),
            token_hash(secret), register.boot_id, capacity=register.capacity, labels=register.labels,
            session_lease_ms=LEASES["session_lease_ms"], register_id=register.register_id)
        self.secrets[session.session_id] = secret
        welcome = welcome_message(session, resume_secret=secret, resumed=True, answer_to=register.request_id,
                                  **{**LEASES, "heartbeat_seq": session.heartbeat_seq, **fields})
        self.peer.send(welcome)
        return welcome

    def launch_on(self, session, words: list[str]) -> tuple[m.Offer, m.Pull, m.Started]:
        self.welcome_to(session)
        pull = self.peer.expect(m.Pull)
        self.repo.tasks.add(spec("job", words), actor_name="tester")
        self.repo.runs.request("job")
        offer = self.offer_for(pull)
        self.send_offers(pull, offer)
        self.activate(self.peer.expect(m.Activate))
        started = self.peer.expect(m.Started)
        self.h.track_group(started.pgid)
        self.ack_started(started)
        return offer, pull, started


@pytest.fixture
def make_rig(tmp_path):
    harnesses: list[ActorHarness] = []

    def start(*, before=None, slots: int = 1) -> ClusterRig:
        endpoint = unique_endpoint("exec")
        h = ActorHarness(tmp_path, control_connect=endpoint, slots=slots)
        harnesses.append(h)
        peer = h.router(endpoint)
        h.route_executor_side()
        h.stub("supervisor")
        h.start_bridge()
        h.ctx.admitting.set()
        if before is not None:
            before(h)
        h.start("receipts", ReceiptConsumer)
        ref = h.start("executor", Executor)
        return ClusterRig(h, ref, peer, peer.expect(m.Register))

    yield start
    for h in harnesses:
        (h.config.home.parent / "GO").touch()  # a held job still waiting ends (the drain tests leave theirs)
        h.close()


def held_job(rig: ClusterRig) -> list[str]:
    """Announces itself, then runs until the test lets it end (exit 0); a TERM ends it with 143."""
    home = rig.h.config.home.parent
    return ["/bin/sh", "-c", f": > {home / 'READY'}; while [ ! -e {home / 'GO'} ]; do sleep 0.05; done; exit 0"]


def offer_failing_start(rig: ClusterRig, pull: m.Pull, tmp_path) -> m.Offer:
    """Offer `pull` a run whose pinned working directory is gone by the time it is activated: a
    start failure, nothing spawned."""
    gone = tmp_path / "gone"
    gone.mkdir()
    rig.repo.tasks.add(spec("job", cwd=str(gone)), actor_name="tester")
    rig.repo.runs.request("job")
    offer = rig.offer_for(pull)
    gone.rmdir()
    rig.send_offers(pull, offer)
    return offer


def ready(rig: ClusterRig) -> None:
    wait_until((rig.h.config.home.parent / "READY").exists, what="the job runs")


def release(rig: ClusterRig) -> None:
    (rig.h.config.home.parent / "GO").touch()


def end_session_by_heartbeat(rig: ClusterRig):
    """The session ends in the store (a newer generation); the next heartbeat's answer says so."""
    session = rig.new_session()
    ack = rig.answer_heartbeat(rig.heartbeat())
    assert ack.session_ended
    register = rig.peer.expect(m.Register, strict=False)
    # It names the session it lost (a duplicate key shows that way, SEMANTICS §9); the store
    # refuses that resume, so it registers anew.
    assert register.resume_session_id not in (None, session.session_id)
    return session


def start_cluster_gateway(tmp_path, store_url):
    """A Gateway whose sessions are a cluster replica's (`ClusterSessions`), the other actors
    stubbed, and a worker's socket: (harness, socket); the caller closes the harness."""
    endpoint = unique_endpoint("control")
    h = ActorHarness(tmp_path, control_bind=endpoint, database_url=store_url)
    try:
        h.ctx.control_side.sessions = ClusterSessions(h.ctx.control_side.dispatch, None, h.ctx.control_side.control,
                                                      **LEASES, resume_secret=RESUME_SECRET)
        h.bridge.route_control(h.directory.named("gateway"))
        for name in ("recovery", "scheduler", "supervisor"):
            h.stub(name)
        h.start_bridge()
        h.ctx.admitting.set()
        h.start("gateway", Gateway)
        return h, h.dealer(endpoint)
    except BaseException:
        h.close()
        raise


@pytest.fixture
def cluster_gateway(tmp_path, store_url):
    """`start_cluster_gateway`, closed after the test."""
    h, socket = start_cluster_gateway(tmp_path, store_url)
    try:
        yield h, socket
    finally:
        h.close()


def leave_of(session, status: str, generation: int | None = None) -> m.Leave:
    return m.Leave(request_id=new_id(), worker_id=session.worker_id, session_id=session.session_id,
                   session_generation=session.generation if generation is None else generation, status=status)
