"""A TCP proxy for tests (issue 17): a slow or dead network path between a worker and a replica.

`TcpProxy(target_port)` listens on a free 127.0.0.1 port and forwards every connection made to
it to `127.0.0.1:target_port`, byte for byte. Each direction of the path can be held back:

- `set_delay(direction, seconds)`: every chunk read from now on in that direction is forwarded
  `seconds` after it was read, and never before a chunk read earlier (byte order is kept within
  a connection: lowering the delay lets new bytes through only behind the ones already held).
  It may be changed at any time while the proxy runs.
- `when(direction, min_bytes, action)`: call `action()` once, in the proxy's thread, on the first
  chunk of at least `min_bytes` read in `direction`, before it is forwarded (e.g. start a delay,
  or freeze the server, the moment a large answer passes: the client's next request meets it).
- `blackhole(direction, on)`: bytes read in that direction while it is on are thrown away (the
  connection stays up; what the peers make of the hole in their stream is theirs).
- `reset()`: close every connection the proxy carries now, both sides (new ones are accepted as
  before): e.g. when a blackhole is healed, the streams it holed are ended at once, as a real
  path's peers would end theirs, instead of stalling in a handshake whose bytes it dropped.

`UP` is client → server (what the client sends, e.g. a worker's requests to its replica),
`DOWN` server → client. One thread and a selector serve every connection; everything is
bounded (connections, bytes held per direction: past it the proxy stops reading that side until
the held bytes go out). `close()` closes the listener, every connection and the thread, and so
releases the port. Nothing here listens beyond 127.0.0.1.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field

UP = "up"      # client -> server
DOWN = "down"  # server -> client
HOST = "127.0.0.1"
CHUNK = 65_536


@dataclass
class _Flow:
    """One direction of one connection: bytes read from `src`, held until due, sent to `dst`."""
    src: socket.socket
    dst: socket.socket
    held: deque = field(default_factory=deque)  # (due, bytes), or (due, None) for the EOF
    held_bytes: int = 0
    out: bytearray = field(default_factory=bytearray)  # due, not yet taken by `dst`
    last_due: float = 0.0
    eof_read: bool = False
    eof_sent: bool = False


@dataclass
class _Pipe:
    client: socket.socket
    server: socket.socket
    flows: dict[str, _Flow]
    closed: bool = False


class TcpProxy:
    def __init__(self, target_port: int, *, max_connections: int = 64, max_held_bytes: int = 8 << 20) -> None:
        self.target_port = target_port
        self.max_connections = max_connections
        self.max_held_bytes = max_held_bytes
        self._delay = {UP: 0.0, DOWN: 0.0}
        self._hole = {UP: False, DOWN: False}
        self._lock = threading.RLock()  # an action of `when` may call set_delay
        self._pipes: list[_Pipe] = []
        self._sel = selectors.DefaultSelector()
        self._listener = socket.create_server((HOST, 0))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._stop = threading.Event()
        self._reset = threading.Event()  # set by `reset`, cleared by the proxy's thread once done
        self.accepted = 0  # connections accepted so far
        self.forwarded = {UP: 0, DOWN: 0}  # bytes sent on, per direction
        self.dropped = {UP: 0, DOWN: 0}  # bytes thrown away by a blackhole
        # (wall-clock time, direction, bytes) of each chunk read, the latest 10 000: what went
        # over the path when (a test's failure message can show it)
        self.trace: deque = deque(maxlen=10_000)
        self._triggers: list[tuple[str, int, object]] = []
        self._thread = threading.Thread(target=self._run, name=f"tcp-proxy-{self.port}", daemon=True)
        self._thread.start()

    # -- any thread ---------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return f"tcp://{HOST}:{self.port}"

    def set_delay(self, direction: str, seconds: float) -> None:
        if direction not in self._delay or seconds < 0:
            raise ValueError(f"a direction ({UP!r} or {DOWN!r}) and a delay >= 0, got {direction!r}, {seconds}")
        with self._lock:
            self._delay[direction] = float(seconds)
        self._wake()

    def blackhole(self, direction: str, on: bool = True) -> None:
        if direction not in self._hole:
            raise ValueError(f"a direction is {UP!r} or {DOWN!r}, got {direction!r}")
        with self._lock:
            self._hole[direction] = on
        self._wake()

    def reset(self, timeout: float = 10) -> int:
        """Close every connection now (in the proxy's thread); how many there were."""
        with self._lock:
            n = len(self._pipes)
            self._reset.set()
        self._wake()
        deadline = time.monotonic() + timeout
        while self._reset.is_set() and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.01)
        return n

    def when(self, direction: str, min_bytes: int, action) -> None:
        if direction not in self._delay:
            raise ValueError(f"a direction is {UP!r} or {DOWN!r}, got {direction!r}")
        with self._lock:
            self._triggers.append((direction, min_bytes, action))

    def held(self, direction: str) -> int:
        """Bytes read in `direction` and not yet sent on (held back or waiting for the peer)."""
        with self._lock:
            return sum(p.flows[direction].held_bytes + len(p.flows[direction].out) for p in self._pipes)

    def connections(self) -> int:
        with self._lock:
            return len(self._pipes)

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake()
        self._thread.join(10)
        with self._lock:
            for pipe in self._pipes:
                self._close_pipe(pipe)
            self._pipes.clear()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()
        self._sel.close()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    # -- the proxy's thread -------------------------------------------------------------------

    def _run(self) -> None:
        self._sel.register(self._listener, selectors.EVENT_READ)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        while not self._stop.is_set():
            with self._lock:
                timeout = self._next_due()
                self._watch()
            for key, mask in self._sel.select(timeout):
                with self._lock:
                    self._on_event(key.fileobj, mask)
            with self._lock:
                if self._reset.is_set():
                    for pipe in list(self._pipes):
                        self._drop(pipe)
                    self._reset.clear()
                now = time.monotonic()
                for pipe in list(self._pipes):
                    for flow in pipe.flows.values():
                        self._release(pipe, flow, now)
                    if pipe.closed or all(f.eof_sent for f in pipe.flows.values()):
                        self._drop(pipe)

    def _next_due(self) -> float:
        dues = [f.held[0][0] for p in self._pipes for f in p.flows.values() if f.held]
        return max(0.0, min(dues) - time.monotonic()) if dues else 0.5

    def _watch(self) -> None:
        """Each socket read while its flow may hold more, written while bytes wait for it."""
        for pipe in self._pipes:
            for sock in (pipe.client, pipe.server):
                reading, writing = self._flow_from(pipe, sock), self._flow_to(pipe, sock)
                mask = 0
                if not reading.eof_read and reading.held_bytes + len(reading.out) < self.max_held_bytes:
                    mask |= selectors.EVENT_READ
                if writing.out:
                    mask |= selectors.EVENT_WRITE
                try:
                    registered = self._sel.get_key(sock).events
                except KeyError:
                    registered = 0
                if mask != registered:
                    if not mask:
                        self._sel.unregister(sock)
                    elif not registered:
                        self._sel.register(sock, mask)
                    else:
                        self._sel.modify(sock, mask)

    @staticmethod
    def _flow_from(pipe: _Pipe, sock: socket.socket) -> _Flow:
        return pipe.flows[UP] if sock is pipe.client else pipe.flows[DOWN]

    @staticmethod
    def _flow_to(pipe: _Pipe, sock: socket.socket) -> _Flow:
        return pipe.flows[DOWN] if sock is pipe.client else pipe.flows[UP]

    def _pipe_of(self, sock) -> _Pipe | None:
        return next((p for p in self._pipes if sock is p.client or sock is p.server), None)

    def _on_event(self, sock, mask: int) -> None:
        if sock is self._wake_r:
            try:
                while self._wake_r.recv(4096):
                    pass
            except BlockingIOError:
                pass
            return
        if sock is self._listener:
            self._accept()
            return
        pipe = self._pipe_of(sock)
        if pipe is None or pipe.closed:
            return
        try:
            if mask & selectors.EVENT_WRITE:
                self._send(pipe, self._flow_to(pipe, sock))
            if mask & selectors.EVENT_READ:
                self._read(pipe, sock)
        except OSError:
            pipe.closed = True  # reset by a peer: both sides are closed

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        if len(self._pipes) >= self.max_connections:
            client.close()
            return
        try:
            server = socket.create_connection((HOST, self.target_port), timeout=5)
        except OSError:
            client.close()  # nothing listens there: the client sees its connection closed
            return
        for s in (client, server):
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.accepted += 1
        self._pipes.append(_Pipe(client, server, {UP: _Flow(client, server), DOWN: _Flow(server, client)}))

    def _read(self, pipe: _Pipe, sock: socket.socket) -> None:
        direction = UP if sock is pipe.client else DOWN
        flow = pipe.flows[direction]
        try:
            data = sock.recv(CHUNK)
        except BlockingIOError:
            return
        if data and self._hole[direction]:
            self.dropped[direction] += len(data)
            return
        if data:
            self.trace.append((time.time(), direction, len(data)))
            for trigger in [t for t in self._triggers if t[0] == direction and len(data) >= t[1]]:
                self._triggers.remove(trigger)
                trigger[2]()
        due = max(time.monotonic() + self._delay[direction], flow.last_due)
        flow.last_due = due
        flow.held.append((due, data or None))
        if data:
            flow.held_bytes += len(data)
        else:
            flow.eof_read = True

    def _release(self, pipe: _Pipe, flow: _Flow, now: float) -> None:
        """Move what is due to the outgoing buffer and send what the peer takes."""
        if pipe.closed:
            return
        while flow.held and flow.held[0][0] <= now:
            _due, data = flow.held[0]
            if data is None:
                if flow.out:
                    break  # the EOF goes after the last byte
                flow.held.popleft()
                try:
                    flow.dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pipe.closed = True
                flow.eof_sent = True
                return
            flow.held.popleft()
            flow.held_bytes -= len(data)
            flow.out += data
        try:
            self._send(pipe, flow)
        except OSError:
            pipe.closed = True

    def _send(self, pipe: _Pipe, flow: _Flow) -> None:
        while flow.out:
            try:
                n = flow.dst.send(flow.out)
            except BlockingIOError:
                return
            self.forwarded[UP if flow is pipe.flows[UP] else DOWN] += n
            del flow.out[:n]

    def _drop(self, pipe: _Pipe) -> None:
        self._close_pipe(pipe)
        self._pipes.remove(pipe)

    def _close_pipe(self, pipe: _Pipe) -> None:
        pipe.closed = True
        for sock in (pipe.client, pipe.server):
            try:
                self._sel.unregister(sock)
            except (KeyError, ValueError):
                pass
            sock.close()
