"""Retries by failure class: only throttled and infrastructure, capped, backed off, never past the deadline."""

from __future__ import annotations

import asyncio
from itertools import pairwise
from typing import Any

import pytest

from examlops.inference.errors import InferenceError, Kind
from examlops.inference.ports import Adapter, Call, Capabilities
from examlops.inference.resilience import Policy, ResilientAdapter
from tests.unit.inference.resilience_fakes import ScriptedAdapter, failure

# Backoffs are waits on the event loop: on looptime's virtual clock they are exact and instant.
pytestmark = pytest.mark.looptime

ROWS = [{"x": 1}, {"x": 2}]


def resilient(inner: ScriptedAdapter, **retry: Any) -> ResilientAdapter:
    policy = Policy.from_mapping(
        {
            "retry": {"jitter_s": 0, **retry},
            "hedge": {"enabled": False},
            "shedding": {"enabled": False},
            "breaker": {"enabled": False},
        }
    )
    return ResilientAdapter(inner, policy, clock=asyncio.get_running_loop().time)


def call(deadline_in: float | None = None) -> Call:
    now = asyncio.get_running_loop().time()
    return Call(route="r", deadline=None if deadline_in is None else now + deadline_in)


@pytest.mark.parametrize("kind", [Kind.THROTTLED, Kind.INFRASTRUCTURE])
async def test_a_retryable_failure_reruns_the_whole_batch_until_it_answers(kind: Kind) -> None:
    inner = ScriptedAdapter(fail=[failure(kind), failure(kind)])
    adapter = resilient(inner, max_attempts=3)
    assert await adapter.predict_batch("r", ROWS, call()) == [{"y": 2}, {"y": 4}]
    assert [seen.rows for seen in inner.calls] == [ROWS, ROWS, ROWS]


@pytest.mark.parametrize("kind", [Kind.VALIDATION, Kind.PRECONDITION, Kind.TIMEOUT, Kind.MODEL_FAILURE])
async def test_a_failure_that_cannot_succeed_on_a_second_try_is_raised_at_once(kind: Kind) -> None:
    error = failure(kind)
    inner = ScriptedAdapter(fail=[error])
    adapter = resilient(inner, max_attempts=5)
    with pytest.raises(InferenceError) as raised:
        await adapter.predict_batch("r", ROWS, call())
    assert raised.value is error
    assert len(inner.calls) == 1


async def test_attempts_are_capped_and_the_last_error_is_raised_as_it_was() -> None:
    errors = [failure(Kind.INFRASTRUCTURE) for _ in range(10)]
    inner = ScriptedAdapter(fail=errors)
    adapter = resilient(inner, max_attempts=4)
    with pytest.raises(InferenceError) as raised:
        await adapter.predict_batch("r", ROWS, call())
    assert len(inner.calls) == 4
    assert raised.value is errors[3]


async def test_backoff_doubles_up_to_its_cap() -> None:
    inner = ScriptedAdapter(fail=[failure(Kind.INFRASTRUCTURE) for _ in range(4)])
    adapter = resilient(inner, max_attempts=5, backoff_s=0.1, max_backoff_s=0.3)
    await adapter.predict_batch("r", ROWS, call())
    at = [seen.at for seen in inner.calls]
    gaps = [later - earlier for earlier, later in pairwise(at)]
    assert gaps == pytest.approx([0.1, 0.2, 0.3, 0.3])


async def test_a_backends_retry_after_is_honoured_even_past_our_backoff_cap() -> None:
    inner = ScriptedAdapter(fail=[failure(Kind.THROTTLED, retry_after_s=2.5)])
    adapter = resilient(inner, max_attempts=2, backoff_s=0.1, max_backoff_s=0.2)
    await adapter.predict_batch("r", ROWS, call())
    assert inner.calls[1].at - inner.calls[0].at == pytest.approx(2.5)


async def test_a_retry_whose_backoff_ends_past_the_deadline_is_not_started() -> None:
    error = failure(Kind.THROTTLED, retry_after_s=1.0)
    inner = ScriptedAdapter(fail=[error])
    adapter = resilient(inner, max_attempts=3)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(InferenceError) as raised:
        await adapter.predict_batch("r", ROWS, call(deadline_in=0.5))
    assert raised.value is error
    assert len(inner.calls) == 1
    assert loop.time() == started  # it gave up at once instead of sleeping into the deadline


async def test_a_retry_is_not_started_when_the_routes_typical_latency_would_overrun_the_deadline() -> None:
    # The first calls teach the route that an answer takes 0.3 s; a retry 0.1 s before the deadline cannot make it.
    inner = ScriptedAdapter(latency=lambda n: 0.3)
    adapter = resilient(inner, max_attempts=3, backoff_s=0.1)
    for _ in range(3):
        await adapter.predict_batch("r", ROWS, call())
    inner.fail = [failure(Kind.INFRASTRUCTURE)]
    with pytest.raises(InferenceError):
        await adapter.predict_batch("r", ROWS, call(deadline_in=0.6))
    assert len(inner.calls) == 4


async def test_retries_go_on_while_the_deadline_leaves_room() -> None:
    inner = ScriptedAdapter(fail=[failure(Kind.INFRASTRUCTURE)] * 2)
    adapter = resilient(inner, max_attempts=3, backoff_s=0.1)
    assert await adapter.predict_batch("r", ROWS, call(deadline_in=1.0)) == [{"y": 2}, {"y": 4}]
    assert len(inner.calls) == 3


async def test_the_resilient_adapter_is_an_adapter_with_its_inner_capabilities() -> None:
    inner = ScriptedAdapter(capabilities=Capabilities(native_batching=True, max_batch=8))
    adapter = resilient(inner)
    assert isinstance(adapter, Adapter)
    assert adapter.backend == "fake"
    assert adapter.capabilities == Capabilities(native_batching=True, max_batch=8)
    await adapter.start()
    await adapter.close()
    assert inner.started and inner.closed


async def test_a_retry_after_past_the_cap_is_not_retried_and_its_error_is_raised() -> None:
    error = failure(Kind.THROTTLED, retry_after_s=31.0)
    inner = ScriptedAdapter(fail=[error])
    adapter = resilient(inner, max_attempts=3)
    with pytest.raises(InferenceError) as raised:
        await adapter.predict_batch("r", ROWS, call())
    assert raised.value is error
    assert len(inner.calls) == 1


async def test_a_retry_after_within_a_configured_cap_is_waited_for() -> None:
    inner = ScriptedAdapter(fail=[failure(Kind.THROTTLED, retry_after_s=5.0)])
    adapter = resilient(inner, max_attempts=3, max_retry_after_s=5.0)
    assert await adapter.predict_batch("r", ROWS, call()) == [{"y": 2}, {"y": 4}]
    assert inner.calls[1].at - inner.calls[0].at >= 5.0
