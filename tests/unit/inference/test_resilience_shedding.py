"""Shedding by criticality: best effort first, then default; critical never by the policy."""

from __future__ import annotations

import asyncio

import pytest

from examlops.inference.context import Criticality
from examlops.inference.errors import InferenceError, Kind
from examlops.inference.ports import Call
from examlops.inference.resilience import SHED, Policy, ResilientAdapter, State
from tests.unit.inference.resilience_fakes import ScriptedAdapter, failure

pytestmark = pytest.mark.looptime

ROWS = [{"x": 1}]
BEST_EFFORT = Call(route="r", criticality=Criticality.BEST_EFFORT)
DEFAULT = Call(route="r", criticality=Criticality.DEFAULT)
CRITICAL = Call(route="r", criticality=Criticality.CRITICAL)


def resilient(inner: ScriptedAdapter, *, max_attempts: int = 1, failure_threshold: int = 3) -> ResilientAdapter:
    policy = Policy.from_mapping(
        {
            "retry": {"max_attempts": max_attempts, "jitter_s": 0},
            "hedge": {"enabled": False},
            "shedding": {"throttle_window_s": 5.0, "default_after": 3},
            "breaker": {"failure_threshold": failure_threshold, "failure_ratio": None, "open_s": 5.0},
        }
    )
    return ResilientAdapter(inner, policy, clock=asyncio.get_running_loop().time)


async def throttle(adapter: ResilientAdapter, times: int) -> None:
    for _ in range(times):
        with pytest.raises(InferenceError):
            await adapter.predict_batch("r", ROWS, CRITICAL)


async def shed(adapter: ResilientAdapter, call: Call) -> bool:
    try:
        await adapter.predict_batch("r", ROWS, call)
    except InferenceError as error:
        if error.code == SHED:
            assert error.kind is Kind.THROTTLED
            return True
        raise
    return False


async def test_nothing_is_shed_while_the_backend_is_not_short() -> None:
    adapter = resilient(ScriptedAdapter())
    assert [await shed(adapter, call) for call in (BEST_EFFORT, DEFAULT, CRITICAL)] == [False, False, False]


async def test_after_a_throttled_answer_best_effort_calls_are_shed_before_any_io() -> None:
    inner = ScriptedAdapter(fail=[failure(Kind.THROTTLED)])
    adapter = resilient(inner)
    await throttle(adapter, 1)
    assert await shed(adapter, BEST_EFFORT)
    assert len(inner.calls) == 1  # the shed call never reached the backend
    assert not await shed(adapter, DEFAULT)
    assert not await shed(adapter, CRITICAL)


async def test_more_throttled_answers_shed_default_calls_too_but_never_critical_ones() -> None:
    inner = ScriptedAdapter(fail=[failure(Kind.THROTTLED)] * 2)
    adapter = resilient(inner, failure_threshold=100)
    await throttle(adapter, 2)
    assert not await shed(adapter, DEFAULT)
    inner.fail = [failure(Kind.THROTTLED)]
    await throttle(adapter, 1)
    assert await shed(adapter, BEST_EFFORT)
    assert await shed(adapter, DEFAULT)
    assert not await shed(adapter, CRITICAL)


async def test_the_pressure_ends_when_the_throttled_answers_leave_the_window() -> None:
    inner = ScriptedAdapter(fail=[failure(Kind.THROTTLED)])
    adapter = resilient(inner)
    await throttle(adapter, 1)
    await asyncio.sleep(2.0)
    with pytest.raises(InferenceError) as raised:
        await adapter.predict_batch("r", ROWS, BEST_EFFORT)
    assert raised.value.retry_after_s == pytest.approx(3.0)
    await asyncio.sleep(3.1)
    assert not await shed(adapter, BEST_EFFORT)


async def test_a_half_open_breaker_sheds_best_effort_calls_and_keeps_its_probe_for_the_others() -> None:
    inner = ScriptedAdapter(fail=[failure(Kind.INFRASTRUCTURE)] * 3)
    adapter = resilient(inner)
    await throttle(adapter, 3)
    await asyncio.sleep(5.0)
    assert adapter.guard("r").breaker.state is State.HALF_OPEN
    assert await shed(adapter, BEST_EFFORT)
    assert not await shed(adapter, DEFAULT)  # the probe, which closes the breaker
    assert adapter.guard("r").breaker.state is State.CLOSED
    assert not await shed(adapter, BEST_EFFORT)


async def test_a_throttled_best_effort_call_is_not_retried_into_its_own_shedding() -> None:
    error = failure(Kind.THROTTLED)
    inner = ScriptedAdapter(fail=[error, failure(Kind.THROTTLED)])
    adapter = resilient(inner, max_attempts=3)
    with pytest.raises(InferenceError) as raised:
        await adapter.predict_batch("r", ROWS, BEST_EFFORT)
    assert raised.value is error  # the backend's answer, not a shed after a useless backoff
    assert len(inner.calls) == 1
    assert await adapter.predict_batch("r", ROWS, DEFAULT) == [{"y": 2}]  # retried once, then answered
    assert len(inner.calls) == 3
