"""Loopback HTTP/1.1 servers for the bridge's hop tests: keep-alive, scripted answers, closes and resets."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Callable

Answer = Callable[[bytes], bytes | tuple[bytes, ...] | None]
"""What the server writes for one request's body: bytes, or a tuple of separate writes 10 ms apart; None:
nothing (and the connection is kept)."""


def reply(body: bytes, *, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
        len(body),
        extra,
        body,
    )


@contextlib.asynccontextmanager
async def server(
    answer: Answer, *, close_after: bool = False, reset: bool = False
) -> AsyncIterator[tuple[str, list[int], list[bytes]]]:
    """A loopback server answering each request with ``answer(body)``.

    Yields its base URL, the count of requests per connection and the bodies received, in order.

    ``close_after``: close each connection after its first answer; ``reset``: abort it (RST) instead.
    """
    counts: list[int] = []
    bodies: list[bytes] = []
    writers: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        counts.append(0)
        mine = len(counts) - 1
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                length = next(int(h.split(b":")[1]) for h in lines if h.lower().startswith(b"content-length"))
                body = await reader.readexactly(length)
                bodies.append(body)
                counts[mine] += 1
                out = answer(body)
                for chunk in (out,) if isinstance(out, bytes) else out or ():
                    writer.write(chunk)
                    await writer.drain()
                    if not isinstance(out, bytes):
                        await asyncio.sleep(0.01)
                if reset:
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    return
                if close_after:
                    writer.close()
                    return

    listening = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{listening.sockets[0].getsockname()[1]}", counts, bodies
    finally:
        for writer in writers:
            writer.close()
        listening.close()
        await listening.wait_closed()
