"""The job service: what a submit checks, who sees which job, cancelling; and a job traced as one call."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from examlops.core.errors import Forbidden, InvalidInput, JobNotFound, TaskNotFound
from examlops.identity import Caller, Identity, Role
from examlops.jobs.files import JobFiles
from examlops.jobs.model import JobState, parse_duration_ms
from examlops.jobs.service import JobService
from examlops.jobs.trace import JobTraceHook
from examlops.tasks.routes import TaskRoute
from examlops.tracing import Tracer
from examlops.tracing.record import TraceRecord
from tests.unit.jobs.fakes import Clock, InMemoryJobStore

INSTANCE = {"embedding": [0.1, 0.2], "node_count": 3}


class Tasks:
    async def resolve(self, task: str) -> TaskRoute:
        if task.lower() != "t.one":
            raise TaskNotFound(f"task {task!r} is not mapped", field="task")
        return TaskRoute("t.one", "JPCP", "Production", uuid.uuid4())


def line_count(path: str) -> int:
    return len(Path(path).read_text().splitlines())


def caller(name: str, role: Role = Role.CALLER, tasks: tuple[str, ...] = ()) -> Caller:
    return Caller(Identity(name=name, role=role, tasks=tasks))


@pytest.fixture
def service(tmp_path: Path) -> JobService:
    return JobService(InMemoryJobStore(), JobFiles(tmp_path / "jobs", tmp_path), Tasks(), batch_size=4, wall=Clock())


async def test_a_submitted_job_is_queued_with_the_route_the_task_map_gave_it(service: JobService) -> None:
    job = await service.submit(caller("alice"), "T.One", 60_000, instances=[INSTANCE] * 5)
    assert job.state is JobState.QUEUED and (job.task, job.model, job.alias) == ("t.one", "JPCP", "Production")
    assert (job.total, job.batch_size, job.batches) == (5, 4, 2)
    assert job.expires_at == job.created_at + 60
    assert line_count(job.instances_path) == 5


async def test_a_submit_is_refused_before_anything_is_stored(service: JobService, tmp_path: Path) -> None:
    alice = caller("alice", tasks=("other.task",))
    with pytest.raises(Forbidden):
        await service.submit(alice, "t.one", 60_000, instances=[INSTANCE])
    with pytest.raises(TaskNotFound):
        await service.submit(caller("bob"), "nope", 60_000, instances=[INSTANCE])
    with pytest.raises(InvalidInput, match="budget"):
        await service.submit(caller("bob"), "t.one", 10, instances=[INSTANCE])
    with pytest.raises(InvalidInput):
        await service.submit(caller("bob"), "t.one", 60_000)
    outside = tmp_path.parent / "outside.jsonl"
    outside.write_text(json.dumps(INSTANCE) + "\n")
    with pytest.raises(InvalidInput, match="state folder"):
        await service.submit(caller("bob"), "t.one", 60_000, file=str(outside))
    with pytest.raises(InvalidInput, match="state folder"):
        await service.submit(caller("bob"), "t.one", 60_000, file="../outside.jsonl")
    assert await service.jobs(caller("root", Role.ADMIN)) == []


async def test_a_file_under_the_state_folder_is_read_in_place(service: JobService, tmp_path: Path) -> None:
    (tmp_path / "big.jsonl").write_text("\n".join(json.dumps(INSTANCE) for _ in range(9)) + "\n\n")
    job = await service.submit(caller("alice"), "t.one", 60_000, file="big.jsonl")
    assert job.total == 9 and job.instances_path == str(tmp_path / "big.jsonl")


async def test_a_caller_sees_its_own_jobs_and_an_operator_sees_every_job(service: JobService) -> None:
    mine = await service.submit(caller("alice"), "t.one", 60_000, instances=[INSTANCE])
    theirs = await service.submit(caller("bob"), "t.one", 60_000, instances=[INSTANCE])
    assert [j.id for j in await service.jobs(caller("alice"))] == [mine.id]
    with pytest.raises(JobNotFound):
        await service.get(caller("alice"), theirs.id)
    with pytest.raises(JobNotFound):
        await service.cancel(caller("alice"), theirs.id)
    assert {j.id for j in await service.jobs(caller("ops", Role.OPERATOR))} == {mine.id, theirs.id}
    assert (await service.get(caller("ops", Role.OPERATOR), theirs.id)).identity == "bob"


async def test_cancel_ends_a_live_job_and_leaves_an_ended_one_as_it_is(service: JobService) -> None:
    job = await service.submit(caller("alice"), "t.one", 60_000, instances=[INSTANCE])
    assert (await service.cancel(caller("alice"), job.id)).state is JobState.CANCELLED
    again = await service.cancel(caller("alice"), job.id)
    assert again.state is JobState.CANCELLED and again.finished_at is not None


def test_durations_read_as_people_write_them() -> None:
    assert parse_duration_ms("2h") == 7_200_000
    assert parse_duration_ms("90m") == parse_duration_ms("1.5h") == 5_400_000
    assert parse_duration_ms("45") == parse_duration_ms("45s") == 45_000
    with pytest.raises(ValueError, match="duration"):
        parse_duration_ms("soon")


async def test_a_job_that_ends_is_traced_once_as_one_call(service: JobService) -> None:
    records: list[TraceRecord] = []

    class Queue:
        def put(self, record: TraceRecord) -> bool:
            records.append(record)
            return True

        def start(self) -> None: ...

        def close(self, timeout_s: float = 10.0) -> None: ...

    service = JobService(service.store, service.files, Tasks(), batch_size=4, on_end=JobTraceHook(Tracer(Queue())))
    job = await service.submit(caller("alice"), "t.one", 60_000, instances=[INSTANCE])
    await service.cancel(caller("alice"), job.id)
    await service.cancel(caller("alice"), job.id)
    (record,) = records
    assert (record.trace_id, record.job_id, record.identity, record.task) == (job.trace_id, job.id, "alice", "t.one")
    assert (record.outcome, record.error_code, record.budget_ms) == ("refused", "cancelled", 60_000)
