"""Offline jobs in the serving process: the job service over SQL and the state folder, and its runner.

The runner owns its leases as this process (``hostname:pid``, the trace node), feeds the pipeline batches
of ``settings.jobs.batch_size`` instances paced by ``settings.jobs``, and traces every job that ends with
the process's tracer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy.engine import Engine

from examlops.core.settings import Settings

if TYPE_CHECKING:
    from examlops.jobs.ports import BackgroundInference
    from examlops.jobs.runner import JobRunner
    from examlops.jobs.service import JobService, TaskLookup
    from examlops.tracing import Tracer


def offline_jobs(
    settings: Settings, engine: Engine, tasks: TaskLookup, pipeline: BackgroundInference, tracer: Tracer
) -> tuple[JobService, JobRunner]:
    from examlops.jobs.files import JobFiles
    from examlops.jobs.runner import JobRunner
    from examlops.jobs.service import JobService
    from examlops.jobs.sql import SqlJobStore
    from examlops.jobs.trace import JobTraceHook

    store = SqlJobStore(engine)
    files = JobFiles(settings.state_dir / "jobs", settings.state_dir)
    traced = JobTraceHook(tracer)
    service = JobService(store, files, tasks, batch_size=settings.jobs.batch_size, on_end=traced)
    runner = JobRunner(
        store,
        pipeline,
        files.results_path,
        owner=tracer.node,
        on_end=traced,
        poll_s=settings.jobs.poll_s,
        lease_s=settings.jobs.lease_s,
        rest=settings.jobs.rest,
    )
    return service, runner
