"""What the HTTP routes do with offline jobs: submit, look, list, cancel, read results, for one caller.

Contract:

- ``submit``: the task is resolved through the task map now (``TaskNotFound``), and the caller must be
  allowed to call it and its model (``Forbidden``); the job keeps that model and alias to its end. The
  budget is at least ``MIN_BUDGET_MS`` and at most ``core.budget.MAX_BUDGET_MS``; exactly one of inline
  ``instances`` (at most ``inline_max``) and a ``file`` under the state folder is given, with at least one
  instance (``InvalidInput`` naming the field otherwise). The job is stored ``queued`` and returned at once.
- One identity sees, cancels and reads only its own jobs; an admin or operator sees every job. A job the
  caller may not see is ``JobNotFound``, as one that does not exist (its existence is not disclosed).
- ``cancel`` of a live job makes it ``cancelled`` (the runner stops before its next batch); of a job that
  ended already it changes nothing and returns it as it is. A job it cancelled goes to ``on_end`` (traced),
  as the runner's jobs do.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from examlops.core.budget import MAX_BUDGET_MS
from examlops.core.errors import InvalidInput
from examlops.core.errors import JobNotFound as JobNotFound  # the name callers imported from here first
from examlops.identity import Caller, Role
from examlops.jobs.files import JobFiles, count_lines, read_results
from examlops.jobs.model import MIN_BUDGET_MS, Job, JobState
from examlops.jobs.ports import JobStore
from examlops.tracing.record import new_trace_id

if TYPE_CHECKING:
    from examlops.tasks.routes import TaskRoute

INLINE_MAX = 1000
"""The most instances a request may carry inline; more go in a file."""
RESULTS_INLINE_MAX_BYTES = 256 * 1024
"""A finished job's results come inline in ``GET /v1/jobs/{id}`` up to this size, else by download."""


class TaskLookup(Protocol):
    async def resolve(self, task: str) -> TaskRoute: ...


def sees_all(caller: Caller) -> bool:
    return caller.identity.role in (Role.ADMIN, Role.OPERATOR)


class JobService:
    def __init__(
        self,
        store: JobStore,
        files: JobFiles,
        tasks: TaskLookup,
        *,
        batch_size: int,
        inline_max: int = INLINE_MAX,
        on_end: Callable[[Job], None] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.files = files
        self._tasks = tasks
        self._batch_size = batch_size
        self._inline_max = inline_max
        self._on_end = on_end
        self._wall = wall

    async def submit(
        self,
        caller: Caller,
        task: str,
        budget_ms: float,
        *,
        instances: Sequence[dict[str, Any]] | None = None,
        file: str | None = None,
    ) -> Job:
        if not MIN_BUDGET_MS <= budget_ms <= MAX_BUDGET_MS:
            raise InvalidInput(
                f"a job's budget is {MIN_BUDGET_MS:.0f} to {MAX_BUDGET_MS:.0f} ms (minutes to hours)", field="budget_ms"
            )
        if (instances is None) == (file is None):
            raise InvalidInput("give exactly one of instances (inline) and file", field="instances")
        if instances is not None and not 0 < len(instances) <= self._inline_max:
            raise InvalidInput(
                f"1 to {self._inline_max} instances inline; more go in a file under the state folder",
                field="instances",
            )
        route = await self._tasks.resolve(task)
        caller.may_call(task=route.task, model=route.model)
        job_id = uuid.uuid4().hex
        if instances is not None:
            path, total = await asyncio.to_thread(self.files.write_instances, job_id, instances)
        else:
            assert file is not None
            path = self.files.inside(file)
            total = await asyncio.to_thread(count_lines, path)
            if total == 0:
                raise InvalidInput("the file holds no instance", field="file")
        now = self._wall()
        job = Job(
            id=job_id,
            identity=caller.name,
            task=route.task,
            model=route.model,
            alias=route.alias,
            budget_ms=budget_ms,
            created_at=now,
            expires_at=now + budget_ms / 1000.0,
            state=JobState.QUEUED,
            total=total,
            batch_size=self._batch_size,
            instances_path=str(path),
            trace_id=new_trace_id(),
        )
        await asyncio.to_thread(self.store.add, job)
        return job

    async def get(self, caller: Caller, job_id: str) -> Job:
        job = await asyncio.to_thread(self.store.get, job_id[:64])
        if job is None or not (sees_all(caller) or job.identity == caller.name):
            raise JobNotFound(f"no job {job_id[:64]!r}", field="job_id")
        return job

    async def jobs(self, caller: Caller, *, limit: int = 100) -> list[Job]:
        identity = None if sees_all(caller) else caller.name
        return await asyncio.to_thread(self.store.list, identity, limit=limit)

    async def cancel(self, caller: Caller, job_id: str) -> Job:
        job = await self.get(caller, job_id)
        if job.state.final:
            return job
        cancelled = await asyncio.to_thread(self.store.cancel, job.id, self._wall())
        if cancelled is None:  # it ended meanwhile: as it is now
            return await self.get(caller, job_id)
        if self._on_end is not None:
            self._on_end(cancelled)
        return cancelled

    def results_path(self, job: Job) -> Path:
        return self.files.results_path(job.id)

    async def inline_results(self, job: Job) -> list[dict[str, Any]] | None:
        """The results of a finished job when they are small enough to come inline, else None."""
        if job.state is not JobState.DONE or job.results_bytes > RESULTS_INLINE_MAX_BYTES:
            return None

        def read() -> list[dict[str, Any]]:
            data = b"".join(read_results(self.results_path(job), job.results_bytes))
            return [orjson.loads(line) for line in data.splitlines() if line]

        return await asyncio.to_thread(read)
