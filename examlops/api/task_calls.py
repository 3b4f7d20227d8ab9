"""How a task route opens a call, before its pipeline work: the part `POST /v1/tasks/{task}/infer`
(``tasks``) and `POST /v1/tasks/{task}/stream` (``stream``) share.

``open_task_call(request, task, kind, pipeline, tasks)``, in this order:

1. notes the task (at most its first 128 characters) on the call's trace and authenticates the caller
   (``Unauthenticated`` propagates to the app's handler, as from any route);
2. parses the body as ``kind`` in one step (pydantic-core's JSON parser): a body that does not fit is
   answered 422 ``invalid_input`` naming the field, with no model;
3. checks that serving is ready, resolves the task (404 ``unknown_task``), checks that the caller holds
   ``call`` on the task and on its model (403), and reads the declared budget (the body's ``budget_ms``,
   else ``X-Examlops-Budget-Ms``, else the task's default); an error here is answered with the model once
   the task resolved to one, and the body's ``job_id`` when it has one.

It returns the opened call (``TaskCall``: body, caller, trace, route, budget and the effective deadline),
or the error ``Response`` the route returns as it is. Nothing is sent to the pipeline here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from fastapi import Request
from fastapi.responses import Response
from pydantic import ValidationError

from examlops.api.auth import request_caller
from examlops.api.calls import Ready, arrival, check_ready, declared_budget
from examlops.api.errors import describe_validation, error_response
from examlops.api.schemas import TaskInferBody, TaskStreamBody
from examlops.api.tracing import call_of
from examlops.core.budget import effective_deadline
from examlops.core.errors import ExamlopsError, InvalidInput
from examlops.identity import Caller
from examlops.tracing import CallTrace

if TYPE_CHECKING:
    from examlops.tasks.routes import TaskRoute

B = TypeVar("B", TaskInferBody, TaskStreamBody)


class Tasks(Protocol):
    """What the task routes need of the task resolver (``examlops.tasks.TaskResolver``)."""

    async def resolve(self, task: str) -> TaskRoute: ...


@dataclass(frozen=True, slots=True)
class TaskCall(Generic[B]):
    """A task call that passed every check before the pipeline (module docstring)."""

    body: B
    caller: Caller
    call: CallTrace | None
    route: TaskRoute
    budget_ms: float | None
    deadline: float | None


async def open_task_call(
    request: Request, task: str, kind: type[B], pipeline: Ready, tasks: Tasks
) -> TaskCall[B] | Response:
    """The opened call, or the error reply of the first check that failed (module docstring)."""
    received_at = arrival(request)
    call = call_of(request)
    if call is not None:
        call.task = task[:128]
    caller = await request_caller(request)
    try:
        body = kind.model_validate_json(await request.body())
    except ValidationError as exc:
        field, message = describe_validation(exc.errors(include_input=False))
        return error_response(InvalidInput(message, field=field))
    model: str | None = None
    try:
        check_ready(pipeline, request)
        route = await tasks.resolve(task)
        model = route.model
        caller.may_call(task=route.task, model=route.model)
        budget_ms = declared_budget(request, body.budget_ms, route.budget_ms)
    except ExamlopsError as exc:
        return error_response(exc, model=model, job_id=body.job_id if isinstance(body, TaskInferBody) else None)
    deadline = effective_deadline(body.deadline, budget_ms, received_at)
    return TaskCall(body, caller, call, route, budget_ms, deadline)
