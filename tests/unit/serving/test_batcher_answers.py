"""How a handled batch gives its callers their answers: its slot first, then a few callers a loop pass."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

import pytest

from examlops.serving import batcher as batcher_module
from examlops.serving.batcher import ANSWERS_PER_PASS, MicroBatcher

pytestmark = pytest.mark.looptime


async def test_the_next_batch_is_handed_over_before_every_caller_of_the_last_one_is_answered() -> None:
    answered: list[int] = []
    handed: list[tuple[list[int], int]] = []  # each batch, and how many callers had their answer when it came
    gate = asyncio.Event()

    async def handler(items: Sequence[int]) -> list[int]:
        handed.append((list(items), len(answered)))
        if len(handed) == 1:
            await gate.wait()
        return [i * 2 for i in items]

    size = 4 * ANSWERS_PER_PASS
    batcher: MicroBatcher[int, int] = MicroBatcher(
        handler, max_size=size, max_wait_s=0.01, eager_below=1, max_in_flight=1
    )

    async def call(i: int) -> None:
        assert await batcher.submit(i) == i * 2
        answered.append(i)

    first = [asyncio.create_task(call(i)) for i in range(size)]
    await asyncio.sleep(0.02)
    later = asyncio.create_task(call(size))  # waits: the only slot is held by the first batch
    await asyncio.sleep(0.02)
    assert [batch for batch, _ in handed] == [list(range(size))]
    gate.set()
    await asyncio.gather(*first, later)
    assert [batch for batch, _ in handed] == [list(range(size)), [size]]
    assert handed[1][1] < size  # handed over while the first batch's callers were still being answered
    assert sorted(answered) == list(range(size + 1))
    await batcher.close()


async def test_a_batchs_callers_are_answered_a_few_to_a_loop_pass_in_queue_order() -> None:
    answered: list[int] = []
    passes: list[int] = []  # answers given by the start of each loop pass after the handler returned

    def probe() -> None:
        passes.append(len(answered))
        if len(answered) < size:
            asyncio.get_running_loop().call_soon(probe)

    async def handler(items: Sequence[int]) -> list[int]:
        asyncio.get_running_loop().call_soon(probe)
        return [i * 2 for i in items]

    size = 3 * ANSWERS_PER_PASS + 1
    batcher: MicroBatcher[int, int] = MicroBatcher(handler, max_size=size, max_wait_s=0.01)

    async def call(i: int) -> None:
        assert await batcher.submit(i) == i * 2
        answered.append(i)

    await asyncio.gather(*(call(i) for i in range(size)))
    steps = [after - before for before, after in itertools.pairwise(passes)]
    assert answered == list(range(size))
    assert max(steps) == ANSWERS_PER_PASS  # never more in one pass: other ready work runs in between
    assert len([step for step in steps if step]) == 4  # 8, 8, 8 and the last one
    await batcher.close()


async def test_closing_while_a_batch_is_answered_still_gives_every_caller_its_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(batcher_module, "ANSWERS_PER_PASS", 1)  # one caller a pass: the close lands mid-way
    closing: list[asyncio.Task[None]] = []
    batcher: MicroBatcher[int, int] = MicroBatcher(lambda items: handler(items), max_size=16, max_wait_s=0.01)

    async def handler(items: Sequence[int]) -> list[int]:
        closing.append(asyncio.get_running_loop().create_task(batcher.close(grace_s=0)))
        return [i * 2 for i in items]

    async with asyncio.timeout(5):  # a caller left without its answer would wait for ever
        results = await asyncio.gather(*(batcher.submit(i) for i in range(16)))
    assert results == [i * 2 for i in range(16)]
    await closing[0]
    assert not batcher.running
