"""``BackendCalls``: what the port does around every backend call of one route, streamed or not.

- ``bounded(call, start)`` awaits ``start()`` by the call's deadline: a deadline already passed is
  ``Kind.TIMEOUT`` (``inference_timeout``) before ``start`` is called, one that passes meanwhile cancels the
  backend call and is ``Kind.TIMEOUT`` too; an adapter's ``InferenceError`` passes as it is, any other
  exception is INFRASTRUCTURE ``inference_adapter_error``, chained (``StopAsyncIteration`` is ``ended()``
  when given: a stream that ended early).
- ``shaped(call, rows, raw, started)``: the backend's rows as the spec's output models (``shaping``), and
  one ``Capture`` for the call, with the error when they do not fit.
- ``capture``: one ``Capture`` per backend call (per chunk for streams) to the caller's hook; the port writes
  nothing itself (``capture``).

Every error names the backend and the route (the spec's name).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar, cast

from examlops.inference.capture import CaptureHook, emit
from examlops.inference.errors import InferenceError, Kind
from examlops.inference.ports import Adapter, Call, Row
from examlops.inference.shaping import output_models
from examlops.inference.spec import I, InferenceSpec, O

T = TypeVar("T")


class BackendCalls(Generic[I, O]):
    """The deadline, the errors the port raises itself, shaping and capture of one route's backend calls."""

    def __init__(self, spec: InferenceSpec[I, O], adapter: Adapter, on_capture: CaptureHook | None) -> None:
        self.spec = spec
        self.adapter = adapter
        self._on_capture = on_capture

    @property
    def backend(self) -> str:
        return self.adapter.backend

    def remaining(self, call: Call) -> float | None:
        """Seconds left; TIMEOUT (before any I/O) once the deadline has passed."""
        remaining = call.remaining_s()
        if remaining is not None and remaining <= 0:
            raise self.timeout()
        return remaining

    async def bounded(
        self, call: Call, start: Callable[[], Awaitable[T]], *, ended: Callable[[], InferenceError] | None = None
    ) -> T:
        """``start()``'s result, held to the call's deadline, its failures in the port's taxonomy (module
        docstring)."""
        remaining = self.remaining(call)
        try:
            async with asyncio.timeout(remaining):
                return await start()
        except StopAsyncIteration as exc:
            if ended is None:
                raise self.adapter_error(exc) from exc
            raise ended() from None
        except TimeoutError:
            raise self.timeout() from None
        except InferenceError:
            raise
        except Exception as exc:
            raise self.adapter_error(exc) from exc

    def timeout(self) -> InferenceError:
        return InferenceError(
            Kind.TIMEOUT, "the deadline passed", code="inference_timeout", backend=self.backend, route=self.spec.name
        )

    def adapter_error(self, exc: BaseException) -> InferenceError:
        return InferenceError(
            Kind.INFRASTRUCTURE,
            f"the {self.backend} adapter failed: {type(exc).__name__}",
            code="inference_adapter_error",
            backend=self.backend,
            route=self.spec.name,
        )

    def miscount(self, message: str) -> InferenceError:
        """A backend that answered more or fewer outputs than the instances it was sent."""
        return InferenceError(
            Kind.VALIDATION, message, code="inference_output_invalid", backend=self.backend, route=self.spec.name
        )

    def shaped(self, call: Call, rows: Sequence[Mapping[str, Any]], raw: Sequence[Row], started: float) -> list[O]:
        """The backend's outputs for ``rows`` as output models, captured (module docstring)."""
        try:
            shaped = cast(list[O], output_models(self.spec, raw, expected=len(rows), backend=self.backend))
        except InferenceError as error:
            self.capture(call, rows, None, started, error)
            raise
        self.capture(call, rows, raw, started, None)
        return shaped

    def capture(
        self,
        call: Call,
        rows: Sequence[Mapping[str, Any]],
        outputs: Sequence[Row] | None,
        started: float,
        error: InferenceError | None,
    ) -> None:
        emit(self._on_capture, self.spec, self.backend, call, rows, outputs, started, error)
