"""A failed call leaves no reference cycle in the pipeline: its objects go by reference counting at once, not at
a garbage collection (which serving holds off under load: ``core.collector.LoadGovernor``)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import types
from collections.abc import Iterator

import pytest

from examlops.core.errors import InvalidInput, Refused
from tests.unit.serving.test_pipeline import World, req, world

__all__ = ["world"]  # the fixture, used by name


@contextlib.contextmanager
def cycles() -> Iterator[list[str]]:
    """The pipeline's, batcher's and dispatcher's frames that only a collection could free, once the block ends."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    found: list[str] = []
    try:
        yield found
    finally:
        gc.collect()
        found += [
            o.f_code.co_qualname
            for o in gc.garbage
            if isinstance(o, types.FrameType)
            and o.f_code.co_qualname.split(".")[0] in ("Pipeline", "MicroBatcher", "Dispatcher")
        ]
        gc.garbage.clear()
        gc.set_debug(0)
        if was:
            gc.enable()


async def test_a_bad_row_answered_with_an_error_leaves_no_cycle(world: World) -> None:
    pipeline = world.pipeline()
    await pipeline.start()
    with cycles() as found:
        with pytest.raises(InvalidInput):
            await pipeline.infer(req(2, embedding=(1.0,) * 7))
        await pipeline.infer(req(3))  # the batching task's next batch: it lets go of the last one
    assert found == []


async def test_a_call_refused_late_while_predicted_in_a_task_of_its_own_leaves_no_cycle(world: World) -> None:
    pipeline = world.pipeline()
    await pipeline.start()
    world.runtime.gate, world.runtime.started = asyncio.Event(), asyncio.Event()
    with cycles() as found:
        late = asyncio.create_task(pipeline.infer(req(deadline=world.wall.now + 0.05)))  # as a stream's rows run
        await world.runtime.started.wait()
        with pytest.raises(Refused):
            await late
        world.runtime.gate.set()
        del late
        await pipeline.infer(req(3))  # the batching task's next batch: it lets go of the last one
    assert found == []
