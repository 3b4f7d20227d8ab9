"""What an adapter is to the inference port: plain rows in, plain rows out, capabilities declared.

The port (``examlops.inference.port``) validates a handler's typed instances against the spec, dumps
them to JSON-able mappings, hands them to its route's ``Adapter`` with the ``Call`` (deadline,
criticality, trace id, options), and shapes what comes back into the spec's output model. Adapters never
see the handler's types, and nothing of a backend (URI, format, protocol) crosses the port.

Adapter contract:

- ``predict_batch(route, rows, call)`` returns exactly one mapping per row, in row order, or raises
  ``InferenceError`` (``examlops.inference.errors``) for the whole batch; it never returns a partial
  result. It must give up by ``call.deadline`` (``Kind.TIMEOUT``) and be cancellable.
- ``stream_batches`` exists only on adapters whose ``capabilities.streaming`` is true: it yields lists
  of output mappings for consecutive chunks of ``rows``, in order, one output per row in all (the port
  passes its chunk size as ``call.options["chunk_size"]`` and re-chunks what it gets, so an adapter may
  yield smaller or larger lists).
- ``start`` warms what the adapter needs (a local adapter loads its models and fails closed on a loader
  error); ``close`` releases it. Both are idempotent.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from examlops.inference.context import Criticality

Row = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend offers; the port refuses a call needing more before any I/O."""

    native_batching: bool = False
    """Many instances go in one backend call (else one call per instance)."""
    max_batch: int | None = None
    """The most instances one backend call may carry (None: no cap)."""
    streaming: bool = False
    """The backend streams chunks of a long call (``stream_batches``)."""
    offline_jobs: bool = False
    """The backend takes non-interactive jobs."""
    deterministic: bool = False
    """The same input always gives the same output."""
    options: frozenset[str] = frozenset()
    """Per-call options beyond the port's own (``timeout``, ``offline``, ``deterministic``) that this
    backend understands; the port refuses any other option before I/O."""


@dataclass(frozen=True, slots=True)
class Call:
    """One call as an adapter sees it."""

    route: str
    """The spec's name: what the wiring bound to this adapter."""
    deadline: float | None = None
    """``time.monotonic()`` seconds after which nobody waits (the earlier of the per-call timeout and the
    ambient deadline)."""
    criticality: Criticality = Criticality.DEFAULT
    trace_id: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    stream: bool = False
    """The call is part of a ``predict_stream`` (a native stream, or a chunk of an emulated one): a
    resilience policy applies only its circuit breaker, never retries, hedges or sheds it."""

    def remaining_s(self, now: float | None = None) -> float | None:
        """Seconds left until the deadline (0 once passed), or None without one."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - (time.monotonic() if now is None else now))


@runtime_checkable
class Adapter(Protocol):
    """A backend the port calls; see the module docstring."""

    backend: str
    """Its kind: ``local``, ``examlops``, ``kserve_v2``, ``mlflow``, ``mock``."""
    capabilities: Capabilities

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def predict_batch(self, route: str, rows: Sequence[Row], call: Call) -> Sequence[Row]: ...


class StreamingAdapter(Adapter, Protocol):
    """An adapter whose backend streams (``capabilities.streaming``)."""

    def stream_batches(self, route: str, rows: Sequence[Row], call: Call) -> AsyncIterator[Sequence[Row]]: ...
