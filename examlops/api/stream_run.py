"""One streamed call: its instances submitted to the pipeline chunk by chunk, answered as NDJSON lines.

``StreamRun`` cuts the requests into chunks of ``size`` (the micro-batch size) and keeps at most
``window`` chunks submitted ahead of the one being answered, so the batcher stays fed while admission
sees only the work actually queued. Contract:

- ``first()`` asks admission once for the whole stream, on an estimate for chunk 0's rows together
  (``admit``), before any request is submitted: a refusal is raised with nothing queued. Every request is
  then sent ``admitted``, so no later chunk is refused early on its own. ``first()`` then awaits chunk 0;
  any error of it (a bad instance, a model failure, a late refusal) cancels every submitted request and is
  raised. The route answers either as a single call's error, before any line.
- ``lines()`` then yields chunk 0 and each later chunk IN ORDER, one JSON line each (``StreamChunk``), and
  always a last line (``StreamEnd``). Every chunk boundary checks the deadline: once it has passed, or a
  chunk's deadline came while it was queued (refused late), the work still queued is cancelled and the
  last line says ``expired``; another error ends the stream with the error, naming the instance.
- ``cancel()`` cancels every request still pending (the batcher drops a cancelled request before any
  worker sees it). ``NdjsonStream`` calls it whenever the response ends: the client disconnected, the
  send failed, or the stream finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from examlops.api.errors import error_reply
from examlops.api.schemas import ErrorReply, StreamChunk, StreamEnd
from examlops.core.budget import remaining_ms
from examlops.core.errors import DeadlineExceeded, ExamlopsError, Refused
from examlops.core.messages import InferenceRequest, InferenceResult

log = logging.getLogger(__name__)

NDJSON = "application/x-ndjson"

Infer = Callable[[InferenceRequest], Coroutine[Any, Any, InferenceResult]]
Admit = Callable[[InferenceRequest, int], object]
"""Admission of a call of ``rows`` rows like the request (``serving.pipeline.Pipeline.admit``): raises
``Refused`` when it cannot be answered within its budget."""
Outcome = InferenceResult | BaseException
E = TypeVar("E", bound=BaseException)


class StreamRun:
    """The chunks of one stream in flight (contract above)."""

    def __init__(
        self,
        infer: Infer,
        requests: Sequence[InferenceRequest],
        *,
        admit: Admit,
        size: int,
        window: int,
        deadline: float | None,
        budget_ms: float | None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._infer = infer
        self._admit = admit
        admitted = [replace(request, admitted=True) for request in requests]
        self._chunks = [admitted[i : i + size] for i in range(0, len(admitted), size)]
        self._size = size
        self._window = max(1, window)
        self._deadline = deadline
        self._budget_ms = budget_ms
        self._wall = wall
        self._submitted: list[list[asyncio.Task[InferenceResult]]] = []
        self.total = len(requests)
        self.answered = 0
        self._head: list[InferenceResult] = []
        self.ended: str | None = "client_disconnected"
        """The code the stream stopped early with: ``refused`` when it expired, ``client_disconnected`` until
        its last line is sent; None when it answered every instance."""

    def _fill(self, upto: int) -> None:
        """Submit every chunk below ``upto``: the one being answered and the window ahead of it."""
        loop = asyncio.get_running_loop()
        while len(self._submitted) < min(upto, len(self._chunks)):
            chunk = self._chunks[len(self._submitted)]
            self._submitted.append([loop.create_task(self._infer(req)) for req in chunk])

    async def _outcomes(self, n: int) -> list[Outcome]:
        self._fill(n + 1 + self._window)
        return list(await asyncio.gather(*self._submitted[n], return_exceptions=True))

    def _error(self, n: int, outcomes: Sequence[Outcome]) -> tuple[int, BaseException] | None:
        """The index and error of the instance that fails chunk ``n``: a model failure first, else the first."""
        failed = [(n * self._size + i, o) for i, o in enumerate(outcomes) if isinstance(o, BaseException)]
        for index, error in failed:
            if isinstance(error, ExamlopsError) and error.model_failure:
                return index, error
        return failed[0] if failed else None

    async def first(self) -> list[InferenceResult]:
        """Chunk 0's results; a refusal raised before anything is submitted; an instance's error raised (and
        everything cancelled) when one instance of chunk 0 failed."""
        if self._chunks:
            self._admit(self._chunks[0][0], len(self._chunks[0]))
        try:
            outcomes = await self._outcomes(0)
        except BaseException:
            self.cancel()
            raise
        failure = self._error(0, outcomes)
        if failure is not None:
            self.cancel()
            raise _located(*failure)
        self._head = [o for o in outcomes if isinstance(o, InferenceResult)]
        return self._head

    async def lines(self) -> AsyncGenerator[bytes, None]:
        """Every line after ``first()``: the chunks in order, then the last line (contract above)."""
        yield self._line(0, self._head)
        end: StreamEnd | None = None
        for n in range(1, len(self._chunks)):
            if self._deadline is not None and self._wall() >= self._deadline:
                end = self._end(expired=True)
                break
            outcomes = await self._outcomes(n)
            failure = self._error(n, outcomes)
            if failure is not None:
                index, error = failure
                if isinstance(error, Refused | DeadlineExceeded):
                    end = self._end(expired=True)
                elif isinstance(error, ExamlopsError):
                    located = _located(index, error)
                    end = self._end(error=error_reply(located))
                else:  # the headers are sent: the stream can only end, with the error the app gives any bug
                    log.error("instance %d of a stream failed", index, exc_info=error)
                    end = self._end(error=ErrorReply(error="internal error", code="internal_error"))
                break
            yield self._line(n, [o for o in outcomes if isinstance(o, InferenceResult)])
        self.cancel()
        end = end or self._end()
        yield end.model_dump_json().encode() + b"\n"
        self.ended = "refused" if end.expired else None if end.error is None else end.error.code

    def _line(self, n: int, results: Sequence[InferenceResult]) -> bytes:
        start = n * self._size
        self.answered = start + len(results)
        job_ids = [req.job_id for req in self._chunks[n]]
        chunk = StreamChunk(
            chunk=n,
            start=start,
            predictions=[r.prediction for r in results],
            model=results[0].model,
            alias=results[0].alias,
            versions=[r.version for r in results],
            job_ids=job_ids if any(j is not None for j in job_ids) else None,
            budget_remaining_ms=remaining_ms(self._deadline, self._wall()),
        )
        return chunk.model_dump_json(exclude_none=True).encode() + b"\n"

    def _end(self, *, expired: bool = False, error: ErrorReply | None = None) -> StreamEnd:
        return StreamEnd(
            answered=self.answered,
            instances=self.total,
            expired=expired,
            budget_ms=self._budget_ms,
            budget_remaining_ms=remaining_ms(self._deadline, self._wall()),
            error=error,
        )

    def cancel(self) -> None:
        """Cancel every request still pending; idempotent. The outcomes nobody will read are marked read,
        so a refusal that came back for a chunk no longer wanted is not logged as an unhandled error."""
        for chunk in self._submitted:
            for task in chunk:
                if task.done():
                    _read(task)
                else:
                    task.cancel()
                    task.add_done_callback(_read)


def _read(task: asyncio.Task[InferenceResult]) -> None:
    if not task.cancelled():
        task.exception()


def _located(index: int, error: E) -> E:
    """``error`` with its field named inside the stream's body (``instances.<index>.<field>``)."""
    if isinstance(error, ExamlopsError) and error.field is not None:
        error.field = f"instances.{index}.{error.field}"
    return error


class NdjsonStream(StreamingResponse):
    """The reply of a stream that started: its lines, and ``run.cancel()`` however the response ends."""

    def __init__(self, run: StreamRun, on_end: Callable[[StreamRun], None]) -> None:
        self._lines = run.lines()
        super().__init__(self._lines, media_type=NDJSON)
        self._run = run
        self._on_end = on_end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._run.cancel()
            with contextlib.suppress(Exception):
                await self._lines.aclose()
            self._on_end(self._run)
