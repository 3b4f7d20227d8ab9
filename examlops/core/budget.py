"""Latency budgets (seed 001): how long a caller can wait, turned into the deadline serving works to.

A call may declare ``budget_ms`` (milliseconds from when the platform received it) and an absolute
``deadline`` (UNIX time); a call to a task without a budget gets the task's default. The earlier of the
two ends wins. Budgets only tighten on the way: a hop passes on what is left (``remaining_ms``), never
the budget it was given.
"""

from __future__ import annotations

BUDGET_HEADER = "X-Examlops-Budget-Ms"
"""The header a caller of the task and model routes may declare its budget in (the body field wins)."""
MAX_BUDGET_MS = 7 * 24 * 3600 * 1000.0
"""A week: the longest budget accepted (offline jobs run for hours, nothing for longer)."""


def effective_deadline(deadline: float | None, budget_ms: float | None, received_at: float) -> float | None:
    """The earlier of ``deadline`` and ``received_at`` + ``budget_ms``; None when neither is given."""
    if budget_ms is None:
        return deadline
    end = received_at + budget_ms / 1000.0
    return end if deadline is None else min(deadline, end)


def remaining_ms(deadline: float | None, now: float) -> float | None:
    """Milliseconds left until ``deadline`` (negative once passed, rounded to 0.1 ms); None without one."""
    return None if deadline is None else round((deadline - now) * 1000.0, 1)


def parse_budget_header(value: str | None) -> float | None:
    """The budget a header declares; ``ValueError`` naming the header when it is not a positive number
    of milliseconds up to ``MAX_BUDGET_MS``."""
    if value is None or not value.strip():
        return None
    try:
        budget = float(value)
    except ValueError:
        raise ValueError(f"{BUDGET_HEADER} must be a number of milliseconds") from None
    if not 0 < budget <= MAX_BUDGET_MS:
        raise ValueError(f"{BUDGET_HEADER} must be more than 0 and at most {MAX_BUDGET_MS:.0f}")
    return budget
