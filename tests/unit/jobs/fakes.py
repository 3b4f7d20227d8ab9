"""Fakes at the offline jobs' ports: a job store in memory with the SQL store's conditional writes, and a
pipeline that records what it was asked and can be steered."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from examlops.core.messages import InferenceRequest, InferenceResult
from examlops.jobs.model import LIVE_STATES, Job, JobState


@dataclass
class _Row:
    job: Job
    owner: str | None = None
    lease_until: float | None = None


class InMemoryJobStore:
    def __init__(self) -> None:
        self.rows: dict[str, _Row] = {}

    def add(self, job: Job) -> None:
        self.rows[job.id] = _Row(job)

    def get(self, job_id: str) -> Job | None:
        row = self.rows.get(job_id)
        return None if row is None else row.job

    def list(self, identity: str | None = None, *, limit: int = 100) -> list[Job]:
        jobs = sorted((r.job for r in self.rows.values()), key=lambda j: j.created_at, reverse=True)
        return [j for j in jobs if identity is None or j.identity == identity][:limit]

    def claim(self, owner: str, now: float, lease_s: float) -> Job | None:
        for row in sorted(self.rows.values(), key=lambda r: r.job.created_at):
            free = row.owner in (None, owner) or (row.lease_until or 0) < now
            if row.job.state in LIVE_STATES and free:
                row.owner, row.lease_until = owner, now + lease_s
                row.job = replace(row.job, state=JobState.RUNNING)
                return row.job
        return None

    def record_batch(
        self,
        job_id: str,
        owner: str,
        *,
        done_batches: int,
        answered: int,
        errors: int,
        results_bytes: int,
        lease_until: float,
    ) -> bool:
        row = self.rows[job_id]
        if row.owner != owner or row.job.state not in LIVE_STATES or row.job.done_batches != done_batches - 1:
            return False
        row.job = replace(
            row.job, done_batches=done_batches, answered=answered, errors=errors, results_bytes=results_bytes
        )
        row.lease_until = lease_until
        return True

    def renew(self, job_id: str, owner: str, lease_until: float) -> bool:
        row = self.rows[job_id]
        if row.owner != owner or row.job.state not in LIVE_STATES:
            return False
        row.lease_until = lease_until
        return True

    def finish(self, job_id: str, state: JobState, *, error: str = "", at: float) -> Job | None:
        row = self.rows[job_id]
        if row.job.state not in LIVE_STATES:
            return None
        row.job = replace(row.job, state=state, error=error, finished_at=at)
        row.owner = row.lease_until = None
        return row.job

    def cancel(self, job_id: str, at: float) -> Job | None:
        return self.finish(job_id, JobState.CANCELLED, error="cancelled by its caller", at=at)

    def release(self, owner: str) -> int:
        released = 0
        for row in self.rows.values():
            if row.owner == owner:
                row.owner = row.lease_until = None
                released += 1
        return released


@dataclass
class FakePipeline:
    """Answers every request with its embedding's first value; ``steer(request)`` may raise or wait first."""

    steer: Callable[[InferenceRequest], object] | None = None
    ready: bool = True
    requests: list[InferenceRequest] = field(default_factory=list)
    background: list[bool] = field(default_factory=list)

    async def infer(self, req: InferenceRequest, *, background: bool = False) -> InferenceResult:
        self.requests.append(req)
        self.background.append(background)
        if self.steer is not None:
            waited = self.steer(req)
            if asyncio.iscoroutine(waited):
                await waited
        await asyncio.sleep(0)
        return InferenceResult(req.model, req.alias or "Production", "1", None, req.embedding[0], req.job_id)

    @property
    def seen(self) -> list[float]:
        return [r.embedding[0] for r in self.requests]


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
