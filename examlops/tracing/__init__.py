"""The trace of every call (issue 16): records, the payload policy, the store port, the sink and the tracer."""

from examlops.tracing.policy import PayloadPolicy
from examlops.tracing.record import (
    CHANNEL_HEADER,
    IDENTITY_HEADER,
    OUTCOMES,
    TRACE_HEADER,
    TraceRecord,
    new_trace_id,
    outcome_of,
    trace_fields,
    trace_id_for_job,
    valid_trace_id,
)
from examlops.tracing.sink import SinkStats, TraceSink
from examlops.tracing.store import Pruned, TraceQuery, TraceStore
from examlops.tracing.tracer import CallTrace, Tracer

__all__ = [
    "CHANNEL_HEADER",
    "IDENTITY_HEADER",
    "OUTCOMES",
    "TRACE_HEADER",
    "CallTrace",
    "PayloadPolicy",
    "Pruned",
    "SinkStats",
    "TraceQuery",
    "TraceRecord",
    "TraceSink",
    "TraceStore",
    "Tracer",
    "new_trace_id",
    "outcome_of",
    "trace_fields",
    "trace_id_for_job",
    "valid_trace_id",
]
