"""The hot routes' route class: FastAPI documents the route, the endpoint is called with the request alone.

``LeanRoute`` is for endpoints that take the ``Request`` alone (they parse their own body, read their path
parameters from ``request.path_params`` and check the caller themselves) and return a ``Response``:
FastAPI's dependency solving, parameter validation and response serialisation have nothing to do for them,
and skipping them takes the larger part of FastAPI's own time off each call (``bench/route_cost.py``).
The route is still in the OpenAPI document, with the path parameters ``path_parameters`` declares; errors
the endpoint raises reach the app's exception handlers as any route's do.

Failure mode: an endpoint with any parameter but the request, or not async, is refused when the route is built.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute


class LeanRoute(APIRoute):
    """An ``APIRoute`` whose handler calls ``endpoint(request)`` directly (module docstring)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        endpoint = self.endpoint
        parameters = list(inspect.signature(endpoint).parameters.values())
        if len(parameters) != 1 or parameters[0].annotation not in (Request, "Request"):
            raise TypeError(f"{self.path}: a LeanRoute's endpoint takes the request alone")
        if not inspect.iscoroutinefunction(endpoint):
            raise TypeError(f"{self.path}: a LeanRoute's endpoint is a coroutine function")

        async def handler(request: Request) -> Response:
            response: Response = await endpoint(request)
            return response

        return handler


def path_parameters(*names: str) -> dict[str, Any]:
    """``openapi_extra`` declaring ``names`` as required string path parameters (a ``LeanRoute``'s endpoint
    does not name them in its signature, where FastAPI would find them)."""
    return {
        "parameters": [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}} for name in names]
    }
