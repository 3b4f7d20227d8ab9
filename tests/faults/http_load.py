"""Prediction load over HTTP recorded in a ``History``, and its figures, for the scenarios that fault serving's
own dependencies (a model, MLflow) or overload it, where there is no bus job to check.

- ``call``: one ``POST /infer-pipeline/infer``; ``ok`` with ``{"status", **body}`` as its value (any HTTP
  answer, a refusal too), ``unknown`` on a transport error or a timeout (it may have been served).
- ``steady``: one call at a time, every ``every_s``, until an event is set: the load that must go on
  being answered through a fault.
- ``figures``: the checker's ``Figures`` of such a history. A call is *failed* when ``expected(op)`` says
  its answer is not what was promised (by default: anything but a 200); ``lost`` lists calls never closed;
  recovery runs from each ``heal:`` mark to the next good answer. There is no Redis to read: what only the
  bus's history shows (duplicated, unrecorded, recorded twice, the audit chain, records) is None, not
  measured, and the reliability table says n/a, not 0.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx

from tests.faults.checker import Figures
from tests.faults.history import History, Operation, Outcome

BODY = {"embedding": [0.01] * 384, "node_count": 12}


async def call(history: History, client: httpx.AsyncClient, model: str, key: str, timeout_s: float = 60.0) -> Operation:
    op = history.invoke(model, key)
    try:
        reply = await client.post("/infer-pipeline/infer", json={"model": model, **BODY}, timeout=timeout_s)
        body: dict[str, Any] = reply.json()
    except (httpx.HTTPError, ValueError) as exc:
        return history.unknown(op, f"{type(exc).__name__}: {exc}")
    return history.ok(op, {**body, "status": reply.status_code, "error": body.get("error")})


async def steady(
    history: History, client: httpx.AsyncClient, model: str, stop: asyncio.Event, every_s: float = 0.05
) -> None:
    i = 0
    while not stop.is_set():
        await call(history, client, model, f"{model.lower()}-{i}")
        i += 1
        await asyncio.sleep(every_s)


def answered(op: Operation) -> bool:
    return op.outcome is Outcome.OK and (op.value or {}).get("status") == 200


def figures(history: History, expected: Callable[[Operation], bool] = answered) -> Figures:
    closed = [op for op in history.operations if op.outcome is not None]
    bad = [op for op in closed if not expected(op)]
    recover: dict[str, float] = {}
    for name, t in history.marks:
        if name.startswith("heal:"):
            after = [op.completed for op in closed if answered(op) and op.completed and op.completed > t]
            if after:
                recover[name.removeprefix("heal:")] = min(after) - t
    latencies = [op.completed - op.invoked for op in closed if answered(op) and op.completed is not None]
    return Figures(
        invoked=len(history.operations),
        ok=history.count(Outcome.OK),
        failed=history.count(Outcome.FAILED),
        unknown=history.count(Outcome.UNKNOWN),
        answered_with_error=sum(1 for op in bad if op.outcome is Outcome.OK),
        lost=[op.key for op in history.operations if op.outcome is None],
        answered_twice=None,
        unknown_applied_twice=None,
        unrecorded=None,
        recorded_twice=None,
        recorded_unanswered=None,
        audit_ok=None,
        audit_events=None,
        audit_problem="",
        records_dropped=None,
        records_left=None,
        max_latency_s=max(latencies, default=0.0),
        recover_s=recover,
    )
