"""The fault proxy against a real TCP echo server on loopback: each switch does what its contract says."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from tests.faults.proxy import FaultProxy


class EchoServer:
    """Echoes every byte back; closes its side when the client half-closes, after ``close_after`` replies."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                conn.sendall(data)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


@pytest.fixture
def proxy(echo: EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", echo.port, seed=1) as p:
        yield p


def connect(proxy: FaultProxy, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(proxy.address, timeout=timeout)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        if not chunk:
            break
        got += chunk
    return got


def test_without_faults_bytes_go_both_ways_unchanged_and_eof_is_passed_on(proxy: FaultProxy) -> None:
    payload = bytes(range(256)) * 1000
    with connect(proxy) as sock:
        sock.sendall(payload)
        assert recv_exactly(sock, len(payload)) == payload
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(1) == b""  # the echo server closed after our EOF, and that came through
    assert proxy.stats.forwarded_bytes == 2 * len(payload)


def test_latency_holds_each_chunk_back_without_losing_or_reordering_any(proxy: FaultProxy) -> None:
    proxy.latency_s, proxy.jitter_s = 0.4, 0.1
    with connect(proxy) as sock:
        for i in range(5):
            sock.sendall(b"%d;" % i)
        sock.settimeout(0.05)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # nothing yet: every chunk waits at least 2 x 0.4 s (there and back)
        sock.settimeout(5)
        assert recv_exactly(sock, 10) == b"0;1;2;3;4;"


def test_a_black_hole_accepts_and_holds_then_delivers_what_waited_when_lifted(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    proxy.blackhole = True
    with connect(proxy) as sock:  # the connection is accepted...
        sock.sendall(b"held")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(4)  # ...and nothing comes back
        assert echo.accepted == 0
        proxy.blackhole = False
        sock.settimeout(5)
        assert recv_exactly(sock, 4) == b"held"


def test_a_black_hole_holds_live_connections_too(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"a")
        assert recv_exactly(sock, 1) == b"a"
        proxy.blackhole = True
        sock.sendall(b"b")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(1)
        proxy.blackhole = False
        sock.settimeout(5)
        assert recv_exactly(sock, 1) == b"b"


def test_reset_all_resets_live_connections(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"x")
        assert recv_exactly(sock, 1) == b"x"
        proxy.reset_all()
        with pytest.raises(ConnectionResetError):
            sock.sendall(b"y" * 100)
            sock.recv(1)
    assert proxy.stats.resets == 1


def test_new_connections_are_reset_while_reset_new_is_on(proxy: FaultProxy, echo: EchoServer) -> None:
    proxy.reset_new = True
    with pytest.raises(ConnectionResetError), connect(proxy) as sock:  # the reset may beat connect() back
        sock.recv(1)
    assert echo.accepted == 0
    proxy.reset_new = False
    with connect(proxy) as sock:
        sock.sendall(b"ok")
        assert recv_exactly(sock, 2) == b"ok"


def test_a_byte_limit_delivers_up_to_the_limit_then_resets(proxy: FaultProxy) -> None:
    proxy.byte_limit = 1500  # 1000 bytes up, then 500 of the echo back
    with connect(proxy) as sock:
        sock.sendall(b"z" * 1000)
        got = b""
        with pytest.raises(ConnectionResetError):
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                got += chunk
        assert set(got) <= {ord("z")} and len(got) <= 500  # a reset may discard what was still unread
    assert proxy.stats.forwarded_bytes == 1500
    assert proxy.stats.resets == 1


def test_a_slow_close_passes_the_eof_on_late(proxy: FaultProxy) -> None:
    proxy.slow_close_s = 0.5
    with connect(proxy) as sock:
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(0.2)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # the echo server has not even seen our EOF yet
        sock.settimeout(5)
        assert sock.recv(1) == b""


def test_an_upstream_that_refuses_resets_the_client_and_the_proxy_carries_on() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    with FaultProxy("127.0.0.1", dead_port) as proxy:
        for _ in range(2):
            with pytest.raises(ConnectionResetError), connect(proxy) as sock:
                sock.recv(1)
        assert proxy.stats.accepted == 2
