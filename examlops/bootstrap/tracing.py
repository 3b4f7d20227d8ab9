"""The tracing assembly: the tracer of a serving instance or bridge, and the trace reader of `exa` and the API.

``call_tracer(settings, engine, registry, in_child=...)``: a ``Tracer`` over a ``TraceSink`` writing to SQL
with the settings' bound, batch, retention and payload policy (not started: its owner starts and closes
it), from a child process with ``in_child`` (serving's: ``trace_writer``) when the environment gives the same
database (else from the sink's thread); with ``tracing.enabled`` off, a tracer that gives ids and stores
nothing. ``trace_reader(engine)``: the
``TraceStore`` to read traces with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from examlops.core.settings import Settings

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from sqlalchemy.engine import Engine

    from examlops.tracing import Tracer, TraceStore


def trace_reader(engine: Engine) -> TraceStore:
    from examlops.tracing.sql_store import SqlTraceStore

    return SqlTraceStore(engine)


def call_tracer(
    settings: Settings, engine: Engine, registry: CollectorRegistry | None = None, *, in_child: bool = False
) -> Tracer:
    from examlops.bootstrap.trace_writer import ChildTraceStore, sql_digest
    from examlops.tracing import PayloadPolicy, Tracer, TraceSink
    from examlops.tracing.sql_store import SqlTraceStore

    tracing = settings.tracing
    if not tracing.enabled:
        return Tracer(None, node=tracing.node)
    store: TraceStore = SqlTraceStore(engine)
    if in_child and sql_digest(Settings()) == sql_digest(settings):  # the child reads its settings from env
        store = ChildTraceStore(settings, store)
    sink = TraceSink(
        store,
        bound=tracing.bound,
        batch=tracing.batch,
        linger_s=tracing.linger_s,
        payload_max_age_s=tracing.payload_retention_s,
        row_max_age_s=tracing.retention_s,
        prune_every_s=tracing.prune_every_s,
        registry=registry,
    )
    return Tracer(sink, PayloadPolicy(tracing.payload), node=tracing.node)
