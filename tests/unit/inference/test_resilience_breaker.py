"""The circuit breaker per route: opens on failures of the counted kinds, fails fast, probes, recovers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from examlops.inference.errors import InferenceError, Kind
from examlops.inference.ports import Call
from examlops.inference.resilience import CIRCUIT_OPEN, Policy, ResilientAdapter, State
from tests.unit.inference.resilience_fakes import ScriptedAdapter, failure

pytestmark = pytest.mark.looptime

ROWS = [{"x": 1}]
CALL = Call(route="r")


def resilient(inner: ScriptedAdapter, **breaker: Any) -> ResilientAdapter:
    settings = {"failure_threshold": 3, "failure_ratio": None, "open_s": 5.0, **breaker}
    policy = Policy.from_mapping(
        {
            "retry": {"max_attempts": 1},
            "hedge": {"enabled": False},
            "shedding": {"enabled": False},
            "breaker": settings,
        }
    )
    return ResilientAdapter(inner, policy, clock=asyncio.get_running_loop().time)


async def fail_times(adapter: ResilientAdapter, n: int, route: str = "r") -> None:
    for _ in range(n):
        with pytest.raises(InferenceError):
            await adapter.predict_batch(route, ROWS, Call(route=route))


async def test_the_breaker_opens_after_the_threshold_and_then_fails_fast_without_calling_the_backend() -> None:
    inner = ScriptedAdapter(fail=[failure(Kind.INFRASTRUCTURE)] * 3)
    adapter = resilient(inner)
    await fail_times(adapter, 3)
    assert adapter.guard("r").breaker.state is State.OPEN
    await asyncio.sleep(1.0)
    with pytest.raises(InferenceError) as raised:
        await adapter.predict_batch("r", ROWS, CALL)
    assert raised.value.kind is Kind.INFRASTRUCTURE
    assert raised.value.code == CIRCUIT_OPEN
    assert raised.value.retry_after_s == pytest.approx(4.0)  # the time left until half-open
    assert len(inner.calls) == 3


async def test_failures_the_backend_is_not_to_blame_for_never_open_it() -> None:
    inner = ScriptedAdapter(fail=[failure(Kind.VALIDATION), failure(Kind.MODEL_FAILURE), failure(Kind.TIMEOUT)] * 3)
    adapter = resilient(inner)
    await fail_times(adapter, 9)
    assert adapter.guard("r").breaker.state is State.CLOSED


async def test_failures_older_than_the_window_are_forgotten() -> None:
    inner = ScriptedAdapter(fail=[failure(Kind.INFRASTRUCTURE)] * 4)
    adapter = resilient(inner, window_s=10.0)
    await fail_times(adapter, 2)
    await asyncio.sleep(11.0)
    await fail_times(adapter, 2)
    assert adapter.guard("r").breaker.state is State.CLOSED


async def test_the_breaker_opens_on_a_failure_ratio_over_enough_calls() -> None:
    fails = [None, failure(Kind.THROTTLED)] * 5
    inner = ScriptedAdapter(fail=fails)
    adapter = resilient(inner, failure_threshold=100, failure_ratio=0.5, min_calls=10)
    for outcome in fails[:-1]:
        if outcome is None:
            await adapter.predict_batch("r", ROWS, CALL)
        else:
            await fail_times(adapter, 1)
    assert adapter.guard("r").breaker.state is State.CLOSED  # 4 of 9: under the ratio
    await fail_times(adapter, 1)
    assert adapter.guard("r").breaker.state is State.OPEN  # 5 of 10


async def test_each_route_has_its_own_breaker() -> None:
    inner = ScriptedAdapter(fail=[failure(Kind.INFRASTRUCTURE)] * 3)
    adapter = resilient(inner)
    await fail_times(adapter, 3, route="broken")
    assert await adapter.predict_batch("fine", ROWS, Call(route="fine")) == [{"y": 2}]


async def test_a_half_open_breaker_lets_one_probe_through_and_closes_when_it_succeeds() -> None:
    inner = ScriptedAdapter(fail=[failure(Kind.INFRASTRUCTURE)] * 3, latency=lambda n: 0.5 if n == 3 else 0.0)
    adapter = resilient(inner)
    await fail_times(adapter, 3)
    await asyncio.sleep(5.0)
    assert adapter.guard("r").breaker.state is State.HALF_OPEN
    probe = asyncio.create_task(adapter.predict_batch("r", ROWS, CALL))
    await asyncio.sleep(0.1)
    with pytest.raises(InferenceError) as raised:  # a second call while the probe is out
        await adapter.predict_batch("r", ROWS, CALL)
    assert raised.value.code == CIRCUIT_OPEN
    assert await probe == [{"y": 2}]
    assert adapter.guard("r").breaker.state is State.CLOSED
    assert await adapter.predict_batch("r", ROWS, CALL) == [{"y": 2}]
    assert len(inner.calls) == 5


async def test_a_failed_probe_opens_the_breaker_again_for_the_whole_open_time() -> None:
    inner = ScriptedAdapter(fail=[failure(Kind.INFRASTRUCTURE)] * 4)
    adapter = resilient(inner)
    await fail_times(adapter, 3)
    await asyncio.sleep(5.0)
    await fail_times(adapter, 1)  # the probe
    breaker = adapter.guard("r").breaker
    states = [breaker.state]
    await asyncio.sleep(4.9)
    states.append(breaker.state)
    await asyncio.sleep(0.1)
    states.append(breaker.state)
    assert await adapter.predict_batch("r", ROWS, CALL) == [{"y": 2}]
    states.append(breaker.state)
    assert states == [State.OPEN, State.OPEN, State.HALF_OPEN, State.CLOSED]


async def test_a_cancelled_probe_frees_its_place() -> None:
    inner = ScriptedAdapter(fail=[failure(Kind.INFRASTRUCTURE)] * 3, latency=lambda n: 10.0 if n == 3 else 0.0)
    adapter = resilient(inner)
    await fail_times(adapter, 3)
    await asyncio.sleep(5.0)
    probe = asyncio.create_task(adapter.predict_batch("r", ROWS, CALL))
    await asyncio.sleep(0.1)
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    assert adapter.guard("r").breaker.state is State.HALF_OPEN
    assert await adapter.predict_batch("r", ROWS, CALL) == [{"y": 2}]
    assert adapter.guard("r").breaker.state is State.CLOSED


async def test_an_open_circuit_is_not_retried_by_the_policy() -> None:
    inner = ScriptedAdapter(fail=[failure(Kind.INFRASTRUCTURE)] * 3)
    policy = Policy.from_mapping(
        {
            "retry": {"max_attempts": 3, "jitter_s": 0},
            "hedge": {"enabled": False},
            "breaker": {"failure_threshold": 2, "failure_ratio": None},
        }
    )
    adapter = ResilientAdapter(inner, policy, clock=asyncio.get_running_loop().time)
    loop = asyncio.get_running_loop()
    with pytest.raises(InferenceError) as raised:
        await adapter.predict_batch("r", ROWS, CALL)  # fails, retries, fails, opens: the third attempt fails fast
    assert raised.value.code == CIRCUIT_OPEN
    assert len(inner.calls) == 2
    started = loop.time()
    with pytest.raises(InferenceError):
        await adapter.predict_batch("r", ROWS, CALL)
    assert loop.time() == started
