"""The model routes: `POST /infer-pipeline/infer` (the bus bridge's) and `POST /v1/models/{model}/predict`
(direct callers': `exa predict`, dashboards, agents), one prediction each through the pipeline.

Both parse their own body in one step with pydantic-core's JSON parser (``InferBody`` names the model,
``PredictBody`` takes it from the path): a body that does not fit is 422 ``invalid_input`` naming the field.
Then, in order: the declared budget (body, ``X-Examlops-Budget-Ms``; the earlier of it and ``deadline``
wins), ``call`` on the model (403), ready (503 while the hot set loads or serving drains), alias or version
but not both (422), the pipeline. Every error is the one table's reply (``api.errors``) naming the model and
the job id; an answer is ``InferReply`` without ``task``. The call's trace (``api.tracing``) is filled as
the call goes.
"""

from __future__ import annotations

from typing import Any, Protocol

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from examlops.api.auth import SECURED, request_caller
from examlops.api.calls import answer, arrival, check_ready, declared_budget
from examlops.api.errors import describe_validation, documented, error_response
from examlops.api.lean import LeanRoute, path_parameters
from examlops.api.schemas import InferBody, InferReply, PredictBody
from examlops.api.tracing import call_of, named_model
from examlops.core.budget import effective_deadline
from examlops.core.errors import ExamlopsError, InvalidInput
from examlops.core.messages import InferenceRequest, InferenceResult
from examlops.identity import Caller

ERRORS = documented()


class Predicting(Protocol):
    """What the model routes need of the pipeline (``examlops.serving.pipeline.Pipeline``)."""

    @property
    def ready(self) -> bool: ...

    async def infer(self, request: InferenceRequest) -> InferenceResult: ...


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI request body of a route that parses its own body."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": model.model_json_schema(ref_template="#/components/schemas/{model}")}
            },
        }
    }


def _documented(kind: type[PredictBody], *path: str) -> dict[str, Any]:
    """What both model routes declare for the OpenAPI document."""
    return {
        "response_model": InferReply,
        "responses": ERRORS,
        "tags": ["inference"],
        "openapi_extra": json_body(kind) | SECURED | path_parameters(*path),
    }


def predict_routes(pipeline: Predicting) -> APIRouter:
    """The model routes over ``pipeline`` (module docstring)."""
    router = APIRouter(route_class=LeanRoute)

    async def serve(request: Request, kind: type[PredictBody], path_model: str | None, caller: Caller) -> Response:
        received_at = arrival(request)
        raw = await request.body()
        call = call_of(request)
        if call is not None:
            call.model = path_model
        # The hot routes parse the body with pydantic-core's JSON parser in one step rather than
        # FastAPI's json.loads followed by validation of Python objects: about a tenth of a
        # millisecond a request, where HTTP and JSON handling is the whole cost.
        try:
            body = kind.model_validate_json(raw)
        except ValidationError as exc:
            field, message = describe_validation(exc.errors(include_input=False))
            if call is not None and call.model is None:
                call.model = named_model(raw)
            return error_response(InvalidInput(message, field=field), model=path_model)
        model = body.model if isinstance(body, InferBody) else path_model or ""
        facts = call.facts if call is not None else None
        if call is not None:
            call.model, call.job_id, call.alias = model, body.job_id, body.alias
        try:
            budget_ms = declared_budget(request, body.budget_ms)
            deadline = effective_deadline(body.deadline, budget_ms, received_at)
            if call is not None:
                call.budget_ms, call.deadline = budget_ms, deadline
            caller.may_call(model=model)
            check_ready(pipeline, request)
            if body.alias is not None and body.version is not None:
                raise InvalidInput("give either alias or version, not both", field="version")
            result = await pipeline.infer(
                InferenceRequest(
                    model=model,
                    embedding=tuple(body.embedding),
                    node_count=body.node_count,
                    alias=body.alias,
                    version=None if body.version is None else str(body.version),
                    job_id=body.job_id,
                    user_id=body.user_id,
                    deadline=deadline,
                    facts=facts,
                    budget_ms=budget_ms,
                    identity=caller.name,
                )
            )
        except ExamlopsError as exc:
            return error_response(exc, model=model, job_id=body.job_id)
        if call is not None:
            call.model, call.alias, call.version = result.model, result.alias, result.version
        reply = answer(result, budget_ms=budget_ms, deadline=deadline)
        return Response(reply.model_dump_json(exclude={"task"}), media_type="application/json")

    @router.post("/infer-pipeline/infer", **_documented(InferBody))
    async def infer(request: Request) -> Response:
        """One prediction through the pipeline: the route the bus bridge calls."""
        return await serve(request, InferBody, None, await request_caller(request))

    @router.post("/v1/models/{model}/predict", **_documented(PredictBody, "model"))
    async def predict(request: Request) -> Response:
        """One prediction for direct callers (`exa predict`, dashboards, agents); records nothing."""
        model: str = request.path_params["model"]
        caller = await request_caller(request)
        caller.may_call(model=model)
        return await serve(request, PredictBody, model, caller)

    return router
