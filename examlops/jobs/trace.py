"""An offline job traced as one call: its record is written when the job ends, whichever process ends it.

The trace id is made at submit and kept on the job, so a job resumed by another serving process is still
one trace. The record carries the job's identity, task, model and alias, budget, the time from submit to
the end (``used_ms``) and the job id; the outcome is ``answered`` for a job that is done, ``refused`` for
one that expired (``expired``) or was cancelled (``cancelled``), ``failed`` for a failed one. The output
kept (by the payload policy) is the job's summary, never its results.
"""

from __future__ import annotations

from examlops.jobs.model import Job, JobState
from examlops.tracing import CallTrace, Tracer

_CODES = {
    JobState.DONE: None,
    JobState.EXPIRED: "expired",
    JobState.CANCELLED: "cancelled",
    JobState.FAILED: "internal_error",
}


class JobTraceHook:
    """``on_end`` of the runner: traces the job that ended (never raises, as ``Tracer.finish``)."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    def __call__(self, job: Job) -> None:
        tracer = self._tracer
        ended = job.finished_at if job.finished_at is not None else tracer.wall()
        call = CallTrace(
            trace_id=job.trace_id,
            channel="http",
            at=job.created_at,
            started=tracer.clock() - (ended - job.created_at),
            model=job.model,
            alias=job.alias,
            identity=job.identity,
            task=job.task,
            budget_ms=job.budget_ms,
            job_id=job.id,
        )
        summary = {
            "job_id": job.id,
            "state": job.state.value,
            "total": job.total,
            "answered": job.answered,
            "errors": job.errors,
            "error": job.error,
        }
        tracer.finish(call, error_code=_CODES.get(job.state, "internal_error"), status=200, output=summary)
