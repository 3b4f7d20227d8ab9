"""Streamed output: `POST /v1/tasks/{task}/stream` and `POST /v1/models/{model}/stream`.

A stream takes many instances (``TaskStreamBody``/``ModelStreamBody``, at most ``MAX_STREAM_INSTANCES``
and the body limit) and answers them as ``application/x-ndjson``: one ``StreamChunk`` line per finished
batch of ``settings.batch.max_size`` consecutive instances, in order, then one ``StreamEnd`` line
(``stream_run`` has the contract). The alias is drawn once for the whole stream (``Pipeline.route``, as
V2 does), so one alias answers every instance; a version in the model route's body pins it instead.

The budget (``budget_ms``, the ``X-Examlops-Budget-Ms`` header, the task's default; the earlier of it and
``deadline`` wins) governs the whole stream: every instance carries the stream's deadline. Everything
that fails before the first line is sent is answered as a single call's error with the same status and
body: authentication, validation (``field`` names ``instances.<i>.<field>``), an unknown task or model,
not ready, and the stream refused at its start (503 ``refused: budget`` with the estimate, ``Retry-After``,
``budget_ms`` and ``budget_remaining_ms``). Admission decides once, for the whole stream, on an estimate
for its first chunk (``Pipeline.admit``); a later chunk is never refused early: the stream ends at its
deadline with an ``expired`` last line instead. A stream is one call for its trace (``api.tracing``),
refused or answered as a single call is; one that stops early notes its code on the trace.
"""

from __future__ import annotations

from typing import Any, Protocol

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from examlops.api.auth import SECURED, request_caller
from examlops.api.calls import arrival, check_ready, declared_budget
from examlops.api.errors import describe_validation, documented, error_response
from examlops.api.schemas import ModelStreamBody, StreamChunk, TaskStreamBody
from examlops.api.stream_run import NDJSON, NdjsonStream, StreamRun
from examlops.api.task_calls import Tasks, open_task_call
from examlops.api.tracing import call_of
from examlops.core.budget import effective_deadline
from examlops.core.errors import ExamlopsError, InvalidInput
from examlops.core.messages import InferenceRequest, InferenceResult
from examlops.core.settings import Settings
from examlops.identity import Caller
from examlops.registry.catalog import Catalog
from examlops.tracing import CallTrace

STREAM_REPLY: dict[str, Any] = {
    "description": "NDJSON: one line per finished batch (`StreamChunk`), in order, then one `StreamEnd` line",
    "content": {NDJSON: {"schema": StreamChunk.model_json_schema(ref_template="#/components/schemas/{model}")}},
}


class Streaming(Protocol):
    """What the stream routes need of the pipeline (``examlops.serving.pipeline.Pipeline``)."""

    catalog: Catalog

    @property
    def ready(self) -> bool: ...

    async def route(self, model: str, alias: str | None = None) -> str: ...

    def admit(self, request: InferenceRequest, rows: int = 1) -> float | None: ...

    async def infer(self, request: InferenceRequest) -> InferenceResult: ...


def _body_schema(kind: type[TaskStreamBody]) -> dict[str, object]:
    schema = kind.model_json_schema(ref_template="#/components/schemas/{model}")
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def stream_routes(pipeline: Streaming, tasks: Tasks | None, settings: Settings) -> APIRouter:
    """The stream routes (the task route only with ``tasks``); chunks of ``settings.batch.max_size``, with
    one chunk per predict worker submitted ahead of the one being answered (the batcher holds a batch per
    worker: more ahead would only wait in its queue and weigh on admission)."""
    router = APIRouter(tags=["inference"])
    size, window = settings.batch.max_size, settings.predict.workers

    async def start(
        body: TaskStreamBody,
        caller: Caller,
        call: CallTrace | None,
        *,
        model: str,
        alias: str | None,
        version: str | None,
        task: str | None,
        budget_ms: float | None,
        deadline: float | None,
    ) -> Response:
        if version is None:
            alias = await pipeline.route(model, alias)
        if call is not None:
            call.model, call.alias, call.budget_ms, call.deadline = model, alias, budget_ms, deadline
        requests = [
            InferenceRequest(
                model=model,
                embedding=tuple(instance.embedding),
                node_count=instance.node_count,
                alias=alias,
                version=version,
                routed=version is None,
                job_id=instance.job_id,
                user_id=body.user_id,
                deadline=deadline,
                metadata={"task": task} if task is not None else {},
                facts=None if call is None else call.facts,  # every instance notes its batch: the last wins
                budget_ms=budget_ms,
                task=task,
                identity=caller.name,
            )
            for instance in body.instances
        ]
        run = StreamRun(
            pipeline.infer,
            requests,
            admit=pipeline.admit,
            size=size,
            window=window,
            deadline=deadline,
            budget_ms=budget_ms,
        )
        head = await run.first()
        if call is not None:
            call.model, call.alias, call.version = head[0].model, head[0].alias, head[0].version

        def on_end(run: StreamRun) -> None:
            if call is not None:
                call.ended = run.ended

        return NdjsonStream(run, on_end)

    if tasks is not None:
        resolver = tasks

        @router.post(
            "/v1/tasks/{task}/stream",
            responses={
                200: STREAM_REPLY,
                **documented(
                    s404="the task is not mapped (code unknown_task)", s403="no `call` on the task or its model"
                ),
            },
            openapi_extra=_body_schema(TaskStreamBody) | SECURED,
        )
        async def stream_task(task: str, request: Request) -> Response:
            """Many predictions for a task, streamed as NDJSON as each batch finishes (budget: the whole)."""
            opened = await open_task_call(request, task, TaskStreamBody, pipeline, resolver)
            if isinstance(opened, Response):
                return opened
            route = opened.route
            if opened.call is not None:
                opened.call.task = route.task
            try:
                return await start(
                    opened.body, opened.caller, opened.call, model=route.model, alias=route.alias, version=None,
                    task=route.task, budget_ms=opened.budget_ms, deadline=opened.deadline,
                )  # fmt: skip
            except ExamlopsError as exc:
                return error_response(exc, model=route.model)

    @router.post(
        "/v1/models/{model}/stream",
        responses={200: STREAM_REPLY, **documented()},
        openapi_extra=_body_schema(ModelStreamBody) | SECURED,
    )
    async def stream_model(model: str, request: Request) -> Response:
        """Many predictions from one model, streamed as NDJSON as each batch finishes (budget: the whole)."""
        received_at = arrival(request)
        call = call_of(request)
        if call is not None:
            call.model = model[:128]
        caller = await request_caller(request)
        caller.may_call(model=model)
        try:
            body = ModelStreamBody.model_validate_json(await request.body())
        except ValidationError as exc:
            field, message = describe_validation(exc.errors(include_input=False))
            return error_response(InvalidInput(message, field=field), model=model)
        try:
            check_ready(pipeline, request)
            spec = pipeline.catalog.get(model)
            if body.alias is not None and body.version is not None:
                raise InvalidInput("give either alias or version, not both", field="version")
            budget_ms = declared_budget(request, body.budget_ms)
            return await start(
                body, caller, call, model=spec.name, alias=body.alias,
                version=None if body.version is None else str(body.version), task=None,
                budget_ms=budget_ms, deadline=effective_deadline(body.deadline, budget_ms, received_at),
            )  # fmt: skip
        except ExamlopsError as exc:
            return error_response(exc, model=model)

    return router
