"""The micro-batcher's deadline contract: earliest deadline first, expired items never handed over,
a bounded number of batches in flight, and an early flush for a tight deadline."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

import pytest

from examlops.core.errors import Refused
from examlops.serving.batcher import MicroBatcher
from tests.unit.serving.test_batcher import Doubler

pytestmark = pytest.mark.looptime


def late(item: int) -> Refused:
    return Refused(f"{item} ran out", reason="late")


async def hold_one_batch(batcher: MicroBatcher[int, int], handler: Doubler) -> asyncio.Future[int]:
    """Submit item 0 and wait until its batch is in the (gated) handler: the batcher is then full."""
    first = asyncio.ensure_future(batcher.submit(0))
    await asyncio.sleep(0.001)  # the batching task forms and hands over the batch
    assert handler.batches == [[0]]
    return first


async def test_waiting_items_go_earliest_deadline_first_and_unbudgeted_ones_last() -> None:
    gate = asyncio.Event()
    handler = Doubler(gate=gate)
    batcher: MicroBatcher[int, int] = MicroBatcher(handler, max_size=2, max_wait_s=0, max_in_flight=1)
    first = await hold_one_batch(batcher, handler)
    now = asyncio.get_running_loop().time()
    waiting = [
        asyncio.ensure_future(batcher.submit(1)),  # no deadline: now + horizon (30 s)
        asyncio.ensure_future(batcher.submit(2, due=now + 10)),
        asyncio.ensure_future(batcher.submit(3, due=now + 1)),
        asyncio.ensure_future(batcher.submit(4, key=math.inf)),  # background: after everything
        asyncio.ensure_future(batcher.submit(5, due=now + 5)),
    ]
    await asyncio.sleep(0)
    assert batcher.queued(now + 5) == [3, 5]  # what a call due at now + 5 waits behind
    gate.set()
    await asyncio.gather(first, *waiting)
    assert handler.batches == [[0], [3, 5], [2, 1], [4]]
    await batcher.close()


async def test_an_item_whose_deadline_comes_while_it_waits_is_never_handed_over() -> None:
    gate = asyncio.Event()
    handler = Doubler(gate=gate)
    batcher: MicroBatcher[int, int] = MicroBatcher(handler, max_size=4, max_wait_s=0, max_in_flight=1, expired=late)
    first = await hold_one_batch(batcher, handler)
    now = asyncio.get_running_loop().time()
    doomed = asyncio.ensure_future(batcher.submit(7, due=now + 0.5))
    kept = asyncio.ensure_future(batcher.submit(8, due=now + 5))
    await asyncio.sleep(1)  # the batcher is full for longer than 7's budget
    gate.set()
    with pytest.raises(Refused) as refused:
        await doomed
    assert refused.value.reason == "late"
    assert await kept == 16
    await first
    assert [item for batch in handler.batches for item in batch] == [0, 8]
    await batcher.close()


async def test_no_batch_is_formed_while_max_in_flight_are_handled() -> None:
    gate = asyncio.Event()
    handler = Doubler(gate=gate)
    batcher: MicroBatcher[int, int] = MicroBatcher(handler, max_size=1, max_wait_s=0, max_in_flight=2)
    pending = [asyncio.ensure_future(batcher.submit(i)) for i in range(5)]
    await asyncio.sleep(0.1)
    assert handler.batches == [[0], [1]]
    assert len(batcher.in_flight()) == 2
    assert batcher.queued() == [2, 3, 4]
    gate.set()
    assert await asyncio.gather(*pending) == [0, 2, 4, 6, 8]
    await batcher.close()


async def test_a_tight_deadline_flushes_the_batch_before_max_wait() -> None:
    handler = Doubler()
    lead_s = 0.02

    def lead(items: Sequence[int]) -> float:
        return lead_s

    batcher: MicroBatcher[int, int] = MicroBatcher(handler, max_size=32, max_wait_s=1.0, lead=lead)
    loop = asyncio.get_running_loop()
    start = loop.time()
    loose = asyncio.ensure_future(batcher.submit(1, due=start + 10))
    await asyncio.sleep(0.01)
    tight = asyncio.ensure_future(batcher.submit(2, due=start + 0.1))
    assert await asyncio.gather(loose, tight) == [2, 4]
    assert handler.batches == [[1, 2]]
    assert loop.time() == pytest.approx(start + 0.1 - lead_s)  # not the 1 s of max_wait
    await batcher.close()


async def test_an_item_that_would_make_the_batch_miss_its_tightest_deadline_waits_for_the_next_one() -> None:
    gate = asyncio.Event()
    handler = Doubler(gate=gate)

    def lead(items: Sequence[int]) -> float:
        return 0.1 * len(items)  # 100 ms an item

    batcher: MicroBatcher[int, int] = MicroBatcher(handler, max_size=32, max_wait_s=0, max_in_flight=1, lead=lead)
    first = await hold_one_batch(batcher, handler)
    now = asyncio.get_running_loop().time()
    tight = [asyncio.ensure_future(batcher.submit(i, due=now + 10.25)) for i in (1, 2)]
    loose = [asyncio.ensure_future(batcher.submit(i, due=now + 60)) for i in (3, 4, 5)]
    await asyncio.sleep(10)
    gate.set()
    await asyncio.gather(first, *tight, *loose)
    # At 10 s two items take 200 ms and fit before 10.25 s; a third would not.
    assert handler.batches == [[0], [1, 2], [3, 4, 5]]
    await batcher.close()


async def test_a_full_batcher_leaves_the_queue_alone_until_a_slot_frees() -> None:
    gate = asyncio.Event()
    handler = Doubler(gate=gate)
    batcher: MicroBatcher[int, int] = MicroBatcher(handler, max_size=4, max_wait_s=0, max_in_flight=1, expired=late)
    first = await hold_one_batch(batcher, handler)
    now = asyncio.get_running_loop().time()
    doomed = asyncio.ensure_future(batcher.submit(7, due=now + 0.5))
    await asyncio.sleep(1)
    later = asyncio.ensure_future(batcher.submit(8, due=now + 5))  # wakes the full batcher
    await asyncio.sleep(0.001)
    assert not doomed.done(), "a full batcher sleeps: it does not scan the queue on each submit"
    assert batcher.queued() == [7, 8]
    gate.set()
    with pytest.raises(Refused):
        await doomed  # failed when the next batch is formed, as before
    assert await asyncio.gather(first, later) == [0, 16]
    await batcher.close()


@pytest.mark.parametrize("early_expiry", [True, False])
async def test_with_early_expiry_an_item_that_could_not_be_answered_in_time_even_alone_is_never_handed_over(
    early_expiry: bool,
) -> None:
    gate = asyncio.Event()
    handler = Doubler(gate=gate)

    def lead(items: Sequence[int]) -> float:
        return 0.05 + 0.01 * len(items)  # a fixed 50 ms a batch and 10 ms an item

    batcher: MicroBatcher[int, int] = MicroBatcher(
        handler, max_size=8, max_wait_s=0, max_in_flight=1, lead=lead, expired=late, early_expiry=early_expiry
    )
    first = await hold_one_batch(batcher, handler)
    now = asyncio.get_running_loop().time()
    doomed = asyncio.ensure_future(batcher.submit(7, due=now + 1.05))  # alone it needs 60 ms: done at 1.06 s
    kept = asyncio.ensure_future(batcher.submit(8, due=now + 1.07))
    await asyncio.sleep(1)
    gate.set()
    await first
    assert await kept == 16
    if early_expiry:
        with pytest.raises(Refused) as refused:
            await doomed
        assert refused.value.reason == "late"
        assert handler.batches == [[0], [8]]
    else:  # handed over alone (8 would make the pair miss 7's deadline), and answered late
        assert await doomed == 14
        assert handler.batches == [[0], [7], [8]]
    await batcher.close()
