"""What every inference route does around the pipeline call: the budget it declares and the answer it gets.

``check_ready``: a call is taken only once the hot set is loaded and until serving drains.
``arrival``: when serving read the request's first bytes, where its budget starts.
``declared_budget``: the body's ``budget_ms``, else the ``X-Examlops-Budget-Ms`` header, else the default
(a task's), else None; a header that is not a positive number of milliseconds is ``InvalidInput`` naming
it. ``answer`` builds the reply of a call with what was left of its budget (``core.budget``).
"""

from __future__ import annotations

import time
from typing import Protocol

from starlette.requests import Request

from examlops.api.protocol import RECEIVED_AT
from examlops.api.schemas import InferReply
from examlops.core.budget import BUDGET_HEADER, parse_budget_header, remaining_ms
from examlops.core.errors import InvalidInput, NotReady
from examlops.core.messages import InferenceResult


class Ready(Protocol):
    @property
    def ready(self) -> bool: ...


def check_ready(pipeline: Ready, request: Request) -> None:
    """``NotReady`` while the hot set loads and once serving drains for shutdown: no call is taken then."""
    if not pipeline.ready or request.app.state.draining:
        raise NotReady("the hot set is still loading" if not pipeline.ready else "serving is shutting down")


def arrival(request: Request) -> float:
    """The ``time.time()`` serving read the request's first bytes (``api.protocol``); now when the server
    running the app does not stamp it (a test client, Ray Serve's proxy)."""
    stamped = request.scope.get("state", {}).get(RECEIVED_AT)
    return stamped if isinstance(stamped, float) else time.time()


def declared_budget(request: Request, body_budget: float | None, default_ms: float | None = None) -> float | None:
    """The call's budget in milliseconds (see the module docstring)."""
    if body_budget is not None:
        return body_budget
    try:
        header = parse_budget_header(request.headers.get(BUDGET_HEADER))
    except ValueError as exc:
        raise InvalidInput(str(exc), field=BUDGET_HEADER) from None
    return header if header is not None else default_ms


def answer(
    result: InferenceResult, *, budget_ms: float | None, deadline: float | None, task: str | None = None
) -> InferReply:
    """The reply to an answered call: the result, the budget and what remained of it now."""
    return InferReply(
        task=task,
        model=result.model,
        alias=result.alias,
        version=result.version,
        run_id=result.run_id,
        prediction=result.prediction,
        job_id=result.job_id,
        budget_ms=budget_ms,
        budget_remaining_ms=remaining_ms(deadline, time.time()),
    )
