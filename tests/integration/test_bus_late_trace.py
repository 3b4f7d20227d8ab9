"""A bus job that serving answers after its deadline: its trace says what the caller got, not what serving did.

Real Redis, a real bridge with its trace writer on real SQLite, and the stand-in for serving from
``test_bus_bridge`` slowed past the job's deadline. Serving's own record of the call ("answered", as the
real serving writes it under the bridge's trace id) is written before or after the bridge's.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from examlops.bootstrap import sql_engine
from examlops.bootstrap.bridge import bus_client
from examlops.bootstrap.tracing import call_tracer
from examlops.core.errors import DeadlineExceeded
from examlops.core.settings import TracingSettings
from examlops.tracing import TraceQuery, TraceRecord, trace_id_for_job
from examlops.tracing.sql_store import SqlTraceStore
from tests.integration.test_bus_bridge import (
    ADDRESS,
    PAYLOAD,
    StandIn,
    bus_settings,
    redis_url,
    running_bridge,
    standin,
    until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

__all__ = ["redis_url", "standin"]  # the fixtures


def servings_record(trace_id: str) -> TraceRecord:
    """What serving writes for a bus call it answered with a 200."""
    return TraceRecord(
        trace_id=trace_id,
        at=time.time(),
        channel="bus",
        outcome="answered",
        model="JPCP",
        alias="Production",
        version="1",
        node="serving-a",
        batch_id="b-1",
        batch_size=1,
        queue_wait_ms=0.5,
        predict_ms=1.0,
        status=200,
        job_id="late",
    )


@pytest.mark.parametrize("serving_first", [True, False])
async def test_a_late_answer_is_traced_as_the_refusal_the_caller_got(
    tmp_path: Path, redis_url: str, standin: StandIn, serving_first: bool
) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    settings = settings.model_copy(update={"tracing": TracingSettings(node="bridge-a")})
    engine = sql_engine(settings)
    store = SqlTraceStore(engine)
    trace_id = trace_id_for_job("late")
    if serving_first:
        store.add([servings_record(trace_id)])
    standin.delay = 1.5
    tracer = call_tracer(settings, engine)
    tracer.start()
    try:
        async with running_bridge(settings, tracer=tracer), bus_client(settings) as client:
            try:
                reply = await client.request(ADDRESS, PAYLOAD, 0.5, job_id="late")
            except DeadlineExceeded:
                pass  # the client's own wait ran out first
            else:  # the bridge's hop timed out at the same deadline and its error reply won the race
                assert reply.get("code") == DeadlineExceeded.code, reply
            await until(lambda: standin.seen == ["late"])
    finally:
        await asyncio.to_thread(tracer.close)
    if not serving_first:
        store.add([servings_record(trace_id)])
    record = store.get(trace_id)
    assert record is not None
    assert (record.outcome, record.error_code, record.channel, record.job_id) == (
        "refused",
        "deadline_exceeded",
        "bus",
        "late",
    )
    assert (record.version, record.batch_id, record.predict_ms) == ("1", "b-1", 1.0)  # serving's facts kept
    assert store.count(TraceQuery()) == 1
    engine.dispose()
