"""The hot routes' route class refuses an endpoint it could not call with the request alone."""

from __future__ import annotations

import pytest
from fastapi import APIRouter, Request, Response

from examlops.api.lean import LeanRoute


def test_an_endpoint_with_more_than_the_request_is_refused_when_the_route_is_built() -> None:
    router = APIRouter(route_class=LeanRoute)

    async def takes_a_model(model: str, request: Request) -> Response:
        return Response()

    with pytest.raises(TypeError, match="takes the request alone"):
        router.post("/v1/models/{model}/predict")(takes_a_model)


def test_an_endpoint_that_is_not_async_is_refused_when_the_route_is_built() -> None:
    router = APIRouter(route_class=LeanRoute)

    def not_async(request: Request) -> Response:
        return Response()

    with pytest.raises(TypeError, match="coroutine function"):
        router.post("/v1/models/{model}/predict")(not_async)
