"""``GET /v1/traces`` and ``GET /v1/traces/{trace_id}``: the trace of every call, for operators.

Both need the ``read_traces`` permission (``operator`` and ``admin`` hold it): a trace names who called
what, and may hold inputs and outputs under the payload policy.

Read through a ``TraceStore`` (built by ``bootstrap``), in a worker thread. Filters as `exa trace list`;
paged with ``limit`` (1-1000) and ``offset``, newest first, with the total count of matches. An unknown id
is 404 ``not_found``; a ``since`` that cannot be read is 422.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel

from examlops.api.auth import CurrentCaller
from examlops.core.errors import NotFound
from examlops.identity import Caller, Permission
from examlops.tracing import TraceQuery, TraceStore, trace_fields
from examlops.tracing.store import MAX_PAGE, parse_since


class TracePage(BaseModel):
    total: int
    """Traces matching the filters."""
    limit: int
    offset: int
    traces: list[dict[str, Any]]
    """Newest first: every field of ``tracing.TraceRecord`` (``at`` in UNIX seconds)."""


def reader(caller: CurrentCaller) -> Caller:
    caller.require(Permission.READ_TRACES)
    return caller


def traces_router(store: TraceStore) -> APIRouter:
    router = APIRouter(prefix="/v1/traces", tags=["traces"], dependencies=[Depends(reader)])

    @router.get("", response_model=TracePage)
    async def list_traces(
        identity: str | None = None,
        task: str | None = None,
        model: str | None = None,
        outcome: Literal["answered", "refused", "failed"] | None = None,
        channel: Literal["http", "bus"] | None = None,
        since: Annotated[str | None, Query(description="15m, 2h, 7d, an ISO time or UNIX seconds")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
        offset: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,  # SQL counts in 64-bit integers: past that, a 500
    ) -> TracePage:
        """The newest traces matching every filter given, a page at a time."""
        when = None if since is None else parse_since(since, time.time())
        query = TraceQuery(identity, task, model, outcome, channel, when, limit, offset)
        records, total = await asyncio.gather(
            asyncio.to_thread(store.find, query), asyncio.to_thread(store.count, query)
        )
        return TracePage(total=total, limit=limit, offset=offset, traces=[trace_fields(r) for r in records])

    @router.get("/{trace_id}")
    async def get_trace(trace_id: str) -> dict[str, Any]:
        """One trace by the id its reply carried (``X-Examlops-Trace``, a bus reply's ``trace``)."""
        record = await asyncio.to_thread(store.get, trace_id.strip().lower()[:64])
        if record is None:
            raise NotFound(f"no trace {trace_id[:64]!r} (a call's trace reaches the store within about a second of it)")
        return trace_fields(record)

    return router
