"""The seeded link between the worker and one replica: a frame-level proxy in its own thread.

The worker's ReplicaLinks connect to the proxy's CURVE ROUTER (tcp, the replicas' server key, an
authenticator of its own), and the proxy reaches the real replica's CURVE ROUTER with the worker's
own key, so both ends run the real transport and the proxy sees every frame in clear. While
faulting, every frame in each direction is dropped, duplicated, and delayed by a bounded random
amount (frames delayed differently are delivered out of order), drawn from `random.Random` of
(seed, link, direction); once `calm()` is called frames go through at once, in order. `sever()`
(a worker killed, issue 26) loses every frame in flight and every later frame of the worker's
connections so far, and gives the replica a new connection, as a process's death does.
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
import time
from dataclasses import dataclass

import zmq

from qlactors.wire import endpoints
from qlactors.wire.curve import AllowList, client_socket_options, server_socket_options, start_authenticator


@dataclass(frozen=True)
class FaultPlan:
    """The odds of one frame: dropped, duplicated, delayed (bounded), and sometimes held longer so
    that later frames overtake it."""

    drop: float = 0.15
    duplicate: float = 0.15
    max_delay_s: float = 0.05
    reorder: float = 0.15
    reorder_delay_s: float = 0.25

    def delays(self, rng: random.Random) -> list[float]:
        """When each copy of one frame is delivered, seconds from now; [] drops it."""
        if rng.random() < self.drop:
            return []
        copies = 2 if rng.random() < self.duplicate else 1
        out = []
        for _ in range(copies):
            delay = rng.uniform(0.0, self.max_delay_s)
            if rng.random() < self.reorder:
                delay += rng.uniform(0.0, self.reorder_delay_s)
            out.append(delay)
        return out


UP, DOWN = "up", "down"  # worker -> replica, replica -> worker


class FaultyLink(threading.Thread):
    """A proxy from `front` (what the worker connects to) to the replica at `replica`."""

    def __init__(self, *, seed: int, name: str, front: str, replica: str, server_public: bytes,
                 server_secret: bytes, worker_public: bytes, worker_secret: bytes, plan: FaultPlan,
                 worker_id: str = "w1") -> None:
        super().__init__(name=f"simnet-{name}", daemon=True)
        self.front, self.replica, self.plan = front, replica, plan
        self._rng = {d: random.Random(f"simnet:{seed}:{name}:{d}") for d in (UP, DOWN)}
        self._keys = (server_public, server_secret, worker_public, worker_secret)
        self.worker_id = worker_id
        self._sever = threading.Event()
        self._dead_peers: set[bytes] = set()
        self._faulting = threading.Event()
        self._faulting.set()
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._queue: list[tuple[float, int, str, list[bytes]]] = []
        self._seq = itertools.count()
        self._peer: bytes | None = None
        self.counts = {"frames": 0, "dropped": 0, "duplicated": 0}

    def calm(self) -> None:
        """Stop faulting: frames from now on go through at once (those held keep their time)."""
        self._faulting.clear()

    def sever(self) -> None:
        """The worker's process died: the link thread drops what is in flight, refuses the old
        connections' frames, and reconnects to the replica (a new peer there)."""
        self._sever.set()

    def close(self) -> None:
        self._stopping.set()
        self.join(10)

    def wait_ready(self) -> None:
        if not self._ready.wait(10) or self._failure is not None:
            raise RuntimeError(f"the faulty link {self.name} did not start: {self._failure!r}")

    def run(self) -> None:
        server_public, server_secret, worker_public, worker_secret = self._keys
        ctx = zmq.Context()
        auth = None
        front = back = None
        try:
            auth = start_authenticator(ctx, AllowList({worker_public.decode("ascii"): self.worker_id}))
            heartbeat = endpoints.ZmtpHeartbeat.every(1000)
            front = ctx.socket(zmq.ROUTER)
            front_ep = endpoints.parse_endpoint(self.front)
            endpoints.server_router(front, front_ep, heartbeat=heartbeat,
                                    security=server_socket_options(server_secret))
            front.bind(self.front)
            self._ctx, self._heartbeat = ctx, heartbeat
            back = self._connect_back()
        except BaseException as err:
            self._failure = err
        self._ready.set()
        try:
            if self._failure is None:
                self._loop(front, back)
        finally:
            for sock in (front, getattr(self, "_back", back)):
                if sock is not None:
                    sock.close(0)
            if auth is not None:
                auth.stop()
            ctx.term()

    def _connect_back(self) -> zmq.Socket:
        server_public, _server_secret, worker_public, worker_secret = self._keys
        back = self._ctx.socket(zmq.DEALER)
        endpoints.client_dealer(back, endpoints.parse_endpoint(self.replica), heartbeat=self._heartbeat,
                                security=client_socket_options(worker_public, worker_secret, server_public))
        back.connect(self.replica)
        return back

    def _loop(self, front: zmq.Socket, back: zmq.Socket) -> None:
        poller = zmq.Poller()
        poller.register(front, zmq.POLLIN)
        poller.register(back, zmq.POLLIN)
        while not self._stopping.is_set():
            if self._sever.is_set():
                self._sever.clear()
                self._queue.clear()
                if self._peer is not None:
                    self._dead_peers.add(self._peer)
                self._peer = None
                poller.unregister(back)
                back.close(0)
                back = self._back = self._connect_back()
                poller.register(back, zmq.POLLIN)
            now = time.monotonic()
            wait_ms = 50 if not self._queue else max(0, min(50, int((self._queue[0][0] - now) * 1000) + 1))
            events = dict(poller.poll(wait_ms))
            if front in events:
                self._drain(front, lambda f: self._take(UP, f[1:], peer=f[0]))
            if back in events:
                self._drain(back, lambda f: self._take(DOWN, f))
            self._deliver(front, back)

    @staticmethod
    def _drain(sock: zmq.Socket, take) -> None:
        while True:
            try:
                take(sock.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return

    def _take(self, direction: str, frames: list[bytes], peer: bytes | None = None) -> None:
        if peer is not None:
            if peer in self._dead_peers:
                return  # a frame of a killed worker's connection
            self._peer = peer
        now = time.monotonic()
        self.counts["frames"] += 1
        delays = self.plan.delays(self._rng[direction]) if self._faulting.is_set() else [0.0]
        if not delays:
            self.counts["dropped"] += 1
        if len(delays) > 1:
            self.counts["duplicated"] += 1
        for delay in delays:
            heapq.heappush(self._queue, (now + delay, next(self._seq), direction, frames))

    def _deliver(self, front: zmq.Socket, back: zmq.Socket) -> None:
        now = time.monotonic()
        while self._queue and self._queue[0][0] <= now:
            _at, _n, direction, frames = heapq.heappop(self._queue)
            try:
                if direction == UP:
                    back.send_multipart(frames, zmq.NOBLOCK)
                elif self._peer is not None:
                    front.send_multipart([self._peer, *frames], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # the other end is not connected (IMMEDIATE, ROUTER_MANDATORY): a lost frame
