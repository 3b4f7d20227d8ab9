"""``JobRunner``: runs offline jobs in the serving process, one batch at a time, in the gaps.

Contract:

- Once the pipeline is ready, it claims one live job at a time (``JobStore.claim``, a lease of ``lease_s``)
  and feeds it ``batch_size`` instances at a time, all of a batch at once, through
  ``pipeline.infer(..., background=True)``: they queue behind every interactive call, so interactive calls
  wait at most the one batch a worker already holds.
- While it holds a job, a heartbeat renews the lease every ``lease_s / 3`` (``JobStore.renew``, only while
  the job is still this runner's), so a batch that queues behind interactive traffic for longer than the
  lease does not let another serving process take the job over. When a renewal finds the job is no longer
  this runner's, the batch in flight is dropped (its inferences cancelled) and nothing more is written.
- Each batch's lines are written at the offset of the runner's own recorded progress, cutting the file
  there (``ResultsFile.write_at``, flushed to disk), and only then is the batch recorded as done in the
  store. Check, write and record happen under the file's lock, and the write happens only when a renewal
  just confirmed the job is still this runner's; the record is conditional on it too. So a runner that lost
  the job never extends or overwrites the results of the one that took it over, and a restart (or a crash
  anywhere) answers no instance twice and loses at most the batch in flight.
- After each batch it rests ``rest`` times that batch's time: a batch that queued behind busy interactive
  traffic took long, so the job backs off as much, and an idle pool costs it little.
- Between batches it reads the job again: a job cancelled meanwhile stops there; a job past its
  ``expires_at`` becomes ``expired``. An instance whose budget ran out in the queue (``Refused``,
  ``DeadlineExceeded``) expires the job too; its batch is not recorded.
- An instance that fails on its own (a bad payload, a failed predict, an unknown alias) gets an error line
  and counts in ``errors``; the job goes on. A pipeline that is closing or a dependency that is down
  (``NotReady``, ``DependencyUnavailable``) pauses the job: its batch is not recorded and is tried again
  after ``poll_s``. A job whose instances file cannot be read, or any unexpected error, is ``failed``.
- Every job that ends is traced once, as one call (``on_end``).

``close()`` stops between two awaits, drops the unrecorded batch and releases the leases, so that the next
serving process resumes at once. Call it before the pipeline closes. How one instance is answered, and
what pauses or expires a batch, is ``jobs.answers``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Generator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from examlops.core.errors import ExamlopsError, InvalidInput
from examlops.jobs.answers import Expired, Pause, answer, batch_lines, budget_ran_out
from examlops.jobs.files import ResultsFile, read_batches
from examlops.jobs.model import Instance, Job, JobState
from examlops.jobs.ports import BackgroundInference, JobStore

log = logging.getLogger(__name__)
_T = TypeVar("_T")
_P = ParamSpec("_P")

Batch = list[Instance | InvalidInput]
JobEnded = Callable[[Job], None]
"""Called once with every job the runner ended (to trace it); it must not raise."""


class JobRunner:
    def __init__(
        self,
        store: JobStore,
        pipeline: BackgroundInference,
        results_path: Callable[[str], Path],
        *,
        owner: str,
        poll_s: float = 1.0,
        lease_s: float = 60.0,
        rest: float = 0.0,
        on_end: JobEnded | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._pipeline = pipeline
        self._results_path = results_path
        self.owner = owner
        self._poll_s = poll_s
        self._lease_s = lease_s
        self._rest = rest
        self._on_end = on_end
        self._wall = wall
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="offline-jobs")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        try:
            await _in_thread(self._store.release, self.owner)
        except ExamlopsError as exc:
            log.warning("could not release the offline jobs of %s: %s", self.owner, exc)

    async def _loop(self) -> None:
        while True:
            try:
                ran = await self.run_once()
            except ExamlopsError as exc:  # the store is down: try again later
                log.warning("offline jobs paused: %s", exc)
                ran = False
            if not ran:
                await asyncio.sleep(self._poll_s)

    async def run_once(self) -> bool:
        """Claim one job and run it until it ends or pauses; False when there was nothing to run (or it
        paused, or the pipeline is not ready yet)."""
        if not self._pipeline.ready:
            return False
        job = await _in_thread(self._store.claim, self.owner, self._wall(), self._lease_s)
        if job is None:
            return False
        return await self.run(job)

    async def run(self, job: Job) -> bool:
        """Run a claimed job from its last recorded batch (contract above); False when it paused."""
        lost = asyncio.Event()
        heartbeat = asyncio.get_running_loop().create_task(self._keep_lease(job.id, lost), name=f"lease-{job.id}")
        try:
            return await self._run(job, lost)
        finally:
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)

    async def _keep_lease(self, job_id: str, lost: asyncio.Event) -> None:
        """Renew the lease every third of it; set ``lost`` and return once the job is no longer ours."""
        while True:
            await asyncio.sleep(self._lease_s / 3)
            try:
                held = await _in_thread(self._store.renew, job_id, self.owner, self._wall() + self._lease_s)
            except ExamlopsError as exc:  # the store is down: the write checks ownership again anyway
                log.warning("could not renew the lease on offline job %s: %s", job_id, exc)
                continue
            if not held:
                lost.set()
                return

    async def _run(self, job: Job, lost: asyncio.Event) -> bool:
        try:
            results = await _in_thread(ResultsFile, self._results_path(job.id), job.results_bytes)
        except OSError as exc:
            await self._end(job, JobState.FAILED, f"the results file cannot be written: {exc.strerror}")
            return True
        try:
            await self._batches(job, results, lost)
        except Pause as exc:
            log.info("offline job %s paused before batch %s: %s", job.id, job.done_batches, exc)
            return False
        except Expired as exc:
            await self._end(job, JobState.EXPIRED, str(exc))
        except OSError as exc:
            await self._end(job, JobState.FAILED, f"the instances file cannot be read: {exc.strerror}")
        except ExamlopsError:
            raise
        except Exception as exc:
            log.exception("offline job %s failed", job.id)
            await self._end(job, JobState.FAILED, f"unexpected error: {type(exc).__name__}")
        finally:
            await _in_thread(results.close)
        return True

    async def _batches(self, job: Job, results: ResultsFile, lost: asyncio.Event) -> None:
        batches = read_batches(Path(job.instances_path), job.batch_size, job.done_batches)
        try:
            await self._run_batches(job, results, batches, lost)
        finally:
            await _in_thread(batches.close)

    async def _run_batches(
        self, job: Job, results: ResultsFile, batches: Generator[Batch, None, None], lost: asyncio.Event
    ) -> None:
        while not lost.is_set():
            current = await _in_thread(self._store.get, job.id)
            if current is None or current.state.final:
                return  # cancelled (or ended elsewhere) between batches
            if self._wall() >= job.expires_at:
                raise budget_ran_out(job)
            batch = await _in_thread(_next, batches)
            if batch is None:
                await self._end(job, JobState.DONE, "")
                return
            first = job.done_batches * job.batch_size
            began = time.perf_counter()
            answers = await _unless(
                lost,
                asyncio.gather(
                    *(answer(self._pipeline, job, first + i, item) for i, item in enumerate(batch)),
                    return_exceptions=True,
                ),
            )
            if answers is None:
                break
            lines = batch_lines(answers)
            failed = sum(1 for line in lines if "error" in line)
            job = replace(
                job, done_batches=job.done_batches + 1, answered=job.answered + len(lines), errors=job.errors + failed
            )
            offset = await _in_thread(self._write_batch, job, results, lines)
            if offset is None:
                return  # cancelled meanwhile, or another runner took it over: its recorded offset wins
            job = replace(job, results_bytes=offset)
            if self._rest > 0:
                await asyncio.sleep((time.perf_counter() - began) * self._rest)
        log.warning("offline job %s is no longer %s's: its batch in flight is dropped", job.id, self.owner)

    def _write_batch(self, job: Job, results: ResultsFile, lines: list[dict[str, Any]]) -> int | None:
        """Under the file's lock: confirm the job is still ours, write the batch at our recorded offset
        (``job.results_bytes``, the batch before this one) and record it; the new offset, or None when the job
        is no longer ours (nothing written) or the record was refused (what was written counts for nothing)."""
        with results.locked():
            if not self._store.renew(job.id, self.owner, self._wall() + self._lease_s):
                return None
            offset = results.write_at(job.results_bytes, lines)
            recorded = self._store.record_batch(
                job.id,
                self.owner,
                done_batches=job.done_batches,
                answered=job.answered,
                errors=job.errors,
                results_bytes=offset,
                lease_until=self._wall() + self._lease_s,
            )
            return offset if recorded else None

    async def _end(self, job: Job, state: JobState, error: str) -> None:
        ended = await _in_thread(self._store.finish, job.id, state, error=error, at=self._wall())
        if ended is not None and self._on_end is not None:
            self._on_end(ended)


async def _unless(lost: asyncio.Event, work: Awaitable[_T]) -> _T | None:
    """``work``'s result, or None (``work`` cancelled) once ``lost`` is set first."""
    doing = asyncio.ensure_future(_awaited(work))  # a task, which ends cancelled (a cancelled gather does not)
    losing = asyncio.ensure_future(lost.wait())
    try:
        await asyncio.wait((doing, losing), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (doing, losing):
            if not task.done():
                task.cancel()
        await asyncio.gather(doing, losing, return_exceptions=True)
    return None if doing.cancelled() else doing.result()


async def _in_thread(func: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """``func(*args, **kwargs)`` in a worker thread. Cancelled (once or more), it still waits for the thread
    to end before the cancellation goes on, so the files the thread reads or writes are closed only after it
    is done with them (a generator closed while a thread runs it raises, and the job would fail on a plain
    shutdown). A thread that never ends (a hung disk) therefore holds the runner's ``close`` too."""
    running = asyncio.ensure_future(asyncio.to_thread(func, *args, **kwargs))
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        while not running.done():
            try:
                await asyncio.wait((running,))
            except asyncio.CancelledError:
                continue  # cancelled again: the thread still holds the job's files
        if not running.cancelled():
            running.exception()  # retrieved: the cancellation is what goes on
        raise


async def _awaited(work: Awaitable[_T]) -> _T:
    return await work


def _next(batches: Iterator[Batch]) -> Batch | None:
    return next(batches, None)
