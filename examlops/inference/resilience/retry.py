"""Retries by failure class, on tenacity: only what can succeed on a second try, never past the deadline.

``retry_call(attempt, ...)`` runs ``attempt`` and, when it raises an ``InferenceError`` that ``should_retry``
accepts (by default: ``error.retryable``, i.e. throttled or infrastructure), runs it again after a backoff:
``backoff_s * 2**n`` capped at ``max_backoff_s``, plus uniform jitter in [0, ``jitter_s``], and at least the
backend's ``retry_after_s`` when it gave one; a backend asking for more than ``max_retry_after_s`` is not
retried at all (its error is raised at once: nobody sleeps that long inside a call). It stops after
``max_attempts`` attempts in all, and it does not start a retry that cannot answer in time: one whose backoff
plus the route's typical latency (``expected_s()``) would end at or past the deadline. When it stops, the last
error is raised as it was. Any other exception (a non-retryable kind, cancellation) passes through at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential_jitter

from examlops.inference.errors import InferenceError
from examlops.inference.resilience.policy import RetryPolicy

T = TypeVar("T")


async def retry_call(
    attempt: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    deadline: float | None,
    clock: Callable[[], float],
    expected_s: Callable[[], float] = lambda: 0.0,
    should_retry: Callable[[InferenceError], bool] = lambda error: error.retryable,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """Run ``attempt`` under ``policy``; see the module docstring."""
    backoff = wait_exponential_jitter(multiplier=policy.backoff_s, max=policy.max_backoff_s, jitter=policy.jitter_s)

    def wait(state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        asked = error.retry_after_s if isinstance(error, InferenceError) else None
        return max(backoff(state), asked or 0.0)

    def stop(state: RetryCallState) -> bool:
        if state.attempt_number >= policy.max_attempts:
            return True
        return deadline is not None and clock() + state.upcoming_sleep + expected_s() >= deadline

    def accepted(error: BaseException) -> bool:
        if not isinstance(error, InferenceError):
            return False
        too_late = error.retry_after_s is not None and error.retry_after_s > policy.max_retry_after_s
        return not too_late and should_retry(error)

    async def once() -> T:
        # tenacity awaits only a coroutine function; ``attempt`` may be any callable returning an awaitable.
        return await attempt()

    retrying = AsyncRetrying(retry=retry_if_exception(accepted), wait=wait, stop=stop, sleep=sleep, reraise=True)
    return await retrying(once)
