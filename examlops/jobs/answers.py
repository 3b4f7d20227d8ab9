"""How one instance of an offline job is answered, and how a batch's answers become its result lines.

- ``answer(pipeline, job, index, item)``: one result line (``model.result_line``) for instance ``index``.
  An instance the file could not parse (an ``InvalidInput``) and one that fails on its own (a bad payload,
  a failed predict, an unknown alias: any other ``ExamlopsError``) get an error line. It raises ``Expired``
  when the instance's budget ran out in the queue (``Refused``, ``DeadlineExceeded``), and ``Pause`` when
  the pipeline is closing or a dependency is down (``NotReady``, ``DependencyUnavailable``).
- ``batch_lines(answers)``: the batch's lines once every instance of it is over, in order; a ``Pause``
  wins over an ``Expired`` (the batch can still be answered later), any other exception is re-raised.

The runner (``jobs.runner``) decides what a pause or an expiry does to the job.
"""

from __future__ import annotations

from typing import Any

from examlops.core.errors import DeadlineExceeded, DependencyUnavailable, ExamlopsError, InvalidInput, NotReady, Refused
from examlops.core.messages import InferenceRequest
from examlops.jobs.model import Instance, Job, result_line
from examlops.jobs.ports import BackgroundInference


class Pause(Exception):
    """The batch cannot run now (the pipeline is closing, a dependency is down): try it again later."""


class Expired(Exception):
    """The job's budget ran out: it ends ``expired``."""


def budget_ran_out(job: Job) -> Expired:
    return Expired(f"the budget ran out after {job.answered} of {job.total} instances")


async def answer(pipeline: BackgroundInference, job: Job, index: int, item: Instance | InvalidInput) -> dict[str, Any]:
    """Instance ``index``'s result line, through ``pipeline`` in the background (module docstring)."""
    if isinstance(item, InvalidInput):
        return result_line(index, error={"code": item.code, "message": item.message})
    request = InferenceRequest(
        model=job.model,
        embedding=item.embedding,
        node_count=item.node_count,
        alias=job.alias,
        job_id=job.id,
        user_id=item.user_id,
        deadline=job.expires_at,
        metadata={"task": job.task, "offline_job": job.id},
        budget_ms=job.budget_ms,
        task=job.task,
        identity=job.identity,
    )
    try:
        result = await pipeline.infer(request, background=True)
    except (Refused, DeadlineExceeded) as exc:
        raise budget_ran_out(job) from exc
    except (NotReady, DependencyUnavailable) as exc:
        raise Pause(str(exc)) from exc
    except ExamlopsError as exc:
        return result_line(index, error={"code": exc.code, "message": exc.message})
    reply = {"prediction": result.prediction, "model": result.model, "alias": result.alias}
    return result_line(index, answer={**reply, "version": result.version})


def batch_lines(answers: list[dict[str, Any] | BaseException]) -> list[dict[str, Any]]:
    """The batch's lines once every instance of it is over (module docstring)."""
    problems = [answer for answer in answers if isinstance(answer, BaseException)]
    for kind in (Pause, Expired):
        for problem in problems:
            if isinstance(problem, kind):
                raise problem
    if problems:
        raise problems[0]
    return [answer for answer in answers if not isinstance(answer, BaseException)]
