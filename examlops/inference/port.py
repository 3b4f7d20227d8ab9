"""``InferencePort[I, O]``: one spec's typed calls over whichever adapter the wiring bound it to.

Contract:

- ``predict(x)`` returns one ``O``; ``predict_many(batch)`` returns one ``O`` per instance, in order, or
  raises one ``InferenceError`` for the whole batch (never a partial result). An empty batch makes no call.
- ``predict_stream(instances, chunk_size=...)`` yields ``list[O]`` per chunk of instances, in order. Every
  chunk boundary checks the deadline (``Kind.TIMEOUT`` once it has passed) and is a cancellation point;
  closing the iterator early closes the backend's stream. It uses the adapter's ``stream_batches`` when
  ``capabilities.streaming``; a backend without it is refused (``inference_feature_unsupported``) unless
  the wiring allowed chunk emulation for the route (``emulate_streaming``): then each chunk is one
  ``predict_batch`` call. Every backend call of a stream carries ``Call.stream`` (a resilience policy
  gives it the circuit breaker only). A streaming backend gets consecutive windows of at most
  ``capabilities.max_batch`` instances, one ``stream_batches`` after the other under the same deadline
  (all instances validated before the first call; each window must answer exactly its instances); an
  emulated stream reads and validates the instances chunk by chunk.
- Instances are the spec's input model or mappings validated into it; outputs are validated into the
  spec's output model (``examlops.inference.shaping``).
- Refusals come before any I/O: a per-call option the backend does not offer (``offline`` needs
  ``offline_jobs``, ``deterministic`` needs the determinism promise, any other option must be in
  ``capabilities.options``) is ``FeatureUnsupported`` naming the feature and the backend.
- ``capabilities.max_batch`` is a cap on one backend call, not on the caller: the port sends a larger
  batch as consecutive calls of at most ``max_batch`` instances (one instance per call to a backend
  without ``native_batching``), one after the other under the same deadline, and still returns all or
  raises for all. This is not a degradation: the outputs are the ones one call would give (instances are
  independent), only the number of round trips differs.
- ``options={"timeout": timedelta(...) | seconds}`` binds the earlier of it and the ambient deadline
  (``examlops.inference.context``), never a later one. The port gives up by the deadline itself
  (``Kind.TIMEOUT``, the backend call cancelled) even when an adapter does not.
- An adapter's non-``InferenceError`` exception is INFRASTRUCTURE ``inference_adapter_error``, chained.
- ``on_capture`` (the caller's hook; the port writes nothing itself) gets one ``Capture`` per backend
  call (per chunk for streams): route, backend, inputs (each field ``"<redacted>"`` unless
  ``spec.capture_inputs``), outputs, duration, error (``examlops.inference.capture``).

The deadline, errors, shaping and capture around each backend call are ``backend_calls``; a native
stream's windows and re-chunking are ``native_stream``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import AsyncGenerator, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, cast

from examlops.inference.backend_calls import BackendCalls
from examlops.inference.capture import CaptureHook
from examlops.inference.context import current_criticality, current_trace_id, tightened
from examlops.inference.errors import FeatureUnsupported, InferenceError, Kind
from examlops.inference.native_stream import native_stream
from examlops.inference.ports import Adapter, Call, StreamingAdapter
from examlops.inference.shaping import input_rows
from examlops.inference.spec import I, InferenceSpec, O

DEFAULT_CHUNK_SIZE = 64
_PORT_OPTIONS = frozenset({"timeout", "offline", "deterministic"})


class InferencePort(Generic[I, O]):
    """Typed calls to the model wired to ``spec.name``; see the module docstring."""

    def __init__(
        self,
        spec: InferenceSpec[I, O],
        adapter: Adapter,
        *,
        on_capture: CaptureHook | None = None,
        emulate_streaming: bool = False,
    ) -> None:
        self.spec = spec
        self.adapter = adapter
        self._emulate_streaming = emulate_streaming
        self._calls = BackendCalls(spec, adapter, on_capture)

    @property
    def backend(self) -> str:
        return self.adapter.backend

    async def predict(self, x: I | Mapping[str, Any], *, options: Mapping[str, Any] | None = None) -> O:
        (output,) = await self.predict_many([x], options=options)
        return output

    async def predict_many(
        self, batch: Sequence[I | Mapping[str, Any]], *, options: Mapping[str, Any] | None = None
    ) -> list[O]:
        call = self._call(options)
        rows = input_rows(self.spec, batch)
        if not rows:
            return []
        return await self._predict_rows(rows, call)

    def predict_stream(
        self,
        instances: Iterable[I | Mapping[str, Any]],
        *,
        chunk_size: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> AsyncGenerator[list[O], None]:
        """Chunks of outputs; the refusals (feature, option, chunk size) are raised here, before any I/O."""
        caps = self.adapter.capabilities
        size = chunk_size or caps.max_batch or DEFAULT_CHUNK_SIZE
        if size < 1:
            raise InferenceError(Kind.VALIDATION, "chunk_size must be at least 1", route=self.spec.name)
        if not caps.streaming and not self._emulate_streaming:
            raise FeatureUnsupported("streaming", backend=self.backend, route=self.spec.name)
        call = dataclasses.replace(self._call(options), stream=True)
        if caps.streaming:
            rows = input_rows(self.spec, list(instances))
            return native_stream(self._calls, cast(StreamingAdapter, self.adapter), rows, size, call)
        return self._emulated_stream(iter(instances), size, call)

    async def _emulated_stream(
        self, source: Iterator[I | Mapping[str, Any]], size: int, call: Call
    ) -> AsyncGenerator[list[O], None]:
        """One ``predict_batch`` per chunk, the instances read lazily, chunk by chunk."""
        while chunk_in := list(itertools.islice(source, size)):
            await asyncio.sleep(0)  # a cancellation point at every boundary, even when the backend never waits
            yield await self._predict_rows(input_rows(self.spec, chunk_in), call)

    def _call(self, options: Mapping[str, Any] | None) -> Call:
        """The call's context, or a refusal before any I/O."""
        options = dict(options or {})
        caps = self.adapter.capabilities
        for key, value in options.items():
            if key == "offline" and value and not caps.offline_jobs:
                raise FeatureUnsupported("offline jobs", backend=self.backend, route=self.spec.name)
            if key == "deterministic" and value and not caps.deterministic:
                raise FeatureUnsupported("deterministic outputs", backend=self.backend, route=self.spec.name)
            if key not in _PORT_OPTIONS and key not in caps.options:
                raise FeatureUnsupported(f"the option {key!r}", backend=self.backend, route=self.spec.name)
        timeout = options.pop("timeout", None)
        return Call(
            route=self.spec.name,
            deadline=tightened(timeout),
            criticality=current_criticality(),
            trace_id=current_trace_id(),
            options=options,
        )

    async def _predict_rows(self, rows: list[dict[str, Any]], call: Call) -> list[O]:
        caps = self.adapter.capabilities
        step = (caps.max_batch or len(rows)) if caps.native_batching else 1
        outputs: list[O] = []
        for start in range(0, len(rows), step):
            outputs.extend(await self._one_call(rows[start : start + step], call))
        return outputs

    async def _one_call(self, rows: list[dict[str, Any]], call: Call) -> list[O]:
        started = time.monotonic()
        try:
            raw = await self._calls.bounded(call, lambda: self.adapter.predict_batch(self.spec.name, rows, call))
        except InferenceError as error:
            self._calls.capture(call, rows, None, started, error)
            raise
        return self._calls.shaped(call, rows, raw, started)
