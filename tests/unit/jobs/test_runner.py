"""The job runner over an in-memory store and a fake pipeline: batches, resume, cancellation, expiry."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from examlops.core.errors import InferenceFailed, NotReady, Refused
from examlops.core.messages import InferenceRequest
from examlops.jobs.files import JobFiles, read_batches
from examlops.jobs.model import Job, JobState
from examlops.jobs.runner import JobRunner
from tests.unit.jobs.fakes import Clock, FakePipeline, InMemoryJobStore

TOTAL, BATCH = 10, 3


class ProcessKilled(BaseException):
    """The process dies here: nothing after this line of the runner runs."""


def make_job(files: JobFiles, clock: Clock, *, total: int = TOTAL, lines: list[str] | None = None) -> Job:
    path = files.instances_path("job1")
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = lines or [json.dumps({"embedding": [float(i), 0.5], "node_count": 3}) for i in range(total)]
    path.write_text("\n".join(rows) + "\n")
    return Job(
        id="job1",
        identity="alice",
        task="t.one",
        model="JPCP",
        alias="Production",
        budget_ms=3_600_000,
        created_at=clock.now,
        expires_at=clock.now + 3600,
        state=JobState.QUEUED,
        total=len(rows),
        batch_size=BATCH,
        instances_path=str(path),
        trace_id="0" * 32,
    )


@pytest.fixture
def files(tmp_path: Path) -> JobFiles:
    return JobFiles(tmp_path / "jobs", tmp_path)


def runner(store: InMemoryJobStore, pipeline: FakePipeline, files: JobFiles, clock: Clock, **kw: object) -> JobRunner:
    return JobRunner(store, pipeline, files.results_path, owner=str(kw.pop("owner", "node-a")), wall=clock, **kw)  # type: ignore[arg-type]


def remove(path: str) -> None:
    Path(path).unlink()


def result_indices(files: JobFiles) -> list[int]:
    return [json.loads(line)["index"] for line in files.results_path("job1").read_text().splitlines()]


async def test_a_job_runs_batch_by_batch_in_the_background_and_writes_one_line_per_instance(files: JobFiles) -> None:
    store, pipeline, clock, ended = InMemoryJobStore(), FakePipeline(), Clock(), []
    store.add(make_job(files, clock))
    assert await runner(store, pipeline, files, clock, on_end=ended.append).run_once()
    job = store.get("job1")
    assert job is not None and job.state is JobState.DONE
    assert (job.answered, job.errors, job.done_batches) == (TOTAL, 0, 4)
    assert all(pipeline.background) and len(pipeline.requests) == TOTAL
    lines = [json.loads(line) for line in files.results_path("job1").read_text().splitlines()]
    assert [line["index"] for line in lines] == list(range(TOTAL))
    assert [line["prediction"] for line in lines] == [float(i) for i in range(TOTAL)]
    assert {r.deadline for r in pipeline.requests} == {job.expires_at}
    assert [j.state for j in ended] == [JobState.DONE]


async def test_resume_after_a_crash_between_results_and_progress_answers_no_instance_twice(files: JobFiles) -> None:
    store, clock = InMemoryJobStore(), Clock()
    store.add(make_job(files, clock))
    record = store.record_batch
    calls = 0

    def record_then_die_on_the_third(*args: object, **kwargs: object) -> bool:
        nonlocal calls
        calls += 1
        if calls == 3:  # the third batch's lines are in the file, its progress never reaches the store
            raise ProcessKilled
        return record(*args, **kwargs)  # type: ignore[arg-type]

    store.record_batch = record_then_die_on_the_third  # type: ignore[method-assign]
    with pytest.raises(ProcessKilled):
        await runner(store, FakePipeline(), files, clock).run_once()
    assert len(result_indices(files)) == 9  # three batches written, two recorded
    store.record_batch = record  # type: ignore[method-assign]

    clock.now += 120  # the dead process's lease runs out
    second = FakePipeline()
    assert await runner(store, second, files, clock, owner="node-b").run_once()
    job = store.get("job1")
    assert job is not None and job.state is JobState.DONE and job.answered == TOTAL
    assert result_indices(files) == list(range(TOTAL))
    assert second.seen == [float(i) for i in range(6, TOTAL)]


async def test_a_runner_that_closes_mid_batch_drops_it_and_the_next_one_resumes_at_once(files: JobFiles) -> None:
    store, clock = InMemoryJobStore(), Clock()
    store.add(make_job(files, clock))
    hold, second_batch = asyncio.Event(), asyncio.Event()

    def block_the_second_batch(req: InferenceRequest) -> object:
        if req.embedding[0] < 3:
            return None
        second_batch.set()
        return hold.wait()

    first = runner(store, FakePipeline(steer=block_the_second_batch), files, clock, poll_s=0.01)
    first.start()
    await second_batch.wait()
    await first.close()
    job = store.get("job1")
    assert job is not None and job.done_batches == 1
    assert store.rows["job1"].owner is None

    second = FakePipeline()
    assert await runner(store, second, files, clock, owner="node-b").run_once()
    assert result_indices(files) == list(range(TOTAL))
    assert second.seen == [float(i) for i in range(3, TOTAL)]


def hold_the_second_read(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Make the runner's read of the second batch stop inside the generator, in its thread (as a slow disk
    would keep it): ``reading`` is set once it is there, and it goes on once ``release`` is set."""
    reading, release = threading.Event(), threading.Event()

    def slow_second_read(path: Path, batch_size: int, start: int) -> Iterator[list[object]]:
        for n, batch in enumerate(read_batches(path, batch_size, start)):
            if n == 1:
                reading.set()
                release.wait(10)
            yield batch

    monkeypatch.setattr("examlops.jobs.runner.read_batches", slow_second_read)
    return reading, release


async def test_a_runner_closed_while_a_thread_reads_its_next_batch_waits_for_the_read_and_leaves_the_job_resumable(
    files: JobFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, clock = InMemoryJobStore(), Clock()
    store.add(make_job(files, clock))
    reading, release = hold_the_second_read(monkeypatch)
    first = runner(store, FakePipeline(), files, clock, poll_s=0.01)
    first.start()
    assert await asyncio.to_thread(reading.wait, 10)
    closing = asyncio.ensure_future(first.close())
    await asyncio.sleep(0.05)
    assert not closing.done()  # it waits for the thread rather than closing the file under it
    release.set()
    await asyncio.wait_for(closing, 10)
    job = store.get("job1")
    assert job is not None and job.state is JobState.RUNNING and job.done_batches == 1, job
    assert store.rows["job1"].owner is None

    second = FakePipeline()
    assert await runner(store, second, files, clock, owner="node-b").run_once()
    assert result_indices(files) == list(range(TOTAL))
    assert second.seen == [float(i) for i in range(3, TOTAL)]


async def test_a_runner_cancelled_twice_while_a_thread_reads_still_waits_for_the_read_and_fails_nothing(
    files: JobFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, clock = InMemoryJobStore(), Clock()
    store.add(make_job(files, clock))
    reading, release = hold_the_second_read(monkeypatch)
    first = runner(store, FakePipeline(), files, clock, poll_s=0.01)
    first.start()
    task = first._task
    assert task is not None
    assert await asyncio.to_thread(reading.wait, 10)
    closing = asyncio.ensure_future(first.close())
    await asyncio.sleep(0.05)
    closing.cancel()  # the close is cancelled in turn: the runner's task is cancelled a second time
    await asyncio.sleep(0.05)
    assert not task.done()  # still waiting for the read
    release.set()
    await asyncio.wait_for(asyncio.gather(closing, task, return_exceptions=True), 10)
    assert task.cancelled() and closing.cancelled()
    job = store.get("job1")
    assert job is not None and job.state is JobState.RUNNING and job.done_batches == 1, job


async def test_a_cancelled_job_stops_between_batches(files: JobFiles) -> None:
    store, clock, ended = InMemoryJobStore(), Clock(), []
    store.add(make_job(files, clock))

    def cancel_during_the_second_batch(req: InferenceRequest) -> None:
        if req.embedding[0] == 3:
            store.cancel("job1", clock.now)

    pipeline = FakePipeline(steer=cancel_during_the_second_batch)
    assert await runner(store, pipeline, files, clock, on_end=ended.append).run_once()
    job = store.get("job1")
    assert job is not None and job.state is JobState.CANCELLED
    assert len(pipeline.requests) == 6  # the batch in flight finished; no batch started after the cancel
    assert job.answered == 3 and job.results_bytes > 0
    assert ended == []  # the cancel ended it, and its caller traces it: once


async def test_a_job_whose_budget_runs_out_between_batches_expires(files: JobFiles) -> None:
    store, clock, ended = InMemoryJobStore(), Clock(), []
    store.add(make_job(files, clock))

    def time_passes(req: InferenceRequest) -> None:
        if req.embedding[0] == 2:
            clock.now += 3601

    pipeline = FakePipeline(steer=time_passes)
    assert await runner(store, pipeline, files, clock, on_end=ended.append).run_once()
    job = store.get("job1")
    assert job is not None and job.state is JobState.EXPIRED and job.answered == 3
    assert len(pipeline.requests) == 3
    assert [j.state for j in ended] == [JobState.EXPIRED]


async def test_instances_dropped_late_by_the_pipeline_expire_the_job_without_recording_their_batch(
    files: JobFiles,
) -> None:
    store, clock = InMemoryJobStore(), Clock()
    store.add(make_job(files, clock))

    def late_from_the_second_batch(req: InferenceRequest) -> None:
        if req.embedding[0] >= 3:
            raise Refused("ran out queued", reason="late")

    assert await runner(store, FakePipeline(steer=late_from_the_second_batch), files, clock).run_once()
    job = store.get("job1")
    assert job is not None and job.state is JobState.EXPIRED and job.answered == 3
    assert result_indices(files) == [0, 1, 2]


async def test_an_instance_that_fails_alone_gets_an_error_line_and_the_job_goes_on(files: JobFiles) -> None:
    store, clock = InMemoryJobStore(), Clock()
    lines = [json.dumps({"embedding": [float(i)], "node_count": 1}) for i in range(4)]
    lines[1] = "not json"
    store.add(make_job(files, clock, lines=lines))

    def fail_the_third(req: InferenceRequest) -> None:
        if req.embedding[0] == 2:
            raise InferenceFailed("the model raised")

    assert await runner(store, FakePipeline(steer=fail_the_third), files, clock).run_once()
    job = store.get("job1")
    assert job is not None and job.state is JobState.DONE and (job.answered, job.errors) == (4, 2)
    results = [json.loads(line) for line in files.results_path("job1").read_text().splitlines()]
    assert [r.get("error", {}).get("code") for r in results] == [None, "invalid_input", "inference_failed", None]


async def test_a_pipeline_that_is_not_ready_pauses_the_job_without_recording_anything(files: JobFiles) -> None:
    store, clock = InMemoryJobStore(), Clock()
    store.add(make_job(files, clock))
    ready = False

    def not_ready_yet(req: InferenceRequest) -> None:
        if not ready:
            raise NotReady("starting")

    pipeline = FakePipeline(steer=not_ready_yet)
    assert not await runner(store, pipeline, files, clock).run_once()
    job = store.get("job1")
    assert job is not None and job.state is JobState.RUNNING and job.done_batches == 0
    ready = True
    assert await runner(store, pipeline, files, clock).run_once()
    assert result_indices(files) == list(range(TOTAL))


async def test_a_missing_instances_file_fails_the_job(files: JobFiles) -> None:
    store, clock, ended = InMemoryJobStore(), Clock(), []
    job = make_job(files, clock)
    remove(job.instances_path)
    store.add(job)
    assert await runner(store, FakePipeline(), files, clock, on_end=ended.append).run_once()
    failed = store.get("job1")
    assert failed is not None and failed.state is JobState.FAILED and "instances file" in failed.error
    assert [j.state for j in ended] == [JobState.FAILED]


async def test_no_job_is_claimed_before_the_pipeline_is_ready(files: JobFiles) -> None:
    store, clock = InMemoryJobStore(), Clock()
    store.add(make_job(files, clock))
    pipeline = FakePipeline(ready=False)
    assert not await runner(store, pipeline, files, clock).run_once()
    assert store.rows["job1"].owner is None and pipeline.requests == []


async def test_a_results_file_shorter_than_recorded_fails_the_job_rather_than_padding_it(files: JobFiles) -> None:
    store, clock = InMemoryJobStore(), Clock()
    store.add(make_job(files, clock))
    store.rows["job1"].job = replace(store.rows["job1"].job, done_batches=1, answered=3, results_bytes=100)
    assert await runner(store, FakePipeline(), files, clock).run_once()
    job = store.get("job1")
    assert job is not None and job.state is JobState.FAILED and "shorter" in job.error


async def test_a_runner_whose_batch_outlasts_its_lease_never_writes_over_the_runner_that_took_the_job(
    files: JobFiles,
) -> None:
    store, clock = InMemoryJobStore(), Clock()
    store.add(make_job(files, clock))
    first_held, second_held = asyncio.Event(), asyncio.Event()
    first_waiting, second_waiting = asyncio.Event(), asyncio.Event()

    def hold_the_first_batch(req: InferenceRequest) -> object:
        first_waiting.set()
        return first_held.wait()

    def hold_the_second_batch(req: InferenceRequest) -> object:
        if req.embedding[0] < 3:
            return None
        second_waiting.set()
        return second_held.wait()

    # lease_s is long in real time, so the first runner's heartbeat never renews: as a process stalled past it
    stale = runner(store, FakePipeline(steer=hold_the_first_batch), files, clock, lease_s=60.0)
    stale_run = asyncio.create_task(stale.run_once())
    await first_waiting.wait()

    clock.now += 61  # its lease ran out while its first batch was queued
    newcomer = runner(store, FakePipeline(steer=hold_the_second_batch), files, clock, owner="node-b", lease_s=60.0)
    newcomer_run = asyncio.create_task(newcomer.run_once())
    await second_waiting.wait()  # the newcomer recorded batch 0 and is in batch 1

    first_held.set()  # the stale runner's batch 0 finishes now: it must write nothing
    assert await stale_run
    second_held.set()
    assert await newcomer_run

    job = store.get("job1")
    assert job is not None and job.state is JobState.DONE and job.answered == TOTAL
    assert result_indices(files) == list(range(TOTAL))
    assert files.results_path("job1").stat().st_size == job.results_bytes


async def test_the_lease_is_renewed_while_a_batch_runs_and_a_lost_job_stops_without_writing(files: JobFiles) -> None:
    store, clock = InMemoryJobStore(), Clock()
    store.add(make_job(files, clock))
    held, waiting, cancelled = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def hold_until_cancelled() -> None:
        try:
            await held.wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    def hold(req: InferenceRequest) -> object:
        waiting.set()
        return hold_until_cancelled()

    renewed, renew = threading.Event(), store.renew

    def renew_and_tell(job_id: str, owner: str, lease_until: float) -> bool:
        held_now = renew(job_id, owner, lease_until)
        if held_now and lease_until > clock.now:
            renewed.set()
        return held_now

    store.renew = renew_and_tell  # type: ignore[method-assign]
    first = runner(store, FakePipeline(steer=hold), files, clock, lease_s=0.03)
    first_run = asyncio.create_task(first.run_once())
    await waiting.wait()
    clock.now += 10  # far past the lease it claimed with: only the heartbeat keeps the job
    assert await asyncio.to_thread(renewed.wait, 10)
    assert store.claim("node-b", clock.now, 60.0) is None

    store.rows["job1"].owner = "node-b"  # taken over anyway (as after a stall): the next renewal finds out
    assert await asyncio.wait_for(first_run, timeout=10)
    assert cancelled.is_set()  # its batch in flight was dropped, not waited for
    job = store.get("job1")
    assert job is not None and job.done_batches == 0 and job.state is JobState.RUNNING
    assert result_indices(files) == []
