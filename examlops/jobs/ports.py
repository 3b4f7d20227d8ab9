"""The ports of offline jobs: where job rows are kept (SQL in production, ``sql.SqlJobStore``) and what the
runner needs of the pipeline.

A store's writes are conditional, so that two serving processes on one database, or a cancel racing the
runner, never move a job backwards: ``claim`` takes a live job only when no other owner holds a current
lease on it, ``renew`` only extends the caller's own lease on a live job, ``record_batch`` only advances
the job the caller owns by exactly one batch while it is live, ``finish`` and ``cancel`` only end a live
job. Every method raises ``StoreUnavailable`` when the store cannot be reached.
"""

from __future__ import annotations

from typing import Protocol

from examlops.core.messages import InferenceRequest, InferenceResult
from examlops.jobs.model import Job, JobState


class JobStore(Protocol):
    def add(self, job: Job) -> None:
        """Store a new job (its id is new)."""
        ...

    def get(self, job_id: str) -> Job | None: ...

    def list(self, identity: str | None = None, *, limit: int = 100) -> list[Job]:
        """The newest jobs first, of ``identity`` only when given."""
        ...

    def claim(self, owner: str, now: float, lease_s: float) -> Job | None:
        """The oldest live job that nobody else holds (no owner, ``owner`` itself, or a lease that ran out):
        now ``owner``'s until ``now + lease_s``, and ``running``. None when there is none."""
        ...

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
        """Record that batch ``done_batches - 1`` is in the results file up to ``results_bytes``, and renew the
        lease. False (nothing changed) when the job is no longer live, no longer ``owner``'s, or not at
        ``done_batches - 1``."""
        ...

    def renew(self, job_id: str, owner: str, lease_until: float) -> bool:
        """Extend ``owner``'s lease on a live job to ``lease_until``; False (nothing changed) when the job is no
        longer live or no longer ``owner``'s: the runner must stop working on it and write nothing more."""
        ...

    def finish(self, job_id: str, state: JobState, *, error: str = "", at: float) -> Job | None:
        """End a live job in ``state`` (a final one); the job as it is now, or None when it was not live."""
        ...

    def cancel(self, job_id: str, at: float) -> Job | None:
        """``cancelled`` for a live job (the runner stops before its next batch); the job as it is now."""
        ...

    def release(self, owner: str) -> int:
        """Drop ``owner``'s leases (a runner that stops cleanly), so that the next runner claims at once."""
        ...


class BackgroundInference(Protocol):
    """What the runner needs of the pipeline (``examlops.serving.pipeline.Pipeline``)."""

    @property
    def ready(self) -> bool:
        """True once every model's default alias is loaded: the runner claims no job before."""
        ...

    async def infer(self, req: InferenceRequest, *, background: bool = False) -> InferenceResult: ...
