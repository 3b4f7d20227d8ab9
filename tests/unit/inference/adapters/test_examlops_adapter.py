"""The examlops adapter at its protocol: what it sends to serving's routes and what it makes of the replies."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence

import httpx
import pytest

from examlops.inference.adapters.examlops import ExamlopsAdapter, ExamlopsTarget, examlops_adapter, served_trace
from examlops.inference.errors import InferenceError, Kind
from examlops.inference.ports import Call, Row
from tests.unit.inference.adapters.fakes import Handler, Network, reply

ROWS = [{"embedding": [0.1, 0.2], "node_count": 3}, {"embedding": [0.3, 0.4], "node_count": 5}]
ANSWER = {"model": "JPCP", "alias": "Production", "version": "1", "run_id": None, "prediction": 0.75}


async def started(network: Network, target: ExamlopsTarget) -> ExamlopsAdapter:
    adapter = ExamlopsAdapter("http://serving", {"score": target}, token="k-1", transport=network.transport)
    await adapter.start()
    return adapter


def ndjson(*lines: dict[str, object], status: int = 200) -> Handler:
    body = "".join(json.dumps(line) + "\n" for line in lines)
    return lambda request: httpx.Response(status, content=body, headers={"content-type": "application/x-ndjson"})


async def test_one_row_goes_to_the_task_route_with_token_trace_and_what_remains_of_the_deadline() -> None:
    network = Network(reply(200, ANSWER, {"X-Examlops-Trace": "t-served"}))
    adapter = await started(network, ExamlopsTarget(task="pavement.distress"))
    deadline = time.monotonic() + 2.0
    out = await adapter.predict_batch("score", ROWS[:1], Call(route="score", deadline=deadline, trace_id="t-mine"))
    await adapter.close()
    assert out == [{"prediction": 0.75}]
    (request,) = network.requests
    assert request.url.path == "/v1/tasks/pavement.distress/infer"
    assert request.headers["Authorization"] == "Bearer k-1"
    assert request.headers["X-Examlops-Trace"] == "t-mine"
    body = network.bodies[0]
    assert body["embedding"] == [0.1, 0.2] and body["node_count"] == 3
    assert 0 < body["budget_ms"] <= 2000.0  # never more than what remained
    assert served_trace() == "t-served"


async def test_a_model_target_sends_its_alias_and_names_the_output_field() -> None:
    network = Network(reply(200, ANSWER))
    adapter = await started(network, ExamlopsTarget(model="JPCP", alias="Canary", outputs=("risk",)))
    out = await adapter.predict_batch("score", ROWS[:1], Call(route="score"))
    await adapter.close()
    assert out == [{"risk": 0.75}]
    assert network.requests[0].url.path == "/v1/models/JPCP/predict"
    assert network.bodies[0]["alias"] == "Canary"
    assert "budget_ms" not in network.bodies[0]  # no deadline, no budget


@pytest.mark.parametrize(
    ("deadline_s", "option", "sent"),
    [(None, 5.0, 5.0), (10.0, 5.0, 5.0), (0.5, 5000.0, None)],
    ids=["option-alone", "option-under-the-deadline", "deadline-under-the-option"],
)
async def test_the_budget_option_is_sent_when_less_than_what_remains_of_the_deadline(
    deadline_s: float | None, option: float, sent: float | None
) -> None:
    network = Network(reply(200, ANSWER))
    adapter = await started(network, ExamlopsTarget(task="pavement.distress"))
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    call = Call(route="score", deadline=deadline, options={"budget_ms": option})
    await adapter.predict_batch("score", ROWS[:1], call)
    await adapter.close()
    budget = network.bodies[0]["budget_ms"]
    assert budget == sent if sent is not None else 0 < budget <= 500.0


@pytest.mark.parametrize("option", [0, -1.0, "5", True, 1e12])
async def test_a_budget_option_that_is_no_budget_is_validation_before_any_request(option: object) -> None:
    network = Network(reply(200, ANSWER))
    adapter = await started(network, ExamlopsTarget(task="pavement.distress"))
    with pytest.raises(InferenceError) as caught:
        await adapter.predict_batch("score", ROWS[:1], Call(route="score", options={"budget_ms": option}))
    await adapter.close()
    assert caught.value.kind is Kind.VALIDATION and network.requests == []


async def test_the_callers_token_in_the_options_wins() -> None:
    network = Network(reply(200, ANSWER))
    adapter = await started(network, ExamlopsTarget(task="t"))
    await adapter.predict_batch("score", ROWS[:1], Call(route="score", options={"token": "caller"}))
    await adapter.close()
    assert network.requests[0].headers["Authorization"] == "Bearer caller"


async def test_a_batch_is_one_call_to_the_stream_route_its_chunks_collected_in_order() -> None:
    network = Network(
        ndjson(
            {"chunk": 0, "start": 0, "predictions": [0.1], "model": "JPCP", "alias": "Production", "versions": ["1"]},
            {"chunk": 1, "start": 1, "predictions": [0.2], "model": "JPCP", "alias": "Production", "versions": ["1"]},
            {"done": True, "answered": 2, "instances": 2, "expired": False, "error": None},
        )
    )
    adapter = await started(network, ExamlopsTarget(model="JPCP", version=2))
    out = await adapter.predict_batch("score", ROWS, Call(route="score", deadline=time.monotonic() + 5))
    assert out == [{"prediction": 0.1}, {"prediction": 0.2}]
    chunks = [chunk async for chunk in adapter.stream_batches("score", ROWS, Call(route="score"))]
    await adapter.close()
    assert chunks == [[{"prediction": 0.1}], [{"prediction": 0.2}]]
    assert network.requests[0].url.path == "/v1/models/JPCP/stream"
    body = network.bodies[0]
    assert body["instances"] == ROWS and body["version"] == 2 and 0 < body["budget_ms"] <= 5000


@pytest.mark.parametrize(
    ("end", "kind", "code"),
    [
        ({"done": True, "answered": 1, "instances": 2, "expired": True, "error": None}, Kind.TIMEOUT, "expired"),
        (
            {
                "done": True,
                "answered": 1,
                "instances": 2,
                "error": {"code": "inference_failed", "error": "raised", "inference_failed": True},
            },
            Kind.MODEL_FAILURE,
            "inference_failed",
        ),
        (
            {
                "done": True,
                "answered": 1,
                "instances": 2,
                "error": {"code": "invalid_input", "error": "instances.1.node_count"},
            },
            Kind.VALIDATION,
            "invalid_input",
        ),
        (
            {"done": True, "answered": 1, "instances": 2, "error": {"code": "refused", "error": "late"}},
            Kind.THROTTLED,
            "refused",
        ),
        ({"done": True, "answered": 1, "instances": 2, "error": None}, Kind.INFRASTRUCTURE, "inference_bad_reply"),
    ],
)
async def test_a_stream_that_stops_short_fails_the_whole_batch(end: dict[str, object], kind: Kind, code: str) -> None:
    chunk = {"chunk": 0, "start": 0, "predictions": [0.1], "model": "JPCP", "alias": "P", "versions": ["1"]}
    network = Network(ndjson(chunk, end))
    adapter = await started(network, ExamlopsTarget(task="t"))
    with pytest.raises(InferenceError) as caught:
        await adapter.predict_batch("score", ROWS, Call(route="score"))
    await adapter.close()
    assert (caught.value.kind, caught.value.code) == (kind, code)


async def test_a_stream_refused_before_its_first_line_is_throttled_with_retry_after() -> None:
    network = Network(
        reply(503, {"error": "no placement", "code": "refused", "refused": "budget"}, {"Retry-After": "1"})
    )
    adapter = await started(network, ExamlopsTarget(task="t"))
    with pytest.raises(InferenceError) as caught:
        await adapter.predict_batch("score", ROWS, Call(route="score"))
    await adapter.close()
    assert (caught.value.kind, caught.value.retry_after_s) == (Kind.THROTTLED, 1.0)
    assert "no placement" in caught.value.message  # examlops' own error text never echoes the input: kept


async def test_a_stream_without_its_last_line_is_infrastructure() -> None:
    chunk = {"chunk": 0, "start": 0, "predictions": [0.1, 0.2], "model": "JPCP", "alias": "P", "versions": ["1", "1"]}
    network = Network(ndjson(chunk))
    adapter = await started(network, ExamlopsTarget(task="t"))
    with pytest.raises(InferenceError) as caught:
        await adapter.predict_batch("score", ROWS, Call(route="score"))
    await adapter.close()
    assert caught.value.kind is Kind.INFRASTRUCTURE


def test_a_target_names_a_task_or_a_model_never_both_nor_pins_on_a_task() -> None:
    for bad in (
        {},
        {"task": "t", "model": "m"},
        {"task": "t", "alias": "a"},
        {"model": "m", "alias": "a", "version": 1},
    ):
        with pytest.raises(ValueError):
            ExamlopsTarget(**bad)  # type: ignore[arg-type]  # each a bad combination on purpose


def test_the_wiring_factory_takes_target_objects_and_file_mappings() -> None:
    adapter = examlops_adapter(
        {"score": {"task": "t", "outputs": ["risk"]}, "other": ExamlopsTarget(model="m", alias="Canary")},
        {"url": "http://s", "token": "k", "max_batch": 32},
    )
    assert adapter.routes["score"] == ExamlopsTarget(task="t", outputs=("risk",))
    assert adapter.routes["other"] == ExamlopsTarget(model="m", alias="Canary")
    assert ExamlopsTarget.adapter == "examlops" == adapter.backend
    assert adapter.capabilities.max_batch == 32 and adapter.capabilities.streaming


async def test_a_stream_whose_next_chunk_comes_after_the_deadline_is_a_timeout() -> None:
    first = {"chunk": 0, "start": 0, "predictions": [0.1], "model": "JPCP", "alias": "P", "versions": ["1"]}

    async def lines() -> AsyncIterator[bytes]:
        yield (json.dumps(first) + "\n").encode()
        await asyncio.sleep(30)  # the second chunk never comes in time
        yield b""

    network = Network(lambda request: httpx.Response(200, content=lines()))
    adapter = await started(network, ExamlopsTarget(task="t"))
    seen: list[Sequence[Row]] = []
    with pytest.raises(InferenceError) as caught:
        async for chunk in adapter.stream_batches("score", ROWS, Call(route="score", deadline=time.monotonic() + 0.2)):
            seen.append(chunk)
    await adapter.close()
    assert caught.value.kind is Kind.TIMEOUT
    assert seen == [[{"prediction": 0.1}]]


async def test_a_cancelled_call_is_cancelled_not_mapped() -> None:
    async def never(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(30)
        return httpx.Response(200)

    adapter = await started(Network(never), ExamlopsTarget(task="t"))
    task = asyncio.create_task(adapter.predict_batch("score", ROWS[:1], Call(route="score")))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await adapter.close()


async def test_reply_fields_come_beside_the_prediction_when_the_reply_carries_them() -> None:
    network = Network(reply(200, {**ANSWER, "budget_remaining_ms": 12.5}))
    target = ExamlopsTarget(model="JPCP", reply_fields=("model", "version", "budget_remaining_ms", "task"))
    adapter = await started(network, target)
    out = await adapter.predict_batch("score", ROWS[:1], Call(route="score"))
    await adapter.close()
    assert out == [{"model": "JPCP", "version": "1", "budget_remaining_ms": 12.5, "prediction": 0.75}]
    assert ExamlopsTarget.of({"task": "t", "reply_fields": ["model"]}).reply_fields == ("model",)


async def test_the_port_lets_the_callers_token_through_to_the_examlops_adapter() -> None:
    from pydantic import BaseModel

    from examlops.inference import InferencePort, InferenceSpec

    class Row(BaseModel):
        embedding: list[float]
        node_count: int

    class Out(BaseModel):
        prediction: float

    network = Network(reply(200, ANSWER))
    adapter = await started(network, ExamlopsTarget(task="t"))
    port = InferencePort(InferenceSpec(name="score", input=Row, output=Out), adapter)
    assert await port.predict(ROWS[0], options={"token": "caller"}) == Out(prediction=0.75)
    await adapter.close()
    assert network.requests[0].headers["Authorization"] == "Bearer caller"
