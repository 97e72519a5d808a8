"""A harness for actor-level integration tests: one real actor, the real store, a test peer on ZeroMQ.

`ActorHarness` builds the same `EdgeContext` as `EdgeRuntime._build_and_start` (SQLite file in a temp
home, the local session, a Bridge, Directory, Fatal, ReceiptStore, LogStore, Journal,
LocalReceipts, CompletionService, Control, Retention) but starts only the actor under test. Every other
name in the Directory is a `Stub` that records what it receives (and may answer). The test
peer is a plain ZeroMQ socket on the same context, speaking the real wire codec:

- control side under test (Supervisor): the bridge binds `inproc://test-control-<uuid>`, the
  peer is a DEALER connected to it;
- executor side under test (Executor, ReceiptConsumer): the peer binds a ROUTER first, the
  bridge's DEALER connects to it.

`close()` stops every actor, the bridge, the peer sockets (LINGER 0), terminates the context,
closes the store and kills every process group the test spawned or learnt of.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import pykka
import zmq
from sqlalchemy import select

from qlactors.domain.results import Result
from qlactors.runtime.context import Directory, Fatal, SharedContext
from qlactors.executor.disk_reserve import DiskReserve
from qlactors.runtime.outage import watch_store
from qlactors.control.session_policy import LocalSessions
from qlactors.executor.local_receipts import LocalReceipts
from qlactors.config import DEFAULTS, Config, ensure_home
from qlactors.executor.context import EXECUTOR_KINDS
from qlactors.executor.edge_evidence import EdgeEvidence
from qlactors.executor.edge_files import EdgeFiles
from qlactors.profiles.edge import LOCAL_WORKER, EdgeContext
from qlactors.process.identity import ProcessIdentity, read_boot_id, read_identity
from qlactors.process.logs import LogStore
from qlactors.process.receipts import ReceiptStore
from qlactors.store.dispatch.completion import CompletionService
from qlactors.store.cadence.cron_admission import CronAdmission
from qlactors.store.cadence.control import Control
from qlactors.store.cadence.lost_retry import LostRetry
from qlactors.store.dispatch.dispatch import Dispatch
from qlactors.executor.journal.journal import Journal
from qlactors.store.repository import Repository
from qlactors.store.cadence.retention import Retention
from qlactors.store.schema import run_attempts
from qlactors.wire import codec
from qlactors.wire import messages as m
from qlactors.wire.bridge import Bridge
from store_helpers import db_state  # noqa: F401 - the actor tests import it from here
from qlactors.ids import new_id

WAIT_S = 10.0  # the longest any single expectation waits (they normally finish in milliseconds)
QUIET_S = 0.3  # how long "nothing happens" is watched for


class Inbox:
    """What the stubs received, in arrival order, as (stub name, message); thread-safe, waitable."""

    def __init__(self) -> None:
        self._items: list[tuple[str, Any]] = []
        self._cond = threading.Condition()

    def put(self, name: str, message: Any) -> None:
        with self._cond:
            self._items.append((name, message))
            self._cond.notify_all()

    def items(self, name: str | None = None, kind: type | None = None) -> list[Any]:
        with self._cond:
            return [m for n, m in self._items
                    if (name is None or n == name) and (kind is None or isinstance(m, kind))]

    def log(self) -> list[tuple[str, Any]]:
        with self._cond:
            return list(self._items)

    def wait(self, name: str, kind: type, count: int = 1, timeout: float = WAIT_S,
             where: Callable[[Any], bool] | None = None) -> list[Any]:
        """The first `count` messages of `kind` received by stub `name` (waits for them)."""
        deadline = time.monotonic() + timeout

        def found() -> list[Any]:
            return [m for n, m in self._items
                    if n == name and isinstance(m, kind) and (where is None or where(m))]

        with self._cond:
            while len(found()) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"stub {name!r} got {len(found())} {kind.__name__} within {timeout} s, "
                        f"wanted {count}; everything received: {self._items!r}")
                self._cond.wait(left)
            return found()[:count]


class Stub(pykka.ThreadingActor):
    """Stands in for a named actor: records every message; `answer(message)` may react."""

    def __init__(self, name: str, inbox: Inbox, answer: Callable[[Any], Any] | None = None) -> None:
        super().__init__()
        self.name = name
        self.inbox = inbox
        self.answer = answer

    def on_receive(self, message: Any) -> Any:
        self.inbox.put(self.name, message)
        if self.answer is not None:
            return self.answer(message)
        return None


class Peer:
    """The test's end of the wire: sends and receives real codec frames, from the test thread only."""

    def __init__(self, sock: zmq.Socket, *, router: bool) -> None:
        self.sock = sock
        self.router = router
        self.identity: bytes | None = None  # ROUTER: the bridge DEALER's identity, once heard
        self.pending: list[Any] = []  # decoded messages received while `expect` waited for another kind
        self.last_register: m.Register | None = None  # the Register heard last (a Welcome answers it)

    def send(self, message: Any) -> None:
        """Send `message`; a Welcome that names no request answers the Register heard last."""
        if isinstance(message, m.Welcome) and not message.answer_to and self.last_register is not None:
            message = dataclasses.replace(message, answer_to=self.last_register.request_id)
        self.send_frames(codec.encode(message))

    def _decode(self, frames: list[bytes]) -> Any:
        message = codec.decode(frames)
        if isinstance(message, m.Register):
            self.last_register = message
        return message

    def send_frames(self, frames: list[bytes]) -> None:
        if self.router:
            assert self.identity is not None, "the executor side has not spoken yet"
            frames = [self.identity, *frames]
        self.sock.send_multipart(frames)

    def recv_frames(self, timeout: float = WAIT_S) -> list[bytes] | None:
        if not self.sock.poll(int(timeout * 1000), zmq.POLLIN):
            return None
        frames = self.sock.recv_multipart()
        if self.router:
            self.identity, frames = frames[0], frames[1:]
        return frames

    def recv(self, timeout: float = WAIT_S) -> Any:
        """The next message (one set aside by `expect` first)."""
        if self.pending:
            return self.pending.pop(0)
        frames = self.recv_frames(timeout)
        if frames is None:
            raise AssertionError(f"no message from the other side within {timeout} s")
        return self._decode(frames)

    def expect(self, kind: type, timeout: float = WAIT_S, *, strict: bool = True) -> Any:
        """The next message of `kind`. strict: it must be the very next one; else others are set
        aside (kept for later `recv`/`expect`), for messages two actors send in no fixed order."""
        for i, message in enumerate(self.pending):
            if isinstance(message, kind):
                return self.pending.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            frames = self.recv_frames(max(0.0, deadline - time.monotonic()))
            if frames is None:
                raise AssertionError(f"no {kind.__name__} within {timeout} s; set aside: {self.pending!r}")
            message = self._decode(frames)
            if isinstance(message, kind):
                return message
            assert not strict, f"expected {kind.__name__}, got {message!r}"
            self.pending.append(message)

    def quiet(self, timeout: float = QUIET_S) -> None:
        assert not self.pending, f"expected silence, got {self.pending!r}"
        frames = self.recv_frames(timeout)
        assert frames is None, f"expected silence, got {codec.decode(frames)!r}"


class ActorHarness:
    """A real EdgeContext with a temp home; start one actor, stub the others, talk over a peer."""

    def __init__(self, tmp_path: Path, *, control_bind: str | None = None,
                 control_connect: str | None = None, session_capacity: int = 64,
                 database_url: str | None = None, **runtime: int) -> None:
        home = tmp_path / "home"
        self.config = Config(home=home, profile="edge",
                             database_url=database_url or f"sqlite:///{home / 'qlactors.db'}",
                             runtime=replace(DEFAULTS["edge"], **runtime))
        ensure_home(self.config)
        self.repo = Repository.open(self.config.database_url)
        self._refs: list[pykka.ActorRef] = []
        self._sockets: list[zmq.Socket] = []
        self._procs: list[subprocess.Popen] = []
        self._pgids: set[int] = set()
        self._bridge_started = False
        self.inbox = Inbox()
        self.zmq = zmq.Context()
        try:
            store = self.repo.store
            receipts = ReceiptStore(self.config.receipts_dir)
            receipts.ensure()
            logs = LogStore(self.config.logs_dir)
            logs.ensure()
            journal = Journal(store)
            dispatch = Dispatch.open(store)
            bridge = Bridge(self.zmq, control_bind=control_bind, control_connect=control_connect)
            session = dispatch.sessions.register(LOCAL_WORKER, session_capacity)
            local_receipts = LocalReceipts(receipts, journal, self.config.runtime.quarantine_retention_ms)
            shared = SharedContext(config=self.config, zmq=self.zmq, bridge=bridge, directory=Directory(),
                                   fatal=Fatal(), admitting=threading.Event(), health=store.health)
            self.ctx = EdgeContext.over(
                shared,
                control=dict(repo=self.repo, dispatch=dispatch, completion=CompletionService(store),
                             control=Control.open(store), lost_retry=LostRetry(store), cron=CronAdmission(store),
                             retention=Retention(store, EdgeFiles(journal, logs, receipts)),
                             sessions=LocalSessions(session, self.config.runtime.cadence_tick_ms,
                                                    DiskReserve(self.config, None)),
                             local=EdgeEvidence(journal, receipts, local_receipts, read_boot_id, session)),
                executor=dict(journal=journal, receipts=receipts, logs=logs, local_receipts=local_receipts,
                              session=session, boot_id=read_boot_id, launcher_shell="/bin/sh"))
            watch_store(self.ctx)  # as profiles/edge.py does: outages reach `status`, a persistent one is fatal
        except BaseException:
            self.zmq.term()
            self.repo.close()
            raise

    # -- wiring ---------------------------------------------------------------------------------

    @property
    def bridge(self) -> Bridge:
        return self.ctx.bridge

    @property
    def directory(self) -> Directory:
        return self.ctx.directory

    def route_executor_side(self) -> None:
        """The edge routes of the executor side (profiles/edge.py): replies to the executor, acks of completions to receipts."""
        self.bridge.route_executor(EXECUTOR_KINDS, self.directory.named("executor"))
        self.bridge.route_executor(["ack:completed"], self.directory.named("receipts"))

    def start_bridge(self) -> None:
        self.bridge.start()
        self._bridge_started = True
        self.bridge.ready()

    def stub(self, name: str, answer: Callable[[Any], Any] | None = None) -> pykka.ActorRef:
        ref = Stub.start(name, self.inbox, answer)
        self._refs.append(ref)
        self.directory.set(name, ref)
        return ref

    def start(self, name: str, cls: type, *args: Any) -> pykka.ActorRef:
        ref = cls.start(self.ctx.side_of(cls), *args)
        self._refs.append(ref)
        self.directory.set(name, ref)
        return ref

    def dealer(self, endpoint: str) -> Peer:
        sock = self._socket(zmq.DEALER)
        sock.connect(endpoint)
        return Peer(sock, router=False)

    def router(self, endpoint: str) -> Peer:
        sock = self._socket(zmq.ROUTER)
        sock.bind(endpoint)
        return Peer(sock, router=True)

    def _socket(self, kind: int) -> zmq.Socket:
        sock = self.zmq.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        self._sockets.append(sock)
        return sock

    # -- processes ------------------------------------------------------------------------------

    def spawn_sleep(self, seconds: int = 30) -> tuple[subprocess.Popen, ProcessIdentity]:
        """A `sleep` of our own in a new session (pid = pgid), and its durable identity."""
        proc = subprocess.Popen(["sleep", str(seconds)], start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._procs.append(proc)
        return proc, read_identity(proc.pid, boot_id=read_boot_id())

    def dead_identity(self) -> ProcessIdentity:
        """The identity of a process that existed and is gone (reaped)."""
        proc, identity = self.spawn_sleep(30)
        proc.kill()
        proc.wait(WAIT_S)
        return identity

    def track_group(self, pgid: int) -> None:
        """A process group the runtime launched: killed (and its leader reaped) at close."""
        self._pgids.add(pgid)

    # -- teardown -------------------------------------------------------------------------------

    def close(self) -> None:
        errors: list[str] = []
        for ref in reversed(self._refs):
            try:
                ref.stop(timeout=WAIT_S)
            except pykka.ActorDeadError:
                pass
            except Exception as err:  # keep tearing down; report at the end
                errors.append(f"stopping {ref}: {err!r}")
        self.bridge.close()
        for sock in self._sockets:
            sock.close(linger=0)
        terminated = threading.Event()

        def term() -> None:
            self.zmq.term()
            terminated.set()

        threading.Thread(target=term, name="test-zmq-term", daemon=True).start()
        if not terminated.wait(WAIT_S):
            errors.append("zmq context did not terminate: a socket was left open")
        for pgid in self._pgids:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.waitpid(pgid, 0)  # the launcher (group leader) is our child; reap it
            except ChildProcessError:
                pass
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(WAIT_S)
        self.repo.close()
        assert not errors, errors


# -- protocol 2 messages as the peers of the actors under test build them ----------------------


def register_message(worker_id: str, boot_id: str, **kw: Any) -> m.Register:
    """A Register of a new session (no resume) speaking exactly this protocol version."""
    fields: dict[str, Any] = dict(
        worker_id=worker_id, capacity=1, boot_id=boot_id, labels=[], protocol_min=codec.PROTOCOL_MIN,
        protocol_max=codec.PROTOCOL_MAX, worker_clock_ms=time.time_ns() // 1_000_000,
        resume_session_id=None, resume_generation=None, resume_secret=None)
    fields.update(kw)
    return m.Register(request_id=new_id(), register_id=new_id(), **fields)


def welcome_message(session: Any, **kw: Any) -> m.Welcome:
    """The Welcome the edge Supervisor sends for its one local session (ctx.session)."""
    fields: dict[str, Any] = dict(
        worker_id=session.worker_id, session_id=session.session_id, session_generation=session.generation,
        answer_to="", resumed=False, resume_secret="secret", protocol=codec.VERSION, heartbeat_ms=1000,
        session_lease_ms=None, run_lease_ms=None, unactivated=[])
    fields.update(kw)
    return m.Welcome(**fields)


def offers_message(pull: m.Pull, *offers: m.Offer) -> m.Offers:
    """The answer to `pull` carrying `offers` (none: nothing to do now)."""
    return m.Offers(answer_to=pull.request_id, worker_id=pull.worker_id, session_id=pull.session_id,
                    session_generation=pull.session_generation, pull_id=pull.pull_id, offers=list(offers))


def ack_message(of: str, run_id: str, attempt_id: str, result: Result | str, detail: str = "",
                offer_id: str = "", answer_to: str = "") -> m.Ack:
    """An Ack as the Gateway sends it: `result` a Result (a store Outcome's) or its word."""
    return m.Ack(answer_to=answer_to, of=of, run_id=run_id, attempt_id=attempt_id, offer_id=offer_id,
                 result=Result(result).value, detail=detail)


# -- store helpers ------------------------------------------------------------------------------


def attempt_row(repo: Repository, attempt_id: str):
    with repo.store.read() as conn:
        return conn.execute(select(run_attempts).where(run_attempts.c.id == attempt_id)).one()


def leases(repo: Repository, run_id: str) -> list:
    return db_state(repo, run_id)[2]


def wait_until(predicate: Callable[[], Any], timeout: float = WAIT_S, what: str = "condition") -> Any:
    """Poll `predicate` every 10 ms until it is truthy; its value, or AssertionError at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout} s")
        time.sleep(0.01)


def unique_endpoint(kind: str) -> str:
    return f"inproc://test-{kind}-{uuid.uuid4().hex}"
