"""The tests' TCP proxy (tests/harness/tcp_proxy.py): bytes forwarded in order both ways, one direction
held back by a delay that can change while it runs or thrown away, and `close` releases its
port, its connections and its thread. Plain sockets on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from tcp_proxy import DOWN, UP, TcpProxy

WAIT_S = 10


class Server:
    """A listening socket that accepts one connection and keeps what it reads, with the time."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conn: socket.socket | None = None
        self.received = bytearray()
        self.arrivals: list[tuple[float, bytes]] = []
        self.eof = threading.Event()
        self.got = threading.Condition()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            self.conn, _ = self.listener.accept()
        except OSError:  # closed before anyone connected
            self.eof.set()
            return
        while True:
            try:
                data = self.conn.recv(65536)
            except OSError:
                data = b""
            with self.got:
                if not data:
                    self.eof.set()
                    self.got.notify_all()
                    return
                self.received += data
                self.arrivals.append((time.monotonic(), data))
                self.got.notify_all()

    def wait_for(self, n: int) -> bytes:
        with self.got:
            assert self.got.wait_for(lambda: len(self.received) >= n or self.eof.is_set(), WAIT_S), \
                f"{len(self.received)} of {n} bytes"
            return bytes(self.received)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes an accept still waiting
        except OSError:
            pass
        self.listener.close()
        self._thread.join(WAIT_S)


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


@pytest.fixture
def proxy(server):
    p = TcpProxy(server.port)
    yield p
    p.close()


def _connect(proxy: TcpProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, f"closed after {len(data)} of {n} bytes"
        data += chunk
    return bytes(data)


def test_bytes_go_through_both_ways_in_order(server, proxy):
    with _connect(proxy) as c:
        sent = b"".join(f"{i:06d}".encode() for i in range(20_000))  # 120 kB, many chunks
        for i in range(0, len(sent), 1000):
            c.sendall(sent[i:i + 1000])
        assert server.wait_for(len(sent)) == sent
        server.conn.sendall(sent)
        assert _recv_exactly(c, len(sent)) == sent
    proxy.close()  # its thread joined: the counters are final
    assert proxy.forwarded == {UP: len(sent), DOWN: len(sent)}


def test_a_delayed_direction_holds_its_bytes_back_and_the_other_direction_is_not_held(server, proxy):
    proxy.set_delay(UP, 0.5)
    with _connect(proxy) as c:
        sent_at = time.monotonic()
        c.sendall(b"request")
        # The server's own bytes reach the client while the client's are still held.
        while server.conn is None:
            time.sleep(0.01)
        server.conn.sendall(b"hello")
        assert _recv_exactly(c, 5) == b"hello"
        assert bytes(server.received) == b""  # held back still
        assert server.wait_for(7) == b"request"
        assert server.arrivals[0][0] - sent_at >= 0.5


def test_a_delay_changed_while_running_keeps_the_order_of_the_bytes(server, proxy):
    proxy.set_delay(UP, 0.6)
    with _connect(proxy) as c:
        c.sendall(b"first")
        wait = time.monotonic() + WAIT_S
        while proxy.held(UP) < 5 and time.monotonic() < wait:
            time.sleep(0.01)
        assert proxy.held(UP) == 5
        proxy.set_delay(UP, 0)
        c.sendall(b"second")  # no delay of its own, but behind "first"
        assert server.wait_for(11) == b"firstsecond"
        c.sendall(b"third")
        assert server.wait_for(16) == b"firstsecondthird"
    assert proxy.held(UP) == 0


def test_a_blackholed_direction_throws_its_bytes_away_until_it_is_turned_off(server, proxy):
    with _connect(proxy) as c:
        c.sendall(b"a")
        assert server.wait_for(1) == b"a"
        proxy.blackhole(UP)
        c.sendall(b"lost")
        wait = time.monotonic() + WAIT_S
        while proxy.dropped[UP] < 4 and time.monotonic() < wait:
            time.sleep(0.01)
        assert proxy.dropped[UP] == 4
        server.conn.sendall(b"back")  # the other direction still flows
        assert _recv_exactly(c, 4) == b"back"
        proxy.blackhole(UP, False)
        c.sendall(b"b")
        assert server.wait_for(2) == b"ab"


def test_reset_closes_every_connection_on_both_sides_and_new_ones_are_accepted(server, proxy):
    with _connect(proxy) as c:
        c.sendall(b"a")
        assert server.wait_for(1) == b"a"
        assert proxy.reset() == 1
        assert proxy.connections() == 0
        assert c.recv(10) == b""  # the client sees its connection end
        assert server.eof.wait(WAIT_S)  # and so does the server
    with _connect(proxy) as c:  # the listener is still there
        wait = time.monotonic() + WAIT_S
        while proxy.connections() < 1 and time.monotonic() < wait:
            time.sleep(0.01)
        assert proxy.connections() == 1


def test_an_end_of_stream_follows_the_last_held_byte(server, proxy):
    proxy.set_delay(UP, 0.3)
    with _connect(proxy) as c:
        c.sendall(b"last words")
        c.shutdown(socket.SHUT_WR)
        assert server.eof.wait(WAIT_S)
        assert bytes(server.received) == b"last words"


def test_an_action_runs_once_on_the_first_large_chunk_before_it_is_forwarded(server, proxy):
    seen = []
    proxy.when(DOWN, 10, lambda: proxy.set_delay(UP, 0.4) or seen.append(bytes(server.received)))
    with _connect(proxy) as c:
        while server.conn is None:
            time.sleep(0.01)
        server.conn.sendall(b"small")
        assert _recv_exactly(c, 5) == b"small" and seen == []
        c.sendall(b"a")
        assert server.wait_for(1) == b"a"  # no delay yet
        server.conn.sendall(b"a large answer")
        assert _recv_exactly(c, 14) == b"a large answer"
        assert seen == [b"a"]
        sent_at = time.monotonic()
        c.sendall(b"b")  # meets the delay the action set
        assert server.wait_for(2) == b"ab"
        assert server.arrivals[-1][0] - sent_at >= 0.4
        server.conn.sendall(b"another large one")
        assert _recv_exactly(c, 17) == b"another large one"
        assert len(seen) == 1  # once


def test_a_held_direction_stops_reading_past_its_bound_and_loses_nothing(server):
    bound = 256 * 1024
    with TcpProxy(server.port, max_held_bytes=bound) as proxy, _connect(proxy) as c:
        proxy.set_delay(UP, 0.5)
        sent = bytes(range(256)) * 4096  # 1 MiB: four times the bound
        writer = threading.Thread(target=c.sendall, args=(sent,), daemon=True)
        writer.start()
        most = 0
        deadline = time.monotonic() + WAIT_S
        # Until all of it arrived (the kernel may take the whole 1 MiB at once, so the writer's
        # end says nothing about what the proxy still holds).
        while (len(server.received) < len(sent) or proxy.held(UP)) and time.monotonic() < deadline:
            most = max(most, proxy.held(UP))
            time.sleep(0.005)
        assert server.wait_for(len(sent)) == sent  # all of it, in order
        assert bound <= most < bound + 65_536  # it read up to the bound (one chunk past), no more
        writer.join(WAIT_S)


def test_close_releases_the_port_the_connections_and_the_thread(server):
    proxy = TcpProxy(server.port)
    port = proxy.port
    c = _connect(proxy)
    try:
        c.sendall(b"x")
        assert server.wait_for(1) == b"x"
        assert proxy.connections() == 1
        proxy.close()
        assert not proxy._thread.is_alive()
        assert c.recv(1) == b""  # the client's connection is closed
        assert server.eof.wait(WAIT_S)  # and the server's
        with socket.create_server(("127.0.0.1", port)):
            pass  # the port is free again
    finally:
        c.close()
        proxy.close()


def test_a_connection_to_a_target_that_does_not_listen_is_closed():
    with socket.create_server(("127.0.0.1", 0)) as s:
        dead_port = s.getsockname()[1]
    with TcpProxy(dead_port) as proxy, _connect(proxy) as c:
        assert c.recv(1) == b""
        assert proxy.accepted == 0


def test_bad_arguments_are_refused(proxy):
    with pytest.raises(ValueError):
        proxy.set_delay("sideways", 1)
    with pytest.raises(ValueError):
        proxy.set_delay(UP, -1)
    with pytest.raises(ValueError):
        proxy.blackhole("sideways")
    with pytest.raises(ValueError):
        proxy.when("sideways", 1, lambda: None)
