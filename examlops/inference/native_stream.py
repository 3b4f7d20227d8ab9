"""``native_stream``: a streaming backend's own stream, re-chunked to the caller's chunk size.

Contract (the port's ``predict_stream`` when ``capabilities.streaming``):

- The backend gets consecutive windows of at most ``capabilities.max_batch`` rows (all of them without a
  cap), one ``stream_batches`` after the other under the same deadline; each window must answer exactly its
  rows, else VALIDATION ``inference_output_invalid`` (more outputs than rows, or a stream that ended early).
- It yields one ``list[O]`` per chunk of ``size`` rows, in order. Every chunk boundary checks the deadline
  (``Kind.TIMEOUT`` once it has passed, even for outputs already received) and is a cancellation point;
  each wait for the backend is held to what remains of the deadline (``BackendCalls.bounded``).
- Every backend call carries ``Call.stream`` and ``options["chunk_size"]`` (the chunk size, at most the cap).
- One ``Capture`` per chunk, with the error of a chunk that failed. Closing the generator early closes the
  backend's stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import Any

from examlops.inference.backend_calls import BackendCalls
from examlops.inference.errors import InferenceError
from examlops.inference.ports import Call, Row, StreamingAdapter
from examlops.inference.shaping import output_models
from examlops.inference.spec import I, O


async def native_stream(
    calls: BackendCalls[I, O], adapter: StreamingAdapter, rows: list[dict[str, Any]], size: int, call: Call
) -> AsyncGenerator[list[O], None]:
    """The adapter's own stream of ``rows``, re-chunked to ``size``, checked and shaped chunk by chunk."""
    if not rows:
        return
    cap = adapter.capabilities.max_batch
    stream_call = Call(
        route=call.route,
        deadline=call.deadline,
        criticality=call.criticality,
        trace_id=call.trace_id,
        options={**call.options, "chunk_size": min(size, cap) if cap else size},
        stream=True,
    )
    stream = _windowed(calls, adapter, rows, stream_call, cap or len(rows))
    pending: list[Row] = []
    done = 0
    started = time.monotonic()
    try:
        while done < len(rows):
            chunk_rows = rows[done : done + size]
            try:
                calls.remaining(call)  # a deadline check at every boundary, even for outputs already here
            except InferenceError as late:
                calls.capture(call, chunk_rows, None, started, late)
                raise
            while len(pending) < len(chunk_rows):
                pending.extend(await _next(calls, stream, call, rows[done + len(pending) :], started))
            yield calls.shaped(call, chunk_rows, pending[: len(chunk_rows)], started)
            pending = pending[len(chunk_rows) :]
            done += len(chunk_rows)
            started = time.monotonic()
            await asyncio.sleep(0)  # a cancellation point at every boundary
        if pending or await _has_more(stream, call):
            extra = calls.miscount(f"the {calls.backend} backend streamed more outputs than the {len(rows)} instances")
            calls.capture(call, [], None, started, extra)
            raise extra
    finally:
        await _closed(stream)


async def _windowed(
    calls: BackendCalls[I, O], adapter: StreamingAdapter, rows: list[dict[str, Any]], call: Call, window: int
) -> AsyncGenerator[Sequence[Row], None]:
    """The adapter's streams over consecutive windows of at most ``window`` rows (its ``max_batch``),
    one after the other, each held to exactly one output per row of its window."""
    for start in range(0, len(rows), window):
        part = rows[start : start + window]
        stream = adapter.stream_batches(calls.spec.name, part, call)
        got = 0
        try:
            async for chunk in stream:
                if isinstance(chunk, Mapping) or not isinstance(chunk, Sequence):
                    yield chunk  # _next judges it
                    return
                got += len(chunk)
                if got > len(part):
                    raise calls.miscount(
                        f"the {calls.backend} backend streamed more outputs than the {len(part)} instances sent"
                    )
                yield chunk
        finally:
            await _closed(stream)
        if got < len(part):
            raise calls.miscount(_unanswered(calls, len(part) - got))


async def _next(
    calls: BackendCalls[I, O],
    stream: AsyncIterator[Sequence[Row]],
    call: Call,
    left: list[dict[str, Any]],
    started: float,
) -> Sequence[Row]:
    try:
        got = await calls.bounded(
            call, lambda: anext(stream), ended=lambda: calls.miscount(_unanswered(calls, len(left)))
        )
        if isinstance(got, Mapping) or not isinstance(got, Sequence):
            output_models(calls.spec, got, expected=len(left), backend=calls.backend)  # raises: not a list
        return got
    except InferenceError as error:
        calls.capture(call, left, None, started, error)
        raise


async def _has_more(stream: AsyncIterator[Sequence[Row]], call: Call) -> bool:
    try:
        async with asyncio.timeout(call.remaining_s()):
            extra = await anext(stream)
    except (StopAsyncIteration, TimeoutError):
        return False
    return len(extra) > 0


def _unanswered(calls: BackendCalls[I, O], count: int) -> str:
    return f"the {calls.backend} backend's stream ended with {count} instances unanswered"


async def _closed(stream: AsyncIterator[Sequence[Row]]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()
