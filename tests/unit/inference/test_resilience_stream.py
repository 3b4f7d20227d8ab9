"""A stream gets the circuit breaker only: never retried, hedged or shed, since it cannot be replayed."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from pydantic import BaseModel

from examlops.inference import InferencePort, InferenceSpec
from examlops.inference.context import Criticality
from examlops.inference.errors import FeatureUnsupported, InferenceError, Kind
from examlops.inference.ports import Call, Capabilities, Row
from examlops.inference.resilience import CIRCUIT_OPEN, Policy, ResilientAdapter, State
from tests.unit.inference.resilience_fakes import PlainAdapter, ScriptedAdapter, failure

pytestmark = pytest.mark.looptime

ROWS = [{"x": n} for n in range(6)]
CALL = Call(route="r")


def resilient(inner: ScriptedAdapter | PlainAdapter) -> ResilientAdapter:
    policy = Policy.from_mapping(
        {
            "retry": {"max_attempts": 5},
            "hedge": {"min_samples": 1, "budget_ratio": 1.0},
            "breaker": {"failure_threshold": 2, "failure_ratio": None, "open_s": 5.0},
        }
    )
    return ResilientAdapter(inner, policy, clock=asyncio.get_running_loop().time)


async def consume(adapter: ResilientAdapter, call: Call = CALL) -> list[Sequence[Row]]:
    return [chunk async for chunk in adapter.stream_batches("r", ROWS, call)]


async def test_a_stream_passes_its_chunks_through_in_order() -> None:
    adapter = resilient(ScriptedAdapter())
    assert await consume(adapter) == [[{"y": 0}, {"y": 2}], [{"y": 4}, {"y": 6}], [{"y": 8}, {"y": 10}]]


async def test_a_stream_that_fails_midway_is_not_retried() -> None:
    error = failure(Kind.INFRASTRUCTURE)
    inner = ScriptedAdapter(stream_fail_after=(1, error))
    adapter = resilient(inner)
    seen = []
    with pytest.raises(InferenceError) as raised:
        async for chunk in adapter.stream_batches("r", ROWS, CALL):
            seen.append(chunk)
    assert raised.value is error
    assert len(seen) == 1
    assert len(inner.streams) == 1


async def test_failing_streams_open_the_breaker_and_an_open_breaker_refuses_a_stream_before_any_io() -> None:
    inner = ScriptedAdapter(stream_fail_after=(0, failure(Kind.INFRASTRUCTURE)))
    adapter = resilient(inner)
    for _ in range(2):
        with pytest.raises(InferenceError):
            await consume(adapter)
    assert adapter.guard("r").breaker.state is State.OPEN
    with pytest.raises(InferenceError) as raised:
        await consume(adapter)
    assert raised.value.code == CIRCUIT_OPEN
    assert len(inner.streams) == 2
    inner.stream_fail_after = None
    await asyncio.sleep(5.0)
    assert len(await consume(adapter)) == 3  # the probe closes it
    assert adapter.guard("r").breaker.state is State.CLOSED


async def test_a_slow_stream_is_never_hedged() -> None:
    inner = ScriptedAdapter(latency=lambda n: 0.001)
    adapter = resilient(inner)
    for _ in range(3):
        await adapter.predict_batch("r", ROWS[:1], CALL)  # the route's latency: 1 ms, so predicts would hedge
    hedges = adapter.guard("r").hedger.hedges
    inner.latency = lambda n: 1.0
    assert len(await consume(adapter)) == 3
    assert len(inner.streams) == 1
    assert adapter.guard("r").hedger.hedges == hedges


async def test_a_best_effort_stream_is_not_shed() -> None:
    inner = ScriptedAdapter(fail=[failure(Kind.THROTTLED)])
    adapter = resilient(inner)
    with pytest.raises(InferenceError):
        await adapter.predict_batch("r", ROWS, Call(route="r", criticality=Criticality.CRITICAL, deadline=0.0))
    best_effort = Call(route="r", criticality=Criticality.BEST_EFFORT)
    assert adapter.guard("r").shedder.sheds(Criticality.BEST_EFFORT, half_open=False)
    assert len(await consume(adapter, best_effort)) == 3


async def test_a_stream_closed_early_by_its_reader_counts_against_nothing() -> None:
    inner = ScriptedAdapter()
    adapter = resilient(inner)
    for _ in range(3):
        stream = adapter.stream_batches("r", ROWS, CALL)
        async for _chunk in stream:
            break
        await stream.aclose()  # type: ignore[attr-defined]  # an async generator, typed as an iterator
    assert adapter.guard("r").breaker.state is State.CLOSED


async def test_an_adapter_without_streaming_refuses_a_stream_before_any_io() -> None:
    adapter = resilient(PlainAdapter())
    with pytest.raises(FeatureUnsupported) as raised:
        await consume(adapter)
    assert raised.value.code == "inference_feature_unsupported"
    assert raised.value.feature == "streaming"


class X(BaseModel):
    x: int


class Y(BaseModel):
    y: int


SPEC = InferenceSpec(name="r", input=X, output=Y)


async def test_an_emulated_stream_chunk_gets_the_breaker_only_never_a_retry() -> None:
    error = failure(Kind.INFRASTRUCTURE)
    inner = ScriptedAdapter(fail=[error], capabilities=Capabilities(native_batching=True))
    adapter = resilient(inner)
    port = InferencePort(SPEC, adapter, emulate_streaming=True)
    with pytest.raises(InferenceError) as raised:
        _ = [chunk async for chunk in port.predict_stream([{"x": n} for n in range(4)], chunk_size=2)]
    assert raised.value is error
    assert len(inner.calls) == 1 and inner.calls[0].call.stream
    assert adapter.guard("r").breaker.state is State.CLOSED  # the failure was counted: one more opens it
    inner.fail = [failure(Kind.INFRASTRUCTURE)]
    with pytest.raises(InferenceError):
        _ = [chunk async for chunk in port.predict_stream([{"x": 1}])]
    assert adapter.guard("r").breaker.state is State.OPEN


async def test_a_call_marked_stream_is_not_shed_even_under_throttling() -> None:
    inner = ScriptedAdapter(capabilities=Capabilities(native_batching=True))
    adapter = resilient(inner)
    for _ in range(50):
        adapter.guard("r").shedder.note_throttled()
    call = Call(route="r", criticality=Criticality.BEST_EFFORT, stream=True)
    assert await adapter.predict_batch("r", ROWS[:2], call) == [{"y": 0}, {"y": 2}]


async def test_every_backend_call_of_a_port_stream_is_marked_stream() -> None:
    inner = ScriptedAdapter()
    port = InferencePort(SPEC, resilient(inner))
    _ = [chunk async for chunk in port.predict_stream([{"x": n} for n in range(4)])]
    assert [seen.call.stream for seen in inner.streams] == [True]
    emulated = ScriptedAdapter(capabilities=Capabilities(native_batching=True))
    port = InferencePort(SPEC, resilient(emulated), emulate_streaming=True)
    _ = [chunk async for chunk in port.predict_stream([{"x": n} for n in range(4)], chunk_size=2)]
    assert [seen.call.stream for seen in emulated.calls] == [True, True]
    _ = await port.predict_many([{"x": 1}])
    assert emulated.calls[-1].call.stream is False
