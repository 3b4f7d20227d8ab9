"""What a job's latency budget means on the bus (seed 001): read from the wire, turned into the job's
deadline, passed on at the hop as what is left, and serving's refusal passed back.

Budgets only tighten on the way: a job's deadline is the earlier of its signed deadline and its submission
plus its budget (``deadline_of``); serving is given what is left at the hop, rounded down to 0.1 ms
(``left_ms``), never the budget the job declared. A budget field that cannot be read is ``MalformedJob``
(a dead letter), as any other unreadable field of a verified job. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from examlops.core.budget import remaining_ms
from examlops.core.errors import InvalidInput, Refused

MAX_JOB_BUDGET_MS = 3600.0 * 1000.0
"""A job's budget can be no longer than the longest job (``wire.MAX_JOB_TTL_S``)."""
REFUSED_MESSAGE = "refused: the budget cannot be met"


def check_budget(budget_ms: float) -> None:
    """``InvalidInput`` naming ``budget_ms`` unless it is a positive number of ms up to ``MAX_JOB_BUDGET_MS``."""
    if not (math.isfinite(budget_ms) and 0 < budget_ms <= MAX_JOB_BUDGET_MS):
        raise InvalidInput(f"the budget must be more than 0 and at most {MAX_JOB_BUDGET_MS:.0f} ms", field="budget_ms")


def read_budget(raw: Mapping[str, str]) -> tuple[float | None, float | None]:
    """``(submitted, budget_ms)`` of a verified job's fields, each None when not sent; ``ValueError`` when
    one cannot be read, is not finite, or a budget is not positive or comes without its submission time."""
    submitted = float(raw["submitted"]) if raw.get("submitted") else None
    budget_ms = float(raw["budget_ms"]) if raw.get("budget_ms") else None
    if submitted is not None and not math.isfinite(submitted):
        raise ValueError("the submission time must be a finite number")
    if budget_ms is not None and (submitted is None or not (math.isfinite(budget_ms) and budget_ms > 0)):
        raise ValueError("the budget must be a positive number of milliseconds, sent with its submission time")
    return submitted, budget_ms


def deadline_of(deadline: float, submitted: float, budget_ms: float) -> float:
    """The earlier of ``deadline`` and the end of a budget counted from ``submitted``."""
    return min(deadline, submitted + budget_ms / 1000.0)


def entry_time(entry_id: str) -> float | None:
    """The UNIX time Redis gave a stream entry id (``<ms>-<seq>``): when a job without ``submitted`` was
    put on its stream; None for an id that is not one."""
    millis, _, _ = entry_id.partition("-")
    return int(millis) / 1000.0 if millis.isdigit() else None


def left_ms(deadline: float, now: float) -> float:
    """What is left until ``deadline`` in ms, rounded down to 0.1 ms: never more than is left."""
    return math.floor((deadline - now) * 10_000.0) / 10.0


def reply_budget(budget_ms: float | None, deadline: float, now: float) -> dict[str, Any]:
    """What a reply says of its job's budget, as serving's answers do: the budget and what is left now."""
    return {"budget_ms": budget_ms, "budget_remaining_ms": remaining_ms(deadline, now)}


def refused_body(data: Mapping[str, Any], retry_after: str | None) -> dict[str, Any]:
    """Serving's refusal (its 503 body and ``Retry-After``) as a bus reply body: ``refused`` (``budget`` or
    ``late``), ``estimate_ms`` and ``retry_after_s``, never a model failure."""
    try:
        retry_after_s = float(retry_after) if retry_after else None
    except ValueError:
        retry_after_s = None
    message = data.get("error")
    return {
        **data,
        "error": message if isinstance(message, str) and message else REFUSED_MESSAGE,
        "prediction": 0.0,
        "code": Refused.code,
        "inference_failed": False,
        "refused": data.get("refused") or "budget",
        "estimate_ms": data.get("estimate_ms"),
        "retry_after_s": retry_after_s,
    }
