"""``MlflowGate``: a TCP proxy in front of a real MLflow server that fails it the ways an outage looks from a
client, from the start or at a write (``fail_at_write``: the first write, or with ``write_path`` the first
write to that path, once what comes before it is answered).

- ``down``: the server is stopped: the connection carrying the write is reset unanswered and the port refuses
  every connection after it;
- ``blackhole``: the server is unreachable: the port still accepts (the kernel's backlog) but nothing reads
  what is sent and nothing ever answers;
- ``lost`` (at a write only): the write reaches the server, which applies it, and the connection is reset
  before its answer gets back; the port refuses every connection after it (the server stopped just then).

Outside ``lost``, a write never reaches the server once the gate has failed, so the registry cannot have
moved behind it.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from typing import Literal

Mode = Literal["open", "down", "blackhole", "lost"]
WRITES = (b"POST ", b"PUT ", b"PATCH ", b"DELETE ")


class MlflowGate:
    def __init__(
        self, upstream_port: int, mode: Mode = "open", *, fail_at_write: Mode | None = None, write_path: str = ""
    ) -> None:
        self.upstream_port = upstream_port
        self.fail_at_write = fail_at_write
        self.write_path = write_path.encode()
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.listener.settimeout(0.05)
        self.port: int = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.mode: Mode = "open"
        self.writes_held = 0
        """Write requests the gate kept from the server."""
        self.writes_lost = 0
        """Write requests the server was given and whose answer the gate dropped (``lost``)."""
        self._held: list[socket.socket] = []
        self._losing: socket.socket | None = None
        self._closed = threading.Event()
        self._fail(mode)
        threading.Thread(target=self._accept, daemon=True).start()

    def _fail(self, mode: Mode) -> None:
        self.mode = mode
        if mode in ("down", "lost"):
            self.listener.close()  # the port refuses from now on

    def _accept(self) -> None:
        while not self._closed.is_set():
            if self.mode != "open":
                self._closed.wait(0.05)  # blackhole: never accepted, never read; down: the listener is closed
                continue
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._forward, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._back, args=(upstream, client), daemon=True).start()

    def _forward(self, client: socket.socket, upstream: socket.socket) -> None:
        while True:
            try:
                data = client.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            to_fail = self.mode == "open" and self.fail_at_write is not None and data.startswith(WRITES)
            if to_fail and self.fail_at_write and self.write_path in data.split(b"\r\n", 1)[0]:
                self._fail(self.fail_at_write)
                if self.mode == "lost":
                    self.writes_lost += 1
                    self._losing = client  # its answer is dropped and the connection reset (_back)
            if self.mode == "lost" and client is self._losing:
                upstream.sendall(data)  # the rest of the write's body
                continue
            if self.mode != "open":
                self.writes_held += data.startswith(WRITES)
                upstream.close()
                if self.mode in ("down", "lost"):  # reset, unanswered
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    client.close()
                else:
                    self._held.append(client)  # open, never read again, never answered
                return
            upstream.sendall(data)
        upstream.close()

    def _back(self, upstream: socket.socket, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                if client is self._losing:  # the server answered the write: drop it, reset the caller
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    client.close()
                    upstream.close()
                    return
                client.sendall(data)
        if self.mode == "open":  # a black hole never closes what it holds
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self.listener.close()
        for held in self._held:
            held.close()
