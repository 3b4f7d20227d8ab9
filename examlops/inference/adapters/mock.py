"""``MockInferenceRegistry``: an adapter answering routes from pure synchronous functions (seed 002).

``registry.on(route, fn)`` programs a route; ``fn`` gets the batch's instances and returns one mapping
per instance. Given a spec (``on(SPEC, fn)``) the instances are the spec's input models; given a route
name they are read-only attribute views of the rows (``instance.amount``). The registry is itself the
adapter: wire it as a route's target (``Wiring({"fraud_scorer": registry})``).

- An unprogrammed route fails closed: PRECONDITION ``mock.inference.unprogrammed``, nothing invented.
- A function that raises is MODEL_FAILURE ``mock.inference.failed`` (chained).
- What a function returns goes through the port's output shaping like any backend's answer, so a
  mis-shaped stub fails exactly where a mis-shaped backend would.
- Deterministic by contract (``capabilities.deterministic``): the functions must be pure; streaming is
  one function call per chunk. ``calls`` records every (route, rows) the adapter was asked, in order.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, overload

from examlops.inference.errors import InferenceError, Kind
from examlops.inference.ports import Call, Capabilities, Row
from examlops.inference.spec import I, InferenceSpec

MockFunction = Callable[[list[Any]], Sequence[Mapping[str, Any]]]


class RowView(Mapping[str, Any]):
    """A row read as attributes (``view.amount``) or as a mapping; never written."""

    __slots__ = ("_row",)

    def __init__(self, row: Mapping[str, Any]) -> None:
        self._row = row

    def __getattr__(self, name: str) -> Any:
        try:
            return self._row[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, key: str) -> Any:
        return self._row[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._row)

    def __len__(self) -> int:
        return len(self._row)

    def __repr__(self) -> str:
        return f"RowView({dict(self._row)!r})"


class MockInferenceRegistry:
    """The mock adapter; see the module docstring."""

    backend = "mock"

    def __init__(self, *, max_batch: int | None = None) -> None:
        self.capabilities = Capabilities(native_batching=True, max_batch=max_batch, streaming=True, deterministic=True)
        self._routes: dict[str, tuple[MockFunction, Callable[[Row], Any]]] = {}
        self.calls: list[tuple[str, tuple[Row, ...]]] = []

    @overload
    def on(self, route: str, fn: Callable[[list[RowView]], Sequence[Mapping[str, Any]]]) -> MockInferenceRegistry: ...

    @overload
    def on(
        self, route: InferenceSpec[I, Any], fn: Callable[[list[I]], Sequence[Mapping[str, Any]]]
    ) -> MockInferenceRegistry: ...

    def on(self, route: str | InferenceSpec[Any, Any], fn: Callable[[list[Any]], Any]) -> MockInferenceRegistry:
        """Answer ``route`` with ``fn`` (replacing what it had); returns the registry for chaining."""
        if isinstance(route, InferenceSpec):
            model = route.input
            self._routes[route.name] = (fn, model.model_validate)
        else:
            self._routes[route] = (fn, RowView)
        return self

    def with_max_batch(self, max_batch: int | None) -> MockInferenceRegistry:
        """The same registry declaring a batch cap (to exercise the port's splitting)."""
        self.capabilities = replace(self.capabilities, max_batch=max_batch)
        return self

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def predict_batch(self, route: str, rows: Sequence[Row], call: Call) -> Sequence[Row]:
        self.calls.append((route, tuple(rows)))
        programmed = self._routes.get(route)
        if programmed is None:
            raise InferenceError(
                Kind.PRECONDITION,
                f"no function is programmed for the route {route!r}",
                code="mock.inference.unprogrammed",
                backend=self.backend,
                route=route,
            )
        fn, instance = programmed
        try:
            answer = fn([instance(row) for row in rows])
        except Exception as exc:
            raise InferenceError(
                Kind.MODEL_FAILURE,
                f"the mock function for {route!r} raised {type(exc).__name__}",
                code="mock.inference.failed",
                backend=self.backend,
                route=route,
            ) from exc
        return list(answer) if isinstance(answer, (list, tuple)) else answer  # shaping judges the rest

    async def stream_batches(self, route: str, rows: Sequence[Row], call: Call) -> AsyncIterator[Sequence[Row]]:
        size = int(call.options.get("chunk_size") or len(rows) or 1)
        for start in range(0, len(rows), size):
            yield await self.predict_batch(route, rows[start : start + size], call)
