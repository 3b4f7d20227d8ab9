"""Offline jobs over HTTP: `POST /v1/jobs`, `GET /v1/jobs`, `GET|DELETE /v1/jobs/{id}`, `GET /v1/jobs/{id}/result`.

Thin: parse, call ``jobs.service.JobService``, format. Every route takes the bearer token (``CurrentCaller``).

- ``POST`` answers 202 with the job at once (``queued``); the work runs later, in the gaps. 422 for a bad
  body, budget or file; 404 ``unknown_task``; 403 when the caller may not call the task or its model.
- ``GET /v1/jobs/{id}``: state and progress; once ``done``, the results inline when small (``results``),
  and always ``result_url`` once any result is recorded.
- ``GET /v1/jobs/{id}/result`` streams the recorded results as JSONL (``application/x-ndjson``), one line
  per instance in order: the whole file once the job is done, what finished batches recorded before.
- ``DELETE`` cancels a live job (the runner stops before its next batch) and answers the job as it is.
- A caller sees only its own jobs (404 for another's), an admin or operator every job.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from examlops.api.auth import CurrentCaller
from examlops.api.errors import documented
from examlops.api.schemas import MAX_EMBEDDING_VALUES, MAX_NODE_COUNT, FiniteFloat, ShortText
from examlops.core.budget import MAX_BUDGET_MS
from examlops.jobs.files import read_results
from examlops.jobs.model import MIN_BUDGET_MS, Job
from examlops.jobs.service import INLINE_MAX, JobService

JOB_ERRORS = documented(
    s403="the identity may not call the task or the model it maps to",
    s404="the task is not mapped (unknown_task), or no such job of the caller's (job_not_found)",
)


class JobInstance(BaseModel):
    """One instance: what one call by task would carry."""

    model_config = ConfigDict(extra="forbid")

    embedding: Annotated[list[FiniteFloat], Field(max_length=MAX_EMBEDDING_VALUES)]
    node_count: Annotated[int, Field(strict=True, ge=1, le=MAX_NODE_COUNT)]
    user_id: ShortText | None = None


class JobBody(BaseModel):
    """A job: a task, a long budget, and the instances inline or in a file under the state folder."""

    model_config = ConfigDict(extra="forbid")

    task: ShortText
    budget_ms: Annotated[float, Field(allow_inf_nan=False, ge=MIN_BUDGET_MS, le=MAX_BUDGET_MS)]
    """Milliseconds from submit until the job expires (minutes to hours)."""
    instances: Annotated[list[JobInstance], Field(min_length=1, max_length=INLINE_MAX)] | None = None
    file: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    """A JSONL file of instances, relative to the state folder of serving (or absolute within it)."""


class JobProgress(BaseModel):
    answered: int
    """Instances with a result line (answers and instances that failed on their own)."""
    errors: int
    total: int
    batches_done: int
    batches: int


class JobReply(BaseModel):
    job_id: str
    state: str
    task: str
    model: str
    alias: str
    identity: str
    budget_ms: float
    created_at: float
    expires_at: float
    finished_at: float | None
    progress: JobProgress
    error: str
    """Why the job failed, expired or was cancelled."""
    trace_id: str
    result_url: str | None = None
    results: list[dict[str, Any]] | None = None


def job_reply(job: Job, results: list[dict[str, Any]] | None = None) -> JobReply:
    return JobReply(
        job_id=job.id,
        state=job.state.value,
        task=job.task,
        model=job.model,
        alias=job.alias,
        identity=job.identity,
        budget_ms=job.budget_ms,
        created_at=job.created_at,
        expires_at=job.expires_at,
        finished_at=job.finished_at,
        progress=JobProgress(
            answered=job.answered,
            errors=job.errors,
            total=job.total,
            batches_done=job.done_batches,
            batches=job.batches,
        ),
        error=job.error,
        trace_id=job.trace_id,
        result_url=f"/v1/jobs/{job.id}/result" if job.results_bytes > 0 else None,
        results=results,
    )


def jobs_router(service: JobService) -> APIRouter:
    router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

    @router.post("", status_code=202, response_model=JobReply, responses=JOB_ERRORS)
    async def submit(body: JobBody, caller: CurrentCaller) -> JSONResponse:
        """Submit an offline job: 202 with its id at once; it runs in the gaps around interactive calls."""
        instances = None if body.instances is None else [i.model_dump(exclude_none=True) for i in body.instances]
        job = await service.submit(caller, body.task, body.budget_ms, instances=instances, file=body.file)
        return JSONResponse(job_reply(job).model_dump(), status_code=202)

    @router.get("", response_model=list[JobReply])
    async def list_jobs(caller: CurrentCaller, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[JobReply]:
        """The caller's jobs, newest first (every job for an admin or operator)."""
        return [job_reply(job) for job in await service.jobs(caller, limit=limit)]

    @router.get("/{job_id}", response_model=JobReply, responses=JOB_ERRORS)
    async def get_job(job_id: str, caller: CurrentCaller) -> JobReply:
        """State and progress; a finished job's results inline when small, else at ``result_url``."""
        job = await service.get(caller, job_id)
        return job_reply(job, await service.inline_results(job))

    @router.get("/{job_id}/result", responses=JOB_ERRORS, response_class=StreamingResponse)
    async def get_result(job_id: str, caller: CurrentCaller) -> StreamingResponse:
        """The recorded results as JSONL, one line per instance in order."""
        job = await service.get(caller, job_id)
        chunks = read_results(service.results_path(job), job.results_bytes)
        headers = {"Content-Disposition": f'attachment; filename="{job.id}.jsonl"'}
        return StreamingResponse(chunks, media_type="application/x-ndjson", headers=headers)

    @router.delete("/{job_id}", response_model=JobReply, responses=JOB_ERRORS)
    async def cancel(job_id: str, caller: CurrentCaller) -> JobReply:
        """Cancel a live job: it stops before its next batch. A job that ended is answered as it is."""
        return job_reply(await service.cancel(caller, job_id))

    return router
