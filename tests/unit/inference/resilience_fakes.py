"""A steerable fake ``Adapter`` for the resilience tests: scripted failures and latencies, every call recorded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from examlops.inference.errors import InferenceError, Kind
from examlops.inference.ports import Call, Capabilities, Row


def failure(kind: Kind, *, retry_after_s: float | None = None) -> InferenceError:
    return InferenceError(kind, f"the backend says {kind.value}", backend="fake", retry_after_s=retry_after_s)


@dataclass
class Seen:
    route: str
    rows: list[Row]
    call: Call
    at: float
    """The event loop's time when the call came in."""


class ScriptedAdapter:
    """Answers ``{"y": 2 * x}`` per row after ``latency(n)`` seconds (n: the call's index).

    ``fail`` holds what the next calls raise, in order (``None``: answer); once it is empty every call
    answers. ``stream_fail_after`` makes ``stream_batches`` raise that error after so many chunks.
    """

    backend = "fake"

    def __init__(
        self,
        *,
        fail: Sequence[BaseException | None] = (),
        latency: Callable[[int], float] = lambda n: 0.0,
        capabilities: Capabilities | None = None,
        stream_fail_after: tuple[int, BaseException] | None = None,
    ) -> None:
        self.fail = list(fail)
        self.latency = latency
        self.capabilities = capabilities or Capabilities(native_batching=True, streaming=True)
        self.stream_fail_after = stream_fail_after
        self.calls: list[Seen] = []
        self.streams: list[Seen] = []
        self.cancelled = 0
        self.started = False
        self.closed = False

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        self.closed = True

    async def predict_batch(self, route: str, rows: Sequence[Row], call: Call) -> Sequence[Row]:
        index = len(self.calls)
        self.calls.append(Seen(route, list(rows), call, asyncio.get_running_loop().time()))
        outcome = self.fail.pop(0) if self.fail else None
        try:
            await asyncio.sleep(self.latency(index))
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if outcome is not None:
            raise outcome
        return [{"y": 2 * row["x"]} for row in rows]

    async def stream_batches(self, route: str, rows: Sequence[Row], call: Call) -> AsyncIterator[Sequence[Row]]:
        self.streams.append(Seen(route, list(rows), call, asyncio.get_running_loop().time()))
        for n, start in enumerate(range(0, len(rows), 2)):
            if self.stream_fail_after is not None and n == self.stream_fail_after[0]:
                raise self.stream_fail_after[1]
            await asyncio.sleep(self.latency(n))
            yield [{"y": 2 * row["x"]} for row in rows[start : start + 2]]


class PlainAdapter:
    """An adapter without streaming."""

    backend = "plain"
    capabilities = Capabilities()

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def predict_batch(self, route: str, rows: Sequence[Row], call: Call) -> Sequence[Row]:
        return [dict(row) for row in rows]
