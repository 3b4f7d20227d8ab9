"""Deadlines only tighten, and a stream checks the deadline and can stop at every chunk boundary."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest

from examlops.inference import InferenceError, InferencePort, Kind, deadline_in
from examlops.inference.adapters.mock import MockInferenceRegistry
from tests.unit.inference.fakes import FRAUD, RecordingAdapter, features, scoring_registry


async def test_a_per_call_timeout_never_extends_the_ambient_deadline() -> None:
    adapter = RecordingAdapter(scoring_registry())
    port = InferencePort(FRAUD, adapter)
    with deadline_in(timedelta(seconds=30)) as ambient:
        await port.predict(features(1.0), options={"timeout": timedelta(hours=1)})
        await port.predict(features(1.0), options={"timeout": timedelta(seconds=5)})
        await port.predict(features(1.0))
    longer, shorter, inherited = (call.deadline for call in adapter.calls)
    assert longer == ambient and inherited == ambient
    assert shorter is not None and shorter < ambient


async def test_a_call_whose_deadline_has_passed_is_refused_before_any_io() -> None:
    adapter = RecordingAdapter(scoring_registry())
    with pytest.raises(InferenceError) as caught:
        await InferencePort(FRAUD, adapter).predict(features(1.0), options={"timeout": timedelta(0)})
    assert (caught.value.kind, caught.value.code) == (Kind.TIMEOUT, "inference_timeout")
    assert adapter.calls == []


async def test_the_port_gives_up_by_the_deadline_even_when_the_adapter_does_not() -> None:
    class Hanging(RecordingAdapter):
        async def predict_batch(self, route, rows, call):  # type: ignore[no-untyped-def]
            await asyncio.Event().wait()

    with pytest.raises(InferenceError) as caught:
        await InferencePort(FRAUD, Hanging(scoring_registry())).predict(features(1.0), options={"timeout": 0.01})
    assert caught.value.kind is Kind.TIMEOUT


async def test_streaming_keeps_order_in_chunks_of_the_requested_size() -> None:
    port = InferencePort(FRAUD, scoring_registry())
    chunks = [chunk async for chunk in port.predict_stream([features(float(a)) for a in range(7)], chunk_size=3)]
    assert [[s.risk for s in chunk] for chunk in chunks] == [[0.0, 0.001, 0.002], [0.003, 0.004, 0.005], [0.006]]


async def test_emulated_streaming_reads_instances_lazily_and_stops_at_a_boundary() -> None:
    adapter = RecordingAdapter(scoring_registry())
    read: list[int] = []

    def instances():  # type: ignore[no-untyped-def]
        for a in range(100):
            read.append(a)
            yield features(float(a))

    port = InferencePort(FRAUD, adapter, emulate_streaming=True)
    stream = port.predict_stream(instances(), chunk_size=10)
    async for _ in stream:
        break
    await stream.aclose()
    assert len(adapter.calls) == 1 and len(read) == 10


async def test_closing_a_native_stream_early_closes_the_backend_stream() -> None:
    adapter = RecordingAdapter(scoring_registry(), scoring_registry().capabilities)
    stream = InferencePort(FRAUD, adapter).predict_stream([features(float(a)) for a in range(30)], chunk_size=10)
    async for _ in stream:
        break
    await stream.aclose()
    assert adapter.streams_closed == 1
    assert [len(rows) for _, rows in adapter.inner.calls] == [10]


async def test_a_deadline_passed_between_chunks_stops_the_stream_before_the_next_call() -> None:
    def slow(instances: list[object]) -> list[dict[str, float]]:
        time.sleep(0.05)  # outlasts the call's timeout below while the backend works on the first chunk
        return [{"risk": 0.0} for _ in instances]

    registry = MockInferenceRegistry().on("fraud_scorer", slow)
    port = InferencePort(FRAUD, registry)
    stream = port.predict_stream([features(1.0)] * 4, chunk_size=2, options={"timeout": 0.02})
    got = []
    with pytest.raises(InferenceError) as caught:
        async for chunk in stream:
            got.append(chunk)
    assert caught.value.kind is Kind.TIMEOUT
    assert len(got) == 1 and len(registry.calls) == 1


async def test_a_stream_consumer_cancelled_at_a_boundary_makes_no_further_call() -> None:
    registry = scoring_registry()
    adapter = RecordingAdapter(registry)
    port = InferencePort(FRAUD, adapter, emulate_streaming=True)
    first = asyncio.Event()

    async def consume() -> None:
        async for _ in port.predict_stream([features(1.0)] * 50, chunk_size=5):
            first.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(consume())
    await first.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(registry.calls) == 1


async def test_a_stream_that_ends_short_fails_with_the_missing_count() -> None:
    registry = MockInferenceRegistry().on("fraud_scorer", lambda rows: [{"risk": 0.0} for _ in rows][:-1])
    with pytest.raises(InferenceError) as caught:
        async for _ in InferencePort(FRAUD, registry).predict_stream([features(1.0)] * 4, chunk_size=4):
            pass
    assert caught.value.code == "inference_output_invalid"


async def test_a_native_stream_checks_the_deadline_at_every_boundary_even_for_outputs_already_received() -> None:
    class AllAtOnce(RecordingAdapter):
        async def stream_batches(self, route, rows, call):  # type: ignore[no-untyped-def]
            yield [{"risk": 0.0} for _ in rows]

    adapter = AllAtOnce(scoring_registry(), scoring_registry().capabilities)
    stream = InferencePort(FRAUD, adapter).predict_stream([features(1.0)] * 6, chunk_size=2, options={"timeout": 0.02})
    got = [await anext(stream)]
    await asyncio.sleep(0.05)  # the consumer is slow: the deadline passes between two chunks
    with pytest.raises(InferenceError) as caught:
        got.append(await anext(stream))
    assert caught.value.kind is Kind.TIMEOUT and len(got) == 1


async def test_a_stream_that_answers_more_than_it_was_asked_fails() -> None:
    class Chatty(RecordingAdapter):
        async def stream_batches(self, route, rows, call):  # type: ignore[no-untyped-def]
            yield [{"risk": 0.0} for _ in rows]
            yield [{"risk": 0.0}]

    adapter = Chatty(scoring_registry(), scoring_registry().capabilities)
    with pytest.raises(InferenceError) as caught:
        async for _ in InferencePort(FRAUD, adapter).predict_stream([features(1.0)] * 2):
            pass
    assert caught.value.code == "inference_output_invalid" and "more outputs" in caught.value.message
