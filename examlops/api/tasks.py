"""The task route: `POST /v1/tasks/{task}/infer`, a call that names what it wants done, never a model.

The task map (``examlops.tasks``) picks model and alias; the call then goes through the same pipeline
as the model routes and its reply names the task and the model, alias and version that answered. An
alias the map names that is the model's default alias takes the model's traffic split, as any call to
the default alias does. A task that is not mapped: 404 ``unknown_task`` naming at most a short prefix of
it. The route takes the same dependencies as `/infer-pipeline/infer` (see ``task_routes``); the checks
before the pipeline are ``task_calls.open_task_call``, shared with the task's stream route.
"""

from __future__ import annotations

from typing import Protocol

from fastapi import APIRouter, Request
from fastapi.responses import Response

from examlops.api.auth import SECURED
from examlops.api.calls import answer
from examlops.api.errors import documented, error_response
from examlops.api.lean import LeanRoute, path_parameters
from examlops.api.schemas import InferReply, TaskInferBody
from examlops.api.task_calls import Tasks, open_task_call
from examlops.core.errors import ExamlopsError
from examlops.core.messages import InferenceRequest, InferenceResult

TASK_ERRORS = documented(
    s403="the identity lacks the permission the reply names (call on this task or its model)",
    s404="the task is not mapped (code unknown_task), or the model it maps to has no such alias",
)


class Inference(Protocol):
    """What the route needs of the pipeline."""

    @property
    def ready(self) -> bool: ...

    async def infer(self, request: InferenceRequest) -> InferenceResult: ...


def task_routes(pipeline: Inference, tasks: Tasks) -> APIRouter:
    """The task routes over ``pipeline`` and ``tasks``.

    The route takes what `/infer-pipeline/infer` takes: the raw request (parsed by hand for speed) and the
    caller, who must hold ``call`` on the task and on the model it maps to.
    """
    router = APIRouter(tags=["inference"], route_class=LeanRoute)

    @router.post(
        "/v1/tasks/{task}/infer",
        response_model=InferReply,
        responses=TASK_ERRORS,
        openapi_extra=SECURED
        | path_parameters("task")
        | {
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": TaskInferBody.model_json_schema(ref_template="#/components/schemas/{model}")
                    }
                },
            }
        },
    )
    async def infer_task(request: Request) -> Response:
        """One prediction for a task: the site's task map picks the model and alias that answer it."""
        task: str = request.path_params["task"]
        opened = await open_task_call(request, task, TaskInferBody, pipeline, tasks)
        if isinstance(opened, Response):
            return opened
        body, call, route = opened.body, opened.call, opened.route
        budget_ms, deadline = opened.budget_ms, opened.deadline
        if call is not None:
            call.task, call.model, call.alias, call.job_id = route.task, route.model, route.alias, body.job_id
            call.budget_ms, call.deadline = budget_ms, deadline
        try:
            result = await pipeline.infer(
                InferenceRequest(
                    model=route.model,
                    embedding=tuple(body.embedding),
                    node_count=body.node_count,
                    alias=route.alias,
                    job_id=body.job_id,
                    user_id=body.user_id,
                    deadline=deadline,
                    metadata={"task": route.task},
                    facts=call.facts if call is not None else None,
                    budget_ms=budget_ms,
                    task=route.task,
                    identity=opened.caller.name,
                )
            )
        except ExamlopsError as exc:
            return error_response(exc, model=route.model, job_id=body.job_id)
        if call is not None:
            call.model, call.alias, call.version = result.model, result.alias, result.version
        reply = answer(result, budget_ms=budget_ms, deadline=deadline, task=route.task)
        return Response(reply.model_dump_json(), media_type="application/json")

    return router
