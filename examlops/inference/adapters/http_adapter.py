"""``HttpAdapter``: what the HTTP adapters (``examlops``, ``kserve_v2``, ``mlflow``) share around their calls.

- One ``wire.HttpBackend`` lives as long as the adapter: ``start`` creates its client and ``close`` closes
  it, both idempotent; a call before ``start`` is ``PRECONDITION`` (``inference_adapter_not_started``).
- ``routes`` maps each route to the adapter's target. ``target(route)`` is ``route_unknown``
  (``PRECONDITION``) for a route the wiring did not give this adapter; ``batch_target(route, rows)`` adds
  ``check_batch`` (``FeatureUnsupported`` for a batch over ``max_batch``). Both refuse before any I/O.
- ``blamed(route)``: an ``InferenceError`` raised inside it (a codec or a target turning rows into a body,
  or a reply into outputs) names this backend and ``route``, as every error of a call does.

A subclass sets ``backend`` and ``capabilities`` and implements ``predict_batch`` (and ``stream_batches``
when its backend streams): how rows go on the wire stays the adapter's own.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Generic, TypeVar

from examlops.inference.adapters.wire import HttpBackend, check_batch
from examlops.inference.errors import InferenceError, route_unknown
from examlops.inference.ports import Capabilities, Row

TargetT = TypeVar("TargetT")


class HttpAdapter(Generic[TargetT]):
    """One HTTP backend, its routes' targets and the route lookup (module docstring)."""

    backend: str
    capabilities: Capabilities

    def __init__(self, routes: Mapping[str, TargetT], http: HttpBackend) -> None:
        self.routes = dict(routes)
        self._http = http

    async def start(self) -> None:
        await self._http.start()

    async def close(self) -> None:
        await self._http.close()

    def target(self, route: str) -> TargetT:
        """The route's target; ``route_unknown`` for a route not wired to this adapter."""
        try:
            return self.routes[route]
        except KeyError:
            raise route_unknown(route, backend=self.backend) from None

    def batch_target(self, route: str, rows: Sequence[Row]) -> TargetT:
        """The route's target for a batch of ``rows`` the adapter accepts (module docstring)."""
        target = self.target(route)
        check_batch(self.capabilities, len(rows), backend=self.backend, route=route)
        return target

    @contextmanager
    def blamed(self, route: str) -> Iterator[None]:
        """Name this backend and ``route`` on an ``InferenceError`` raised inside."""
        try:
            yield
        except InferenceError as exc:
            exc.backend, exc.route = self.backend, route
            raise
