"""The feature transformer's async micro-batcher (seed 000, step 5).

Batch contract of ``MicroBatcher`` (MLServer's adaptive batcher and Ray Serve's
``batching.py`` are the models):

- Every submitted item gets its own future; ``submit`` returns that item's result or raises its error.
- A batch is flushed as soon as it holds ``max_size`` items, or ``max_wait_s`` after its first item
  arrived, whichever comes first. With ``eager_below=N > 0`` it is also flushed as soon as no further
  item is queued while fewer than N batches are being handled: an idle handler never makes a lone
  request wait, and under load batches fill while earlier ones run. A batch is never empty: items
  whose caller gave up (cancelled) are dropped before the handler sees them, and a batch left with
  none is not sent.
- The handler gets the items in arrival order and returns one outcome per item, in the same order. An
  outcome that is an exception fails that item alone.
- If the handler raises, or returns the wrong number of outcomes, every item of that batch fails with
  the same error. Batches are handled concurrently: the next one is collected while earlier ones run.
- If the batching task dies, every waiting item fails (no caller hangs) and later submits are refused.
- ``close`` refuses new items and fails the waiting ones with ``NotReady``; batches already handed to
  the handler get ``grace_s`` to finish, then they are cancelled and their items fail too.

Queues and futures are created on the running loop (``start``), never in ``__init__``: a batcher built
outside a loop must not bind to the wrong one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from examlops.core.errors import ExamlopsError, NotReady

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")
BatchHandler = Callable[[Sequence[T]], Awaitable[Sequence[R | BaseException]]]


@dataclass(slots=True)
class _Waiter(Generic[T, R]):
    item: T
    future: asyncio.Future[R]


def _fail(waiters: Sequence[_Waiter[Any, Any]], error: BaseException) -> None:
    for waiter in waiters:
        if not waiter.future.done():
            waiter.future.set_exception(error)


class MicroBatcher(Generic[T, R]):
    """Collects submitted items into batches and hands each batch to ``handler`` (contract above)."""

    def __init__(
        self,
        handler: BatchHandler[T, R],
        *,
        max_size: int,
        max_wait_s: float,
        eager_below: int = 0,
        name: str = "batcher",
    ):
        if max_size < 1 or max_wait_s < 0 or eager_below < 0:
            raise ValueError("max_size must be >= 1, max_wait_s and eager_below >= 0")
        self._handler = handler
        self._max_size = max_size
        self._max_wait_s = max_wait_s
        self._eager_below = eager_below
        self._capacity: asyncio.Event | None = None
        self._name = name
        self._queue: asyncio.Queue[_Waiter[T, R]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._collecting: list[_Waiter[T, R]] = []
        self._in_flight: dict[asyncio.Task[None], list[_Waiter[T, R]]] = {}
        self._closed = False
        self._died: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done() and not self._closed

    def start(self) -> None:
        """Start the batching task on the running loop; idempotent."""
        if self._closed:
            raise NotReady(f"{self._name} is closed")
        if self._task is None:
            self._queue = asyncio.Queue()
            self._capacity = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)
            self._task.add_done_callback(self._on_task_done)

    async def submit(self, item: T) -> R:
        """Wait for ``item``'s outcome; ``NotReady`` once closed, ``ExamlopsError`` once the task died."""
        if self._died is not None:
            raise ExamlopsError(f"{self._name} stopped: {type(self._died).__name__}") from self._died
        self.start()
        assert self._queue is not None
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Waiter(item, future))
        return await future

    async def close(self, grace_s: float = 0.0) -> None:
        """Refuse new items, fail the waiting ones, give batches in flight ``grace_s`` to finish."""
        if self._closed:
            return
        self._closed = True
        closing = NotReady(f"{self._name} is closing")
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._fail_waiting(closing)
        if self._in_flight:
            tasks = list(self._in_flight)
            _, late = await asyncio.wait(tasks, timeout=grace_s) if grace_s > 0 else (set(), set(tasks))
            for task in late:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self) -> None:
        assert self._queue is not None
        queue = self._queue
        loop = asyncio.get_running_loop()
        while True:
            batch = self._collecting = [await queue.get()]
            flush_at = loop.time() + self._max_wait_s
            while len(batch) < self._max_size:
                # Under load the queue already holds the next items: take them without arming a timer.
                if not queue.empty():
                    batch.append(queue.get_nowait())
                    continue
                if len(self._in_flight) < self._eager_below:
                    break
                try:
                    item = await self._next_or_capacity(queue, flush_at)
                except TimeoutError:
                    break
                if item is None:
                    continue
                batch.append(item)
            self._collecting = []
            live = [waiter for waiter in batch if not waiter.future.done()]
            if live:
                task = loop.create_task(self._handle(live), name=f"{self._name}-batch")
                self._in_flight[task] = live
                task.add_done_callback(self._forget)

    async def _next_or_capacity(self, queue: asyncio.Queue[_Waiter[T, R]], flush_at: float) -> _Waiter[T, R] | None:
        """The next queued item; None as soon as a running batch finishes first (eager mode only);
        ``TimeoutError`` at ``flush_at``.

        Nothing here is cancelled from outside on a timeout: an item that ``queue.get`` has already taken
        must reach the batch, or its caller would wait for ever. ``asyncio.wait`` with a timeout cancels
        nothing, and a ``queue.get`` that has not returned yet gives nothing up when it is cancelled.
        """
        remaining = flush_at - asyncio.get_running_loop().time()
        if remaining <= 0:
            raise TimeoutError
        getter = asyncio.ensure_future(queue.get())
        waiting: set[asyncio.Future[Any]] = {getter}
        freed: asyncio.Future[Any] | None = None
        if self._eager_below > 0 and self._capacity is not None:
            self._capacity.clear()
            freed = asyncio.ensure_future(self._capacity.wait())
            waiting.add(freed)
        try:
            await asyncio.wait(waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            # Cancelled (the batcher is closing): keep a taken item where close() fails it.
            if getter.done() and not getter.cancelled():
                self._collecting.append(getter.result())
            raise
        finally:
            if freed is not None:
                freed.cancel()
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            return getter.result()
        if freed is not None and freed.done():
            return None
        raise TimeoutError

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._in_flight.pop(task, None)
        if self._capacity is not None:
            self._capacity.set()

    async def _handle(self, batch: list[_Waiter[T, R]]) -> None:
        try:
            outcomes = await self._handler([waiter.item for waiter in batch])
            if len(outcomes) != len(batch):
                raise ExamlopsError(f"{self._name}: the handler returned {len(outcomes)} outcomes for {len(batch)}")
        except asyncio.CancelledError:
            _fail(batch, NotReady(f"{self._name} closed before the batch finished"))
            raise
        except Exception as exc:
            log.warning("%s: a batch of %d failed: %r", self._name, len(batch), exc)
            _fail(batch, exc)
            return
        for waiter, outcome in zip(batch, outcomes, strict=True):
            if waiter.future.done():
                continue
            if isinstance(outcome, BaseException):
                waiter.future.set_exception(outcome)
            else:
                waiter.future.set_result(outcome)

    def _fail_waiting(self, error: BaseException) -> None:
        waiting = self._collecting
        self._collecting = []
        if self._queue is not None:
            while not self._queue.empty():
                waiting.append(self._queue.get_nowait())
        _fail(waiting, error)

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if self._closed:
            return
        cause: BaseException = asyncio.CancelledError() if task.cancelled() else (task.exception() or RuntimeError())
        log.error("%s: the batching task died; failing every waiting request", self._name, exc_info=cause)
        self._died = cause
        error = ExamlopsError(f"{self._name} stopped: {type(cause).__name__}")
        error.__cause__ = cause
        self._fail_waiting(error)
