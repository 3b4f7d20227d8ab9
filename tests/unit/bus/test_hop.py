"""The bridge's HTTP hop: what a handler replies when serving answers, is down, or is too slow."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from examlops.bootstrap.clients import hop_client
from examlops.bus import wire
from examlops.bus.hop import ModelHandler
from examlops.core.settings import BusSettings, HttpSettings, Settings
from examlops.registry.catalog import ModelSpec, load_catalog
from tests.unit.bus.loopback import reply, server

CATALOG = Path(__file__).resolve().parents[3] / "examlops" / "catalog"
REPLY = b'{"model":"JPCP","alias":"Production","version":1,"run_id":"r","prediction":0.25,"job_id":"j-1"}'


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    return load_catalog(CATALOG).get("JPCP")


def job(spec: ModelSpec, *, deadline_in: float = 30.0, embedding: list[float] | None = None) -> wire.Job:
    return wire.Job(
        job_id="j-1",
        address=str(spec.seanerbus_uuid),
        reply_to=wire.replies_stream("c"),
        key_id="keyida01",
        deadline=time.time() + deadline_in,
        payload={"embedding": embedding or [0.01] * spec.embedding_dim, "node_count": 12},
    )


def serving(answer: bytes | None, *, raw: bytes | None = None) -> contextlib.AbstractAsyncContextManager[Any]:
    """A loopback server answering every request with ``answer`` as a 200 reply, or never when it is None.

    With ``raw``, it writes those bytes instead of an HTTP reply and closes the connection.
    """
    if raw is not None:
        return server(lambda body: raw, close_after=True)
    return server(lambda body: None if answer is None else reply(answer))


@pytest.fixture
async def silent() -> AsyncIterator[str]:
    async with serving(None) as (url, _, _):
        yield url


Hop = Callable[[ModelSpec, str, HttpSettings], ModelHandler]


@pytest.fixture(params=["library", "aiohttp"])
def handler(request: pytest.FixtureRequest) -> Hop:
    """Handlers on the hop client bootstrap builds, once over each transport (``EXAMLOPS_BUS__HTTP_CLIENT``)."""

    def build(spec: ModelSpec, url: str, timeouts: HttpSettings) -> ModelHandler:
        settings = Settings(http=timeouts, bus=BusSettings(http_client=request.param))
        return ModelHandler(spec, hop_client(settings), url, timeouts, time.time)

    return build


async def test_a_reply_from_serving_is_passed_on_with_the_job_sent_once(spec: ModelSpec, handler: Hop) -> None:
    async with serving(REPLY) as (url, _, received):
        one = handler(spec, url, HttpSettings())
        async with one.http:
            outcome = await one.handle(job(spec))
    assert outcome.status == 200 and outcome.recorded
    assert outcome.body["prediction"] == 0.25 and outcome.body["error"] is None and outcome.body["version"] == 1
    assert len(received) == 1 and b'"job_id":"j-1"' in received[0] and b'"budget_ms":' in received[0]


async def test_serving_down_is_an_unreachable_pipeline_not_a_timeout(spec: ModelSpec, handler: Hop) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    one = handler(spec, f"http://127.0.0.1:{port}", HttpSettings())
    async with one.http:
        outcome = await one.handle(job(spec))
    assert outcome.body["code"] == "pipeline_unavailable" and "cannot be reached" in outcome.body["error"]
    assert outcome.body["prediction"] == 0.0 and outcome.status == 0


async def test_serving_too_slow_is_a_timeout_within_the_read_timeout(
    spec: ModelSpec, silent: str, handler: Hop
) -> None:
    one = handler(spec, silent, HttpSettings(read_timeout_s=0.3))
    began = time.monotonic()
    async with one.http:
        outcome = await one.handle(job(spec))
    assert outcome.body["code"] == "pipeline_unavailable" and "did not answer in time" in outcome.body["error"]
    assert time.monotonic() - began < 5


async def test_a_deadline_passing_while_serving_works_is_refused_and_not_recorded(
    spec: ModelSpec, silent: str, handler: Hop
) -> None:
    one = handler(spec, silent, HttpSettings())
    async with one.http:
        outcome = await one.handle(job(spec, deadline_in=0.3))
    assert outcome.body["code"] == "deadline_exceeded" and not outcome.recorded


@pytest.mark.parametrize(
    "raw",
    [
        b"",  # the connection closed without a reply
        b"NOT HTTP AT ALL\r\n\r\n",
        # headers over every transport's cap: ours 64 KiB, httpcore's 100 (checked between 64 KiB reads), aiohttp's 8
        b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * 200_000 + b"\r\ncontent-length: 2\r\n\r\n{}",
    ],
    ids=["closed", "garbage", "header-too-long"],
)
async def test_a_reply_that_is_not_http_is_an_unreachable_pipeline_answered_once(
    spec: ModelSpec, raw: bytes, handler: Hop
) -> None:
    async with serving(None, raw=raw) as (url, _, received):
        one = handler(spec, url, HttpSettings())
        async with one.http:
            outcome = await one.handle(job(spec))
    assert outcome.body["code"] == "pipeline_unavailable" and "cannot be reached" in outcome.body["error"]
    assert outcome.body["prediction"] == 0.0 and len(received) == 1


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
async def test_a_non_finite_number_is_refused_before_anything_is_sent(
    spec: ModelSpec, bad: float, handler: Hop
) -> None:
    async with serving(REPLY) as (url, _, received):
        one = handler(spec, url, HttpSettings())
        async with one.http:
            outcome = await one.handle(job(spec, embedding=[bad] + [0.0] * (spec.embedding_dim - 1)))
    assert outcome.body["code"] == "invalid_input" and outcome.body["field"] == "embedding"
    assert received == []


async def test_a_handled_reply_is_freed_by_reference_counting_not_left_to_the_collector(
    spec: ModelSpec, handler: Hop
) -> None:
    import gc

    async with serving(REPLY) as (url, _, _):
        one = handler(spec, url, HttpSettings())
        async with one.http:
            await one.handle(job(spec))
            gc.collect()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                for _ in range(5):
                    assert (await one.handle(job(spec))).status == 200
                gc.collect()
                cyclic = [type(o).__name__ for o in gc.garbage if isinstance(o, httpx.Response | httpx.Request)]
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
    assert cyclic == []


async def test_the_switch_builds_the_transport_it_names() -> None:
    from examlops.bootstrap.clients import hop_transport
    from examlops.bus.aiohttp_transport import AiohttpTransport

    expected = {"library": httpx.AsyncHTTPTransport, "aiohttp": AiohttpTransport}
    for kind, transport_class in expected.items():
        transport = hop_transport(Settings(bus=BusSettings(http_client=kind)))
        assert isinstance(transport, transport_class)
        await transport.aclose()
    assert Settings().bus.http_client == "aiohttp"


async def test_an_answer_arriving_after_the_deadline_is_the_bridges_verdict_not_servings_reply(
    spec: ModelSpec, handler: Hop
) -> None:
    late = job(spec, deadline_in=30.0)
    calls = iter([time.time()])  # the first reading sets the hop's timeout; the reply is read past the deadline
    async with serving(REPLY) as (url, _, _):
        one = handler(spec, url, HttpSettings())
        one.clock = lambda: next(calls, late.deadline + 1.0)
        async with one.http:
            outcome = await one.handle(late, trace_id="ab" * 16)
            passed_on = await ModelHandler(spec, one.http, url, HttpSettings(), time.time).handle(job(spec))
    assert (outcome.body["code"], outcome.status, outcome.recorded, outcome.verdict) == (
        "deadline_exceeded",
        200,
        False,
        True,
    )
    assert passed_on.status == 200 and passed_on.body["error"] is None and not passed_on.verdict


def captured(answer: dict[str, Any]) -> tuple[httpx.AsyncClient, list[httpx.Request]]:
    """A client over httpx's mock transport (the network's seam): every request kept, ``answer`` to each."""
    requests: list[httpx.Request] = []

    def respond(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200, json=answer)

    return httpx.AsyncClient(transport=httpx.MockTransport(respond)), requests


async def test_a_model_job_names_its_identity_in_a_header_and_as_the_user(spec: ModelSpec) -> None:
    http, requests = captured({"model": "JPCP", "prediction": 0.25, "job_id": "j-1"})
    async with http:
        one = ModelHandler(spec, http, "http://serving", HttpSettings(), time.time)
        outcome = await one.handle(job(spec), "robot-7")
    [request] = requests
    assert request.url.path == "/infer-pipeline/infer"
    assert request.headers["X-Examlops-Identity"] == "robot-7"
    body = json.loads(request.content)
    assert (body["model"], body["user_id"], body["node_count"]) == ("JPCP", "robot-7", 12)
    assert outcome.body["prediction"] == 0.25 and "task" not in outcome.body


async def test_a_task_job_goes_to_the_tasks_route_without_model_or_alias_and_its_reply_names_the_task(
    spec: ModelSpec,
) -> None:
    http, requests = captured({"model": "JPCP", "alias": "Production", "prediction": 0.25, "job_id": "j-1"})
    task_job = job(spec)
    task_job = wire.Job(
        **{f: getattr(task_job, f) for f in wire.Job.__slots__} | {"payload": {**task_job.payload, "alias": "Canary"}}
    )
    async with http:
        one = ModelHandler(spec, http, "http://serving/", HttpSettings(), time.time, task="pavement.distress.jpcp")
        outcome = await one.handle(task_job, "robot-7")
        refused = await one.handle(job(spec, embedding=[1.0]), "robot-7")
    [request] = requests
    assert request.url.path == "/v1/tasks/pavement.distress.jpcp/infer"
    assert request.headers["X-Examlops-Identity"] == "robot-7"
    body = json.loads(request.content)
    assert "model" not in body and "alias" not in body
    assert (body["embedding"], body["node_count"], body["job_id"]) == ([0.01] * spec.embedding_dim, 12, "j-1")
    assert outcome.body["task"] == "pavement.distress.jpcp" and outcome.body["prediction"] == 0.25
    assert refused.body["task"] == "pavement.distress.jpcp" and refused.body["code"] == "invalid_input"


async def test_a_cookie_one_reply_sets_never_rides_on_a_later_job(spec: ModelSpec) -> None:
    from examlops.bus.hop_http import http_client

    requests: list[httpx.Request] = []

    def respond(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        answer = {"model": "JPCP", "prediction": 0.25, "job_id": "j-1"}
        return httpx.Response(200, json=answer, headers={"set-cookie": "session=robot-7; Path=/"})

    async with http_client(HttpSettings(), httpx.MockTransport(respond)) as http:
        one = ModelHandler(spec, http, "http://serving", HttpSettings(), time.time)
        first = await one.handle(job(spec), "robot-7")
        second = await one.handle(job(spec), "robot-8")
        assert len(http.cookies) == 0
    assert first.body["prediction"] == second.body["prediction"] == 0.25
    assert [request.headers.get("cookie") for request in requests] == [None, None]


@pytest.mark.parametrize("limit", [None, httpx.Timeout(0.5, connect=0.25)])
async def test_a_hop_request_is_what_the_clients_build_request_makes(limit: httpx.Timeout | None) -> None:
    from examlops.bus.hop_http import hop_request, http_client, trace_headers

    client = http_client(HttpSettings(), httpx.MockTransport(lambda r: httpx.Response(200)), {"Authorization": "x"})
    client.headers["X-Examlops-Identity"] = "from-the-client"  # a job's own header replaces the client's
    url, headers = httpx.URL("http://serving/infer-pipeline/infer"), trace_headers("a" * 32, "robot-7")
    chosen = httpx.USE_CLIENT_DEFAULT if limit is None else limit
    ours = hop_request(client, url, b'{"a":1}', headers, chosen)
    theirs = client.build_request("POST", url, content=b'{"a":1}', headers=headers, timeout=chosen)
    assert (ours.method, ours.url, ours.content) == (theirs.method, theirs.url, theirs.content)
    assert sorted(ours.headers.multi_items()) == sorted(theirs.headers.multi_items())
    assert ours.headers["x-examlops-identity"] == "robot-7"
    assert ours.extensions == theirs.extensions
    await client.aclose()
