"""The micro-batcher's contract."""

from __future__ import annotations

import asyncio
import gc
import math
import weakref
from collections.abc import Sequence

import pytest

from examlops.core.errors import ExamlopsError, InvalidInput, NotReady
from examlops.serving.batcher import MicroBatcher

# The batcher's clock is its event loop's: on looptime's virtual clock every wait below is exact and instant.
pytestmark = pytest.mark.looptime


class Doubler:
    """A handler that records its batches; odd values fail alone when ``odd_fails``."""

    def __init__(self, *, odd_fails: bool = False, gate: asyncio.Event | None = None) -> None:
        self.batches: list[list[int]] = []
        self.odd_fails = odd_fails
        self.gate = gate

    async def __call__(self, items: Sequence[int]) -> list[int | BaseException]:
        self.batches.append(list(items))
        if self.gate is not None:
            await self.gate.wait()
        return [InvalidInput("odd", field="x") if self.odd_fails and i % 2 else i * 2 for i in items]


async def test_batch_flushes_at_size() -> None:
    handler = Doubler()
    batcher: MicroBatcher[int, int] = MicroBatcher(handler, max_size=4, max_wait_s=60)
    loop = asyncio.get_running_loop()
    start = loop.time()
    results = await asyncio.gather(*(batcher.submit(i) for i in range(8)))
    assert results == [i * 2 for i in range(8)]
    assert [len(b) for b in handler.batches] == [4, 4]
    assert loop.time() == start  # full batches never wait for the 60 s
    await batcher.close()


async def test_batch_flushes_after_max_wait_when_not_full() -> None:
    handler = Doubler()
    batcher: MicroBatcher[int, int] = MicroBatcher(handler, max_size=32, max_wait_s=0.05)
    loop = asyncio.get_running_loop()
    start = loop.time()
    pending = asyncio.gather(*(batcher.submit(i) for i in range(3)))
    await asyncio.sleep(0.049)
    assert handler.batches == []  # not before the wait is over
    assert await pending == [0, 2, 4]
    assert handler.batches == [[0, 1, 2]]
    assert loop.time() == pytest.approx(start + 0.05)
    await batcher.close()


async def test_an_idle_eager_batcher_flushes_a_lone_request_at_once() -> None:
    handler = Doubler()
    batcher: MicroBatcher[int, int] = MicroBatcher(handler, max_size=32, max_wait_s=60, eager_below=1)
    async with asyncio.timeout(5):  # the 60 s wait must never be reached
        assert await batcher.submit(7) == 14
    assert handler.batches == [[7]]
    await batcher.close()


async def test_an_eager_batcher_fills_the_next_batch_while_one_runs_and_flushes_when_it_ends() -> None:
    gate = asyncio.Event()
    handler = Doubler(gate=gate)
    batcher: MicroBatcher[int, int] = MicroBatcher(handler, max_size=32, max_wait_s=60, eager_below=1)
    first = asyncio.ensure_future(batcher.submit(0))
    for _ in range(100):  # let the lone first item reach the handler, which holds it at the gate
        await asyncio.sleep(0)
    assert handler.batches == [[0]]
    rest = [asyncio.ensure_future(batcher.submit(i)) for i in range(1, 6)]
    for _ in range(20):
        await asyncio.sleep(0)
    assert handler.batches == [[0]], "the second batch waits while the first one runs"
    gate.set()
    async with asyncio.timeout(5):  # flushed when the first batch ends, not after 60 s
        assert await asyncio.gather(first, *rest) == [0, 2, 4, 6, 8, 10]
    assert handler.batches == [[0], [1, 2, 3, 4, 5]]
    await batcher.close()


async def test_batch_is_never_empty_when_every_caller_gave_up() -> None:
    handler = Doubler()
    batcher: MicroBatcher[int, int] = MicroBatcher(handler, max_size=32, max_wait_s=0.02)
    gone = [asyncio.create_task(batcher.submit(i)) for i in range(3)]
    await asyncio.sleep(0)
    for task in gone:
        task.cancel()
    await asyncio.gather(*gone, return_exceptions=True)
    assert await batcher.submit(7) == 14
    assert handler.batches == [[7]]
    assert all(handler.batches)
    await batcher.close()


async def test_a_bad_item_fails_alone() -> None:
    batcher: MicroBatcher[int, int] = MicroBatcher(Doubler(odd_fails=True), max_size=4, max_wait_s=0.01)
    outcomes = await asyncio.gather(*(batcher.submit(i) for i in range(4)), return_exceptions=True)
    assert outcomes[0] == 0 and outcomes[2] == 4
    assert isinstance(outcomes[1], InvalidInput) and isinstance(outcomes[3], InvalidInput)
    await batcher.close()


async def test_a_failed_handler_fails_every_item_of_its_batch() -> None:
    async def broken(items: Sequence[int]) -> list[int | BaseException]:
        raise ExamlopsError("the handler broke")

    batcher: MicroBatcher[int, int] = MicroBatcher(broken, max_size=4, max_wait_s=0.01)
    outcomes = await asyncio.gather(*(batcher.submit(i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(o, ExamlopsError) and "broke" in str(o) for o in outcomes)
    assert await asyncio.gather(batcher.submit(1), return_exceptions=True)  # the batcher itself lives on
    await batcher.close()


async def test_task_failure_fails_every_waiter_and_later_submits() -> None:
    handler = Doubler()
    batcher: MicroBatcher[int, int] = MicroBatcher(handler, max_size=32, max_wait_s=60)
    waiting = [asyncio.create_task(batcher.submit(i)) for i in range(5)]
    await asyncio.sleep(0.01)
    assert batcher._task is not None
    batcher._task.cancel()  # the batching task dies under waiting callers
    async with asyncio.timeout(5):
        outcomes = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(type(o) is ExamlopsError and "stopped" in str(o) for o in outcomes)
    assert not batcher.running
    with pytest.raises(ExamlopsError, match="stopped"):
        await batcher.submit(9)
    assert handler.batches == []
    await batcher.close()


async def test_close_fails_pending_and_in_flight_items() -> None:
    gate = asyncio.Event()
    handler = Doubler(gate=gate)
    batcher: MicroBatcher[int, int] = MicroBatcher(handler, max_size=2, max_wait_s=60)
    in_flight = [asyncio.create_task(batcher.submit(i)) for i in range(2)]
    await asyncio.sleep(0.01)
    pending = asyncio.create_task(batcher.submit(2))
    await asyncio.sleep(0.01)
    await batcher.close()
    outcomes = await asyncio.gather(*in_flight, pending, return_exceptions=True)
    assert all(isinstance(o, NotReady) for o in outcomes)
    with pytest.raises(NotReady):
        await batcher.submit(3)


@pytest.mark.parametrize("eager_below", [0, 1, 4])
async def test_no_item_is_lost_when_arrivals_race_the_flush_timer(eager_below: int) -> None:
    """Items arriving just as the wait for more runs out must land in a batch, never vanish."""
    handler = Doubler()

    async def slow_handler(items: Sequence[int]) -> list[int | BaseException]:
        await asyncio.sleep(0.0005 * (len(items) % 3))
        return await handler(items)

    batcher: MicroBatcher[int, int] = MicroBatcher(slow_handler, max_size=8, max_wait_s=0.0005, eager_below=eager_below)

    async def client(start: int) -> list[int]:
        results = []
        for i in range(start, start + 40):
            results.append(await batcher.submit(i))
            await asyncio.sleep(0.0001 * (i % 4))
        return results

    async with asyncio.timeout(20):  # a lost item would hang its client
        answers = await asyncio.gather(*(client(k * 1000) for k in range(24)))
    assert [a for part in answers for a in part] == [2 * i for k in range(24) for i in range(k * 1000, k * 1000 + 40)]
    await batcher.close()


class Gated:
    """A handler that records its batches and holds those of the groups in ``held`` until released."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.held: dict[int, asyncio.Event] = {0: asyncio.Event()}

    async def __call__(self, items: Sequence[int]) -> list[int | BaseException]:
        self.batches.append(list(items))
        gate = self.held.get(items[0] % 2)
        if gate is not None:
            await gate.wait()
        return [i * 2 for i in items]


async def test_a_group_with_its_batches_in_flight_waits_while_another_groups_items_are_batched() -> None:
    handler = Gated()  # even items are one group (one model), odd ones another
    batcher: MicroBatcher[int, int] = MicroBatcher(
        handler, max_size=4, max_wait_s=60, eager_below=1, max_in_flight=1, group=lambda i: i % 2
    )
    first = asyncio.ensure_future(batcher.submit(0))
    for _ in range(50):
        await asyncio.sleep(0)
    waiting = [asyncio.ensure_future(batcher.submit(i)) for i in (2, 4, 1, 3)]
    async with asyncio.timeout(5):
        assert await asyncio.gather(*waiting[2:]) == [2, 6]  # the odd group is not behind the even one
    assert handler.batches == [[0], [1, 3]]  # a batch holds one group's items
    handler.held[0].set()
    async with asyncio.timeout(5):
        assert await asyncio.gather(first, *waiting[:2]) == [0, 4, 8]
    assert handler.batches[2] == [2, 4]
    await batcher.close()


async def test_eager_below_counts_the_batches_of_the_items_own_group() -> None:
    handler = Gated()  # the even group's batches are held
    batcher: MicroBatcher[int, int] = MicroBatcher(
        handler, max_size=4, max_wait_s=60, eager_below=1, max_in_flight=2, group=lambda i: i % 2
    )
    held = asyncio.ensure_future(batcher.submit(0))
    await asyncio.sleep(0.001)
    async with asyncio.timeout(5):  # an idle group flushes a lone item at once, not after 60 s
        assert await batcher.submit(1) == 2
    even = asyncio.ensure_future(batcher.submit(2))
    await asyncio.sleep(1)
    assert handler.batches == [[0], [1]], "a lone item of a group with a batch in flight waits to be joined"
    handler.held[0].set()
    async with asyncio.timeout(5):  # flushed as soon as its group's batch ends
        assert await asyncio.gather(held, even) == [0, 4]
    assert handler.batches == [[0], [1], [2]]
    await batcher.close()


async def test_a_batch_opens_from_the_group_whose_head_is_due_first() -> None:
    handler = Doubler()
    batcher: MicroBatcher[int, int] = MicroBatcher(handler, max_size=4, max_wait_s=0, group=lambda i: i < 10)
    # Submitted in one turn of the loop: all are queued before the batching task first runs.
    calls = [asyncio.ensure_future(batcher.submit(i, key=key)) for i, key in ((2, 2.0), (11, 3.0), (12, 1.0))]
    assert await asyncio.gather(*calls) == [4, 22, 24]
    assert handler.batches == [[12, 11], [2]]
    await batcher.close()


def ledger_items(batcher: MicroBatcher[int, int]) -> list[tuple[float, float, str]]:
    keys, dues, tallies = batcher.ledger.view()
    return [(key, due, batcher.ledger.names[tally]) for key, due, tally in zip(keys, dues, tallies, strict=True)]


async def test_queued_and_the_ledger_merge_every_groups_queue() -> None:
    gate = asyncio.Event()
    handler = Doubler(gate=gate)
    batcher: MicroBatcher[int, int] = MicroBatcher(
        handler, max_size=4, max_wait_s=0, max_in_flight=1, group=lambda i: i < 10, tally=str
    )
    held = [asyncio.ensure_future(batcher.submit(i)) for i in (10, 1)]  # one batch in flight per group
    await asyncio.sleep(0.001)
    calls = [asyncio.ensure_future(batcher.submit(i, key=key)) for i, key in ((2, 2.0), (11, 3.0), (12, 1.0))]
    await asyncio.sleep(0.001)
    assert sorted(batcher.queued(2.0)) == [2, 12]  # what a call of key 2 waits behind, over both groups
    # In the order they will be taken, tallied (here by ``str``): what the admission estimate reads.
    assert ledger_items(batcher) == [(1.0, math.inf, "12"), (2.0, math.inf, "2"), (3.0, math.inf, "11")]
    gate.set()
    assert await asyncio.gather(*held, *calls) == [20, 2, 4, 22, 24]
    await batcher.close()


async def test_the_ledger_holds_exactly_the_items_waiting_as_they_come_and_go() -> None:
    gate = asyncio.Event()
    batcher: MicroBatcher[int, int] = MicroBatcher(
        Doubler(gate=gate), max_size=2, max_wait_s=0, max_in_flight=1, tally=lambda i: "odd" if i % 2 else "even"
    )
    held = asyncio.ensure_future(batcher.submit(0))  # in flight: the rest wait
    await asyncio.sleep(0.001)
    assert len(batcher.ledger) == 0  # handed over: no longer waiting
    calls = [
        asyncio.ensure_future(batcher.submit(1, due=5.0e9)),  # a deadline: its key
        asyncio.ensure_future(batcher.submit(2, key=9.0e9)),  # no deadline
        asyncio.ensure_future(batcher.submit(3, key=math.inf, due=8.0e9)),  # background: after everything
        asyncio.ensure_future(batcher.submit(5, due=1.0e9)),  # the tightest: first
    ]
    await asyncio.sleep(0.001)
    assert ledger_items(batcher) == [
        (1.0e9, 1.0e9, "odd"),
        (5.0e9, 5.0e9, "odd"),
        (9.0e9, math.inf, "even"),
        (math.inf, 8.0e9, "odd"),
    ]
    calls[1].cancel()  # its caller gave up: it is no longer work ahead of anyone
    await asyncio.sleep(0.001)
    assert [key for key, _, _ in ledger_items(batcher)] == [1.0e9, 5.0e9, math.inf]
    gate.set()
    assert await asyncio.gather(held, calls[0], calls[2], calls[3]) == [0, 2, 6, 10]
    assert len(batcher.ledger) == 0
    await batcher.close()


@pytest.mark.parametrize("dead", ["cancelled", "expired"])
async def test_background_work_never_rides_in_an_interactive_batch_behind_a_dead_call(dead: str) -> None:
    gate = asyncio.Event()
    handler = Doubler(gate=gate)
    batcher: MicroBatcher[int, int] = MicroBatcher(handler, max_size=4, max_wait_s=0, max_in_flight=1)
    now = asyncio.get_running_loop().time()
    held = asyncio.ensure_future(batcher.submit(0))  # in flight: the rest wait
    await asyncio.sleep(0.001)
    interactive = asyncio.ensure_future(batcher.submit(2, due=now + 1.0))
    # Taken after the interactive call, before the background one; its caller is gone by then.
    gone = asyncio.ensure_future(batcher.submit(1, due=now + 0.005 if dead == "expired" else now + 5.0, key=now + 5.0))
    background = asyncio.ensure_future(batcher.submit(3, key=math.inf))
    await asyncio.sleep(0.01)
    if dead == "cancelled":
        gone.cancel()
    gate.set()
    assert await asyncio.gather(held, interactive, background) == [0, 4, 6]
    assert handler.batches == [[0], [2], [3]]
    await asyncio.gather(gone, return_exceptions=True)
    await batcher.close()


async def test_an_item_that_does_not_fit_a_batch_waits_in_the_ledger_for_the_next() -> None:
    gate = asyncio.Event()
    handler = Doubler(gate=gate)
    now = asyncio.get_running_loop().time()
    batcher: MicroBatcher[int, int] = MicroBatcher(
        handler, max_size=4, max_wait_s=0, max_in_flight=1, lead=lambda batch: float(len(batch)), tally=str
    )
    # Each item takes 1 s: 1 fits before its deadline alone, not with 2 (2 s); 2 waits for the next batch.
    calls = [asyncio.ensure_future(batcher.submit(i, due=now + due)) for i, due in ((1, 1.5), (2, 3.6))]
    await asyncio.sleep(0.001)
    assert handler.batches == [[1]]
    assert ledger_items(batcher) == [(now + 3.6, now + 3.6, "2")]
    gate.set()
    assert await asyncio.gather(*calls) == [2, 4]
    assert handler.batches == [[1], [2]] and len(batcher.ledger) == 0
    await batcher.close()


async def test_close_empties_the_ledger_with_the_queue() -> None:
    gate = asyncio.Event()
    batcher: MicroBatcher[int, int] = MicroBatcher(Doubler(gate=gate), max_size=1, max_wait_s=0, max_in_flight=1)
    calls = [asyncio.ensure_future(batcher.submit(i)) for i in range(3)]  # 0 in flight, 1 and 2 waiting
    await asyncio.sleep(0.001)
    assert len(batcher.ledger) == 2
    await batcher.close(grace_s=0)
    assert len(batcher.ledger) == 0
    for outcome in await asyncio.gather(*calls, return_exceptions=True):
        assert isinstance(outcome, NotReady)


class Item:
    """An item the garbage collector tracks and a weak reference can follow."""


async def test_a_failed_item_is_freed_by_reference_counting_alone_without_the_collector() -> None:
    refused: list[Item] = []

    async def refuse_the_first(items: Sequence[Item]) -> list[Item | BaseException]:
        return [InvalidInput("refused") if item is refused[0] else item for item in items]

    batcher: MicroBatcher[Item, Item] = MicroBatcher(refuse_the_first, max_size=4, max_wait_s=0.01)
    refused.append(Item())
    gone = weakref.ref(refused[0])
    was = gc.isenabled()
    gc.disable()  # no collection may free it: a reference cycle would keep it
    try:
        with pytest.raises(InvalidInput):
            await batcher.submit(refused[0])
        refused[0] = Item()
        await batcher.submit(Item())  # the batching task's next batch: it lets go of the last one
        assert gone() is None, "a failed submit left the item in a reference cycle"
    finally:
        if was:
            gc.enable()
        await batcher.close()
