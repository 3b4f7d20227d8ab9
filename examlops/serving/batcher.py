"""The feature transformer's async micro-batcher (seed 000, step 5), ordered by deadline (seed 001).

Batch contract of ``MicroBatcher`` (MLServer's adaptive batcher and Ray Serve's ``batching.py`` are the models):

- Every submitted item gets its own future; ``submit`` returns that item's result or raises its error.
- Waiting items are taken earliest ``key`` first (``submit``'s ``key``, else its ``due``, else the
  arrival time plus ``horizon_s``); equal keys in arrival order. A tight budget therefore jumps the
  queue, and work submitted with ``key=math.inf`` (offline jobs) only runs when nothing else waits,
  in batches of its own.
- A batch is flushed as soon as it holds ``max_size`` items, or ``max_wait_s`` after its first item
  arrived, or earlier when waiting longer would break the tightest ``due`` in it (less the handler
  time ``lead`` expects), whichever comes first. An item that would make the batch's handling time (as
  ``lead`` expects it) run past the tightest deadline in it waits for the next batch instead. With
  ``eager_below=N > 0`` it is also flushed as soon as no further item is queued while fewer than N
  batches are being handled: an idle handler never makes a lone request wait, and under load batches
  fill while earlier ones run. With ``max_in_flight=M > 0`` no batch is formed while M are being handled:
  the rest wait here, in deadline order, not behind them.
  With ``group`` (an item's group: on Ray, its model, whose replicas serve it alone), a batch holds the
  items of one group, and ``eager_below`` and ``max_in_flight`` count that group's batches: a group with
  M batches being handled waits here while the others' items are batched. A batch opens from the group
  queue with the earliest head among those not full (a wake-up costs per group, not per waiting item).
- An item whose ``due`` (loop time) has come when its batch is formed is not handed over: it fails with
  ``expired(item)``; with ``early_expiry``, so does one whose ``due`` would come before a batch of it alone
  is handled (as ``lead`` expects): no worker spends a batch's fixed cost on an answer nobody waits for.
  Items whose caller gave up (cancelled) are dropped too, and a batch left with none is not sent.
- The handler gets the items in queue order and returns one outcome each (an exception fails that item).
- If the handler raises, or returns the wrong number of outcomes, every item of that batch fails with
  the same error. Batches are handled concurrently: the next one is collected while earlier ones run.
- If the batching task dies, every waiting item fails (no caller hangs) and later submits are refused.
- ``close`` refuses new items and fails the waiting ones with ``NotReady``; batches already handed to
  the handler get ``grace_s`` to finish, then they are cancelled and their items fail too.

Futures and timers are made on the running loop (``start``), never in ``__init__``. The queue entries and
the flush and fit rules are ``serving.waiters``; the heaps by group ``serving.queues``, whose ``ledger`` is the queue as
arrays for admission (``serving.ledger``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

from examlops.core.errors import ExamlopsError, NotReady
from examlops.serving.queues import GroupQueues
from examlops.serving.waiters import InFlight, Waiter, fail_all, fits, flush_time

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")
BatchHandler = Callable[[Sequence[T]], Awaitable[Sequence[R | BaseException]]]


class MicroBatcher(Generic[T, R]):
    """Collects submitted items into batches and hands each batch to ``handler`` (contract above)."""

    def __init__(
        self,
        handler: BatchHandler[T, R],
        *,
        max_size: int,
        max_wait_s: float,
        eager_below: int = 0,
        max_in_flight: int = 0,
        horizon_s: float = 30.0,
        expired: Callable[[T], BaseException] | None = None,
        lead: Callable[[Sequence[T]], float] | None = None,
        early_expiry: bool = False,
        group: Callable[[T], Hashable] | None = None,
        tally: Callable[[T], str] | None = None,
        name: str = "batcher",
    ):
        if max_size < 1 or max_wait_s < 0 or eager_below < 0 or max_in_flight < 0 or horizon_s < 0:
            raise ValueError("max_size must be >= 1; max_wait_s, eager_below, max_in_flight and horizon_s >= 0")
        self._handler = handler
        self._max_size = max_size
        self._max_wait_s = max_wait_s
        self._eager_below = eager_below
        self._max_in_flight = max_in_flight
        self._horizon_s = horizon_s
        self._lead = lead
        self._name = name
        self._queues: GroupQueues[T, R] = GroupQueues(
            expired=expired or (lambda item: NotReady("the deadline passed while the item was queued")),
            lead=lead,
            early_expiry=early_expiry,
            group=group,
            tally=tally or (lambda item: ""),
        )
        # The waiting items in queue order, tallied by ``tally``: what admission reads.
        self.ledger = self._queues.ledger
        self._seq = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._collecting: list[Waiter[T, R]] = []
        self._in_flight: dict[asyncio.Task[None], InFlight[T]] = {}
        self._groups: dict[asyncio.Task[None], Hashable] = {}
        self._busy: Counter[Hashable] = Counter()  # batches being handled, by group (all in None without)
        self._closed = False
        self._died: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done() and not self._closed

    def queued(self, key: float = math.inf) -> list[T]:
        """The items waiting (not yet handed over) whose key is at most ``key``: what a new one would wait behind."""
        queues = itertools.chain(self._collecting, self._queues.waiting())
        return [waiter.item for waiter in queues if waiter.key <= key and not waiter.future.done()]

    def forming(self) -> list[tuple[float, float, T]]:
        """``(key, due, item)`` of the items of the batch being formed: taken from the queue, not yet handed over."""
        return [(waiter.key, waiter.due, waiter.item) for waiter in self._collecting if not waiter.future.done()]

    def in_flight(self) -> list[InFlight[T]]:
        """The batches being handled now, oldest first."""
        return list(self._in_flight.values())

    def start(self) -> None:
        """Start the batching task on the running loop; idempotent."""
        if self._closed:
            raise NotReady(f"{self._name} is closed")
        if self._task is None:
            self._loop = asyncio.get_running_loop()
            self._task = self._loop.create_task(self._run(), name=self._name)
            self._task.add_done_callback(self._on_task_done)

    async def submit(self, item: T, *, due: float | None = None, key: float | None = None) -> R:
        """Wait for ``item``'s outcome; ``NotReady`` once closed, ``ExamlopsError`` once the task died.

        ``due``: the loop time after which the item is not handed over (it fails with ``expired``);
        ``key``: its place in the queue (default ``due``, else now + ``horizon_s``).
        """
        if self._died is not None:
            raise ExamlopsError(f"{self._name} stopped: {type(self._died).__name__}") from self._died
        self.start()
        assert self._loop is not None
        future: asyncio.Future[R] = self._loop.create_future()
        if key is None:
            key = due if due is not None else self._loop.time() + self._horizon_s
        waiter = Waiter(key, next(self._seq), item, future, math.inf if due is None else due)
        self._queues.push(waiter)
        self._poke()
        try:
            return await future
        except asyncio.CancelledError:
            self.ledger.discard(waiter.key, waiter.seq)  # its caller gave up: no longer work ahead of anyone
            raise
        finally:
            # A failed future keeps its exception, whose traceback keeps this frame: without these names the
            # two make no reference cycle, and a refused call's objects go at once, not at a collection.
            del future, waiter

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

    def _poke(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def _sleep(self, until: float) -> None:
        """Until something is submitted, a batch finishes, or loop time ``until`` (``math.inf``: no timer)."""
        assert self._loop is not None
        wake = self._wake = self._loop.create_future()
        timer = None if until == math.inf else self._loop.call_at(until, self._poke)
        try:
            await wake
        finally:
            self._wake = None
            if timer is not None:
                timer.cancel()

    def _full(self, group: Hashable) -> bool:
        return self._max_in_flight > 0 and self._busy[group] >= self._max_in_flight

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while (heap := self._queues.opening(self._full)) is None:
                await self._sleep(math.inf)  # until a submit or a batch that ends
            first = self._queues.take(heap, loop.time())
            if first is None:
                continue
            group = self._queues.group_of(first)
            batch = self._collecting = [first]
            opened = loop.time()
            flush_at = flush_time(batch, opened, self._max_wait_s, self._lead)
            while len(batch) < self._max_size:
                now = loop.time()
                # Under load the queue already holds the next items: take them without arming a timer.
                if heap:
                    waiter = self._queues.take(heap, now)
                    if waiter is None:
                        continue
                    # Background work never rides in an interactive batch; a call that does not fit waits.
                    background = waiter.key == math.inf and first.key != math.inf
                    if background or not fits(batch, waiter, now, self._lead):
                        self._queues.push(waiter)  # it waits for the next batch
                        break
                    batch.append(waiter)
                    if waiter.due < flush_at:
                        flush_at = flush_time(batch, opened, self._max_wait_s, self._lead)
                    continue
                if self._busy[group] < self._eager_below or now >= flush_at:
                    break
                await self._sleep(flush_at)
            self._collecting = []
            live = [waiter for waiter in batch if not waiter.future.done()]
            if live:
                task = loop.create_task(self._handle(live), name=f"{self._name}-batch")
                self._in_flight[task] = InFlight(loop.time(), [waiter.item for waiter in live])
                self._groups[task] = group
                self._busy[group] += 1
                task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._in_flight.pop(task, None)
        if task in self._groups:
            self._busy[self._groups.pop(task)] -= 1
        self._poke()

    async def _handle(self, batch: list[Waiter[T, R]]) -> None:
        try:
            outcomes = await self._handler([waiter.item for waiter in batch])
            if len(outcomes) != len(batch):
                raise ExamlopsError(f"{self._name}: the handler returned {len(outcomes)} outcomes for {len(batch)}")
        except asyncio.CancelledError:
            fail_all(batch, NotReady(f"{self._name} closed before the batch finished"))
            raise
        except Exception as exc:
            log.warning("%s: a batch of %d failed: %r", self._name, len(batch), exc)
            fail_all(batch, exc)
            return
        for waiter, outcome in zip(batch, outcomes, strict=True):
            if waiter.future.done():
                continue
            if isinstance(outcome, BaseException):
                waiter.future.set_exception(outcome)
            else:
                waiter.future.set_result(outcome)

    def _fail_waiting(self, error: BaseException) -> None:
        waiting, self._collecting = self._collecting, []
        fail_all(waiting + self._queues.clear(), error)

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if self._closed:
            return
        cause: BaseException = asyncio.CancelledError() if task.cancelled() else (task.exception() or RuntimeError())
        log.error("%s: the batching task died; failing every waiting request", self._name, exc_info=cause)
        self._died = cause
        error = ExamlopsError(f"{self._name} stopped: {type(cause).__name__}")
        error.__cause__ = cause
        self._fail_waiting(error)
