"""Budgets across the bus hop against a real redis-server and SQL (seed 001).

A stand-in for serving behind the bridge keeps what it was sent, so the tests see exactly the budget and
deadline that crossed the hop; the last test runs `exa serve start` with the demo models, an estimator
that always guesses 5 s, and a task map with default budgets, to see a task's default apply over HTTP and
over the bus, and a real early refusal reach the bus client as ``Refused``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import SecretStr

from examlops.bootstrap import sql_engine
from examlops.bootstrap.bridge import bus_client
from examlops.bus.client import RefusedJob
from examlops.core.errors import Refused
from examlops.monitoring.failures import Outcome, classify
from examlops.tasks.sql import SqlTaskMap
from tests.integration.servers import known_token
from tests.integration.test_bus_bridge import (  # noqa: F401  # redis_url is a fixture
    ADDRESS,
    CATALOG,
    PAYLOAD,
    bus_settings,
    recorded,
    redis_url,
    running_bridge,
)
from tests.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REFUSAL = {
    "error": "no placement can meet the budget",
    "prediction": 0.0,
    "code": "refused",
    "inference_failed": False,
    "refused": "budget",
    "estimate_ms": 812.5,
}


class BudgetStandIn:
    """Serving's two infer routes, keeping each body with the time it arrived; ``refuse`` answers every call
    with a 503 refusal (``Retry-After: 3``) instead."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, str, dict[str, Any]]] = []
        self.refuse = False
        self.port = free_port()
        app = FastAPI()

        async def answer(route: str, request: Request, model: str) -> JSONResponse:
            body = await request.json()
            self.calls.append((time.time(), route, body))
            if self.refuse:
                return JSONResponse(
                    {**REFUSAL, "job_id": body["job_id"]}, status_code=503, headers={"Retry-After": "3"}
                )
            reply = {"model": model, "alias": "Production", "version": "1", "run_id": "run-1", "prediction": 0.5}
            return JSONResponse(reply | {"error": None, "job_id": body["job_id"], "budget_ms": body.get("budget_ms")})

        @app.post("/infer-pipeline/infer")
        async def infer(request: Request) -> JSONResponse:
            return await answer("model", request, "JPCP")

        @app.post("/v1/tasks/{task}/infer")
        async def infer_task(task: str, request: Request) -> JSONResponse:
            return await answer(task, request, "JPCP")

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> BudgetStandIn:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "the stand-in did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def standin() -> Iterator[BudgetStandIn]:
    with BudgetStandIn() as server:
        yield server


async def test_budgets_only_tighten_across_the_bus_hop(
    tmp_path: Path,
    redis_url: str,  # noqa: F811  # the fixture imported above
    standin: BudgetStandIn,
) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    async with running_bridge(settings), bus_client(settings) as client:
        reply = await client.request(ADDRESS, PAYLOAD, 10, job_id="tight", budget_ms=3000)
        unbudgeted = await client.request(ADDRESS, PAYLOAD, 10, job_id="loose")
    [(_, _route, sent), (_, _, plain)] = standin.calls
    # Serving gets what was left of the budget when the bridge posted it (the job's deadline is its budget's
    # end, 3 s, not its 10 s timeout): less than the job's 3000 ms, never more; no absolute deadline, which
    # serving would read on its own wall clock.
    assert 0 < sent["budget_ms"] < 3000 and "deadline" not in sent
    assert reply["error"] is None and reply["budget_ms"] == 3000.0
    assert 0 < reply["budget_remaining_ms"] < sent["budget_ms"]
    # No budget: what is left of the 10 s timeout.
    assert "deadline" not in plain and plain["budget_ms"] > sent["budget_ms"] + 5000
    assert unbudgeted["budget_ms"] is None and unbudgeted["budget_remaining_ms"] > 5000


async def test_a_job_to_a_task_without_a_budget_gets_the_tasks_default_from_the_task_map(
    tmp_path: Path,
    redis_url: str,  # noqa: F811
    standin: BudgetStandIn,
) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    engine = sql_engine(settings)
    try:
        tasks = SqlTaskMap(engine)
        address = tasks.map("t.defaulted", "JPCP", "Production", budget_ms=2500.0).route.address
    finally:
        engine.dispose()
    async with running_bridge(settings, task_map=True), bus_client(settings) as client:
        defaulted = await client.request(address, PAYLOAD, 10, job_id="defaulted")
        own = await client.request(address, PAYLOAD, 10, job_id="own", budget_ms=6000)
    [(_, route, first), (_, _, second)] = standin.calls
    assert route == "t.defaulted"
    assert 0 < first["budget_ms"] < 2500 and defaulted["budget_ms"] == 2500.0 and defaulted["task"] == "t.defaulted"
    assert 2500 < second["budget_ms"] < 6000 and own["budget_ms"] == 6000.0  # the job's own budget wins


async def test_a_refused_bus_reply_carries_the_reason_and_estimate_the_client_raises_refused_and_nothing_is_recorded(
    tmp_path: Path,
    redis_url: str,  # noqa: F811
    standin: BudgetStandIn,
) -> None:
    standin.refuse = True
    settings = bus_settings(tmp_path, redis_url, standin.port)
    async with running_bridge(settings), bus_client(settings) as client:
        with pytest.raises(Refused) as refused:
            await client.request(ADDRESS, PAYLOAD, 10, job_id="refused", budget_ms=500)
    error = refused.value
    assert (error.code, error.reason, error.estimate_ms, error.retry_after_s) == ("refused", "budget", 812.5, 3.0)
    assert isinstance(error, RefusedJob)  # a Refused that keeps the whole reply
    reply = error.reply
    assert (reply["refused"], reply["estimate_ms"], reply["budget_ms"]) == ("budget", 812.5, 500.0)
    assert reply["job_id"] == "refused" and reply["inference_failed"] is False
    assert recorded(redis_url) == []  # no record: the recorder never counts it toward the retrain trigger
    assert classify(503, reply) is Outcome.IGNORED


# Against the real serving process with the demo models.


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from examlops.core.settings import Settings
    from examlops.registry.demo import seed_demo
    from tests.integration.servers import ServingProcess

    home = tmp_path_factory.mktemp("budget-serving")
    seed_demo(Settings(home=home), CATALOG)
    # Every estimate is at least 5 s, so a 3 s budget is refused at once and a 60 s one answered; the task
    # map is read again every 0.2 s, so a mapping made after the start applies at once.
    env = {"EXAMLOPS_ADMISSION__OVERHEAD_MS": "5000", "EXAMLOPS_TRAFFIC__RULES_TTL_S": "0.2"}
    proc = ServingProcess(home, env)
    try:
        proc.wait_ready(90)
        yield proc
    finally:
        proc.stop()


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning")
async def test_a_tasks_default_budget_applies_over_http_and_the_bus_and_a_tight_one_is_refused_early(
    redis_url: str,  # noqa: F811
    serving: Any,
) -> None:
    settings = bus_settings(serving.home, redis_url, serving.port).model_copy(
        update={"token": SecretStr(serving.token)}
    )
    known_token(settings, serving.token, "admin")
    engine = sql_engine(settings)
    try:
        tasks = SqlTaskMap(engine)
        loose = tasks.map("t.loose", "JPCP", "Production", budget_ms=60_000.0).route
        tight = tasks.map("t.tight", "JPCP", "Production", budget_ms=3_000.0).route
    finally:
        engine.dispose()
    await asyncio.sleep(0.5)  # serving's task map: read again within 0.2 s
    async with httpx.AsyncClient(base_url=serving.url, headers=serving.auth, timeout=30) as http:
        answered = await http.post("/v1/tasks/t.loose/infer", json=PAYLOAD)
        refused = await http.post("/v1/tasks/t.tight/infer", json=PAYLOAD)
        declared = await http.post("/v1/tasks/t.tight/infer", json=PAYLOAD | {"budget_ms": 60_000})
    assert answered.status_code == 200 and answered.json()["budget_ms"] == 60_000.0
    assert refused.status_code == 503 and refused.json()["refused"] == "budget"
    assert refused.json()["estimate_ms"] >= 5000 and refused.headers["Retry-After"]
    assert refused.json()["budget_ms"] == 3000.0 and 0 < refused.json()["budget_remaining_ms"] <= 3000.0
    assert declared.status_code == 200 and declared.json()["budget_ms"] == 60_000.0  # a declared budget wins

    async with running_bridge(settings, task_map=True), bus_client(settings) as client:
        over_bus = await client.request(loose.address, PAYLOAD, 30, job_id="loose-bus")
        with pytest.raises(Refused) as early:
            await client.request(tight.address, PAYLOAD, 30, job_id="tight-bus")
    assert over_bus["error"] is None and over_bus["budget_ms"] == 60_000.0 and over_bus["task"] == "t.loose"
    assert 25_000 < over_bus["budget_remaining_ms"] < 30_000  # the 30 s timeout is the earlier end
    assert early.value.reason == "budget" and early.value.estimate_ms is not None and early.value.estimate_ms >= 5000
    assert isinstance(early.value, RefusedJob) and early.value.reply["budget_ms"] == 3000.0
    assert 0 < early.value.reply["budget_remaining_ms"] <= 3000.0
    assert all(record.job_id != "tight-bus" for record in recorded(redis_url))


async def test_exa_bus_send_with_a_budget_prints_a_refusal_with_its_estimate_and_exits_unavailable(
    tmp_path: Path,
    redis_url: str,  # noqa: F811
    standin: BudgetStandIn,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typer.testing import CliRunner

    from examlops.cli.main import app as exa

    standin.refuse = True
    settings = bus_settings(tmp_path, redis_url, standin.port)
    assert settings.token is not None
    monkeypatch.setenv("EXAMLOPS_HOME", str(tmp_path))
    monkeypatch.setenv("EXAMLOPS_REDIS__URL", redis_url)
    monkeypatch.setenv("EXAMLOPS_TOKEN", settings.token.get_secret_value())
    argv = ["bus", "send", "JPCP", "--random", "--node-count", "12", "--budget-ms", "750"]
    async with running_bridge(settings):
        as_json = await asyncio.to_thread(CliRunner().invoke, exa, [*argv, "--json"])
        as_text = await asyncio.to_thread(CliRunner().invoke, exa, argv)
    assert as_json.exit_code == as_text.exit_code == 3, as_json.output
    reply = json.loads(as_json.stdout)
    assert (reply["code"], reply["refused"], reply["estimate_ms"], reply["budget_ms"]) == (
        "refused",
        "budget",
        812.5,
        750,
    )
    assert "refused (budget)" in as_text.output and "812.5" in as_text.output
    assert 0 < standin.calls[0][2]["budget_ms"] < 750


async def test_the_bus_trace_of_a_job_whose_budget_ran_out_before_serving_records_its_budget(
    tmp_path: Path,
    redis_url: str,  # noqa: F811
    standin: BudgetStandIn,
) -> None:
    from examlops.bootstrap.tracing import call_tracer
    from examlops.tracing import trace_id_for_job
    from examlops.tracing.sql_store import SqlTraceStore

    settings = bus_settings(tmp_path, redis_url, standin.port)
    engine = sql_engine(settings)
    tracer = call_tracer(settings, engine)
    tracer.start()
    try:
        async with running_bridge(settings, tracer=tracer), bus_client(settings) as client:
            reply = await client.request(ADDRESS, PAYLOAD, 10, job_id="spent", budget_ms=0.5)
    finally:
        await asyncio.to_thread(tracer.close)
    assert reply["code"] == "deadline_exceeded" and standin.calls == []  # never reached serving
    record = SqlTraceStore(engine).get(trace_id_for_job("spent"))
    engine.dispose()
    assert record is not None
    assert (record.channel, record.outcome, record.budget_ms, record.job_id) == ("bus", "refused", 0.5, "spent")


async def test_a_stream_that_cannot_start_within_its_budget_is_refused_and_traced_as_a_single_call_is(
    serving: Any,
) -> None:
    tight = {"budget_ms": 3_000}
    async with httpx.AsyncClient(base_url=serving.url, headers=serving.auth, timeout=30) as http:
        single = await http.post("/v1/models/JPCP/predict", json=PAYLOAD | tight)
        streamed = await http.post("/v1/models/JPCP/stream", json={"instances": [PAYLOAD] * 20} | tight)
        assert single.status_code == streamed.status_code == 503
        for reply in (single, streamed):
            data = reply.json()
            assert (data["code"], data["refused"], data["budget_ms"]) == ("refused", "budget", 3000.0)
            assert data["estimate_ms"] >= 5000 and 0 < data["budget_remaining_ms"] <= 3000.0
            assert reply.headers["Retry-After"] and reply.headers["X-Examlops-Trace"]
        traces = [await written_trace(http, reply.headers["X-Examlops-Trace"]) for reply in (single, streamed)]

    def seen(trace: dict[str, Any]) -> tuple[Any, ...]:
        return (trace["outcome"], trace["error_code"], trace["model"], trace["budget_ms"], trace["status"])

    assert seen(traces[1]) == seen(traces[0]) == ("refused", "refused", "JPCP", 3000.0, 503)
    assert traces[1]["budget_remaining_ms"] is not None and traces[1]["batch_id"] is None  # never queued


async def written_trace(http: httpx.AsyncClient, trace_id: str) -> dict[str, Any]:
    """The trace ``trace_id`` once the tracer's background writer has stored it."""
    deadline = time.monotonic() + 20
    while True:
        reply = await http.get(f"/v1/traces/{trace_id}")
        if reply.status_code == 200:
            trace: dict[str, Any] = reply.json()
            return trace
        assert reply.status_code == 404 and time.monotonic() < deadline, reply.text
        await asyncio.sleep(0.1)


async def test_a_budget_counts_from_when_serving_read_the_request_not_from_when_its_handler_ran(
    serving: Any,
) -> None:
    """The call's last header line comes 2.5 s after its first bytes (as the loop would read it late when
    busy): a 7 s budget has 4.5 s left when the handler runs, under the 5 s estimate."""

    async def post(rest_after_s: float) -> tuple[int, dict[str, Any]]:
        body = json.dumps(PAYLOAD | {"budget_ms": 7_000}).encode()
        head = (
            f"POST /v1/models/JPCP/predict HTTP/1.1\r\nhost: serving\r\nauthorization: Bearer {serving.token}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
        ).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", serving.port)
        try:
            writer.write(head[:20])
            await writer.drain()
            await asyncio.sleep(rest_after_s)
            writer.write(head[20:] + body)
            await writer.drain()
            reply = await asyncio.wait_for(reader.read(), 30)
        finally:
            writer.close()
        status = int(reply.split(b" ", 2)[1])
        return status, json.loads(reply.partition(b"\r\n\r\n")[2])

    status, answered = await post(0)
    assert status == 200, answered
    status, refused = await post(2.5)
    assert status == 503, refused
    assert (refused["code"], refused["refused"]) == ("refused", "budget"), refused
    assert refused["budget_remaining_ms"] < 4_600 and refused["estimate_ms"] >= 5_000
