"""The trace of every call in a mixed run: real serving (demo models), a real bridge, real Redis and SQL.

One module-wide run sends HTTP and bus calls that are answered, refused (unknown model, a payload failing
validation, a body over the size limit, an expired bus job) and failed (the demo's Staging version
raises). The tests then read the traces back through the store, ``GET /v1/traces``, `exa trace` and the
audit trail; the last one stops serving (its writer flushes on close) and checks that every call has
exactly one trace and nothing else was written.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from typer.testing import CliRunner

from examlops.bootstrap import sql_engine
from examlops.bootstrap.bridge import bus_client
from examlops.bootstrap.tracing import call_tracer, trace_reader
from examlops.bus import replies
from examlops.cli.main import app as exa
from examlops.core.errors import DeadlineExceeded
from examlops.core.settings import Settings, TracingSettings
from examlops.identity import bus_key_from_token
from examlops.registry.demo import seed_demo
from examlops.tracing import TRACE_HEADER, TraceQuery, TraceStore, trace_id_for_job, valid_trace_id
from tests.integration.servers import ServingProcess
from tests.integration.test_bus_bridge import (
    ADDRESS,
    CATALOG,
    PAYLOAD,
    TOKEN,
    bus_settings,
    running_bridge,
    until,
)
from tests.integration.test_recording import drain, recorder_on, served_events

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning"),
]

EMBEDDING = [0.01] * 384
FAILING = [-0.01] * 384
"""The demo's Staging version raises on negative values (their log is NaN)."""


@dataclass(frozen=True)
class Call:
    """One call of the run and what its trace must say."""

    trace_id: str
    channel: str
    model: str | None
    outcome: str
    code: str = ""
    status: int = 200
    reply: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass
class Run:
    home: Path
    settings: Settings
    serving: ServingProcess
    started: float
    calls: list[Call]
    redis: redis.Redis

    def store(self) -> TraceStore:
        return trace_reader(sql_engine(self.settings))


def http_calls(url: str, auth: dict[str, str]) -> list[Call]:
    calls: list[Call] = []

    def post(path: str, traced: str | None, outcome: str, code: str = "", **body: Any) -> None:
        raw = body.pop("raw", None)
        headers = body.pop("headers", auth)
        if raw is not None:
            reply = httpx.post(url + path, content=raw, headers={"content-type": "application/json", **headers})
        else:
            reply = httpx.post(url + path, json={"embedding": EMBEDDING, "node_count": 12} | body, headers=headers)
        trace_id = reply.headers.get(TRACE_HEADER, "")
        assert valid_trace_id(trace_id), (reply.status_code, reply.headers)
        data = reply.json()
        assert data.get("code", "") == code or (not code and data["error"] is None), reply.text
        calls.append(Call(trace_id, "http", traced, outcome, code, reply.status_code, data))

    for i in range(4):
        post("/infer-pipeline/infer", "JPCP", "answered", model="JPCP", job_id=f"h-{i}")
    for _ in range(2):
        post("/v1/models/CRCP/predict", "CRCP", "answered")
    post("/infer-pipeline/infer", "NOPE", "refused", "model_not_found", model="NOPE")
    post("/v1/models/NOPE/predict", "NOPE", "refused", "model_not_found")
    post("/infer-pipeline/infer", "JPCP", "refused", "invalid_input", model="JPCP", embedding=[0.1] * 383)
    post("/infer-pipeline/infer", None, "refused", "payload_too_large", raw=b"[" + b"0.5," * 400_000 + b"0.5]")
    post(
        "/infer-pipeline/infer", "JPCP", "failed", "inference_failed", model="JPCP", alias="staging", embedding=FAILING
    )
    post("/v1/models/JPCP/predict", None, "refused", "unauthenticated", headers={})  # refused before the route
    return calls


async def bus_calls(settings: Settings, client: redis.Redis) -> list[Call]:
    """Bus calls through a bridge whose own traces are written (and flushed) before this returns."""
    calls: list[Call] = []
    tracer = call_tracer(settings, sql_engine(settings))
    tracer.start()
    async with bus_client(settings) as bus:
        with pytest.raises(DeadlineExceeded):  # no bridge runs yet: the job expires on the stream
            await bus.request(ADDRESS, PAYLOAD, 0.2, job_id="b-expired")
        try:
            async with running_bridge(settings, tracer=tracer):
                await until(lambda: client.xlen(bus.reply_stream) >= 1)
                answered = await asyncio.gather(*(bus.request(ADDRESS, PAYLOAD, 20, job_id=f"b-{i}") for i in range(4)))
                unknown = await bus.request("00000000-0000-4000-8000-00000000dead", PAYLOAD, 20, job_id="b-unknown")
                invalid = await bus.request(ADDRESS, {"embedding": [1.0], "node_count": 3}, 20, job_id="b-invalid")
                failing = PAYLOAD | {"alias": "staging", "embedding": FAILING}
                failed = await bus.request(ADDRESS, failing, 20, job_id="b-failed")
        finally:
            await asyncio.to_thread(tracer.close)  # the bridge's traces are in SQL once this returns
        [(_, expired_fields)] = client.xrange(bus.reply_stream, count=1)
        verified = replies.verify_reply(*bus_key_from_token(TOKEN), expired_fields)
        assert verified is not None
        _, expired = verified
    for reply in answered:
        assert reply["error"] is None, reply
        calls.append(Call(reply["trace"], "bus", "JPCP", "answered", reply=reply))
    assert expired["job_id"] == "b-expired"
    calls.append(Call(expired["trace"], "bus", "JPCP", "refused", "deadline_exceeded", 0, expired))
    calls.append(Call(unknown["trace"], "bus", None, "refused", "model_not_found", 0, unknown))
    calls.append(Call(invalid["trace"], "bus", "JPCP", "refused", "invalid_input", 0, invalid))
    calls.append(Call(failed["trace"], "bus", "JPCP", "failed", "inference_failed", 500, failed))
    for call in calls:
        assert call.trace_id == trace_id_for_job(call.reply["job_id"]) and call.code == (call.reply.get("code") or "")
    return calls


def wait_stored(store: TraceStore, trace_ids: list[str], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while missing := [t for t in trace_ids if store.get(t) is None]:
        assert time.monotonic() < deadline, f"{len(missing)} traces not written in time"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, embedded_redis: Any) -> Iterator[Run]:
    home = tmp_path_factory.mktemp("traces")
    seed_demo(Settings(home=home), CATALOG)
    serving = ServingProcess(home, env={"EXAMLOPS_TRACING__NODE": "serving-a"})
    client = redis.Redis.from_url(embedded_redis.url, decode_responses=True)
    try:
        serving.wait_ready(90)
        client.flushdb()
        settings = bus_settings(home, embedded_redis.url, serving.port)
        settings = settings.model_copy(update={"tracing": TracingSettings(node="bridge-a")})
        started = time.time()
        calls = http_calls(serving.url, serving.auth) + asyncio.run(bus_calls(settings, client))
        run = Run(home, settings, serving, started, calls, client)
        wait_stored(run.store(), [c.trace_id for c in calls])
        yield run
    finally:
        serving.stop()
        client.close()


def test_every_reply_carries_a_trace_id_that_finds_its_record(run: Run) -> None:
    store = run.store()
    for call in run.calls:
        record = store.get(call.trace_id)
        assert record is not None, call
        seen = (record.channel, record.model, record.outcome, record.error_code, record.status)
        assert seen == (call.channel, call.model, call.outcome, call.code, call.status), call
        assert record.used_ms > 0
        # Who: the HTTP caller's identity (none for a call refused before its token was read: none sent, a
        # body over the limit), and on the bus the identity that signed the job, whether the bridge answered
        # it or serving did (told by the bridge, which holds relay).
        unknown = call.code in ("unauthenticated", "payload_too_large")
        expected = "tests" if call.channel == "bus" else None if unknown else "admin"
        assert record.identity == expected, record
        # Serving traced what it answered (a bus job's too); the bridge what it answered itself.
        assert record.node == ("bridge-a" if call.channel == "bus" and call.status == 0 else "serving-a"), call
        if call.status in (200, 500):  # reached a model: the batch it joined, its queue wait and predict time
            assert record.batch_id and record.batch_size is not None and record.batch_size > 0, record
            assert record.queue_wait_ms is not None and record.queue_wait_ms >= 0, record
            assert record.predict_ms is not None and record.predict_ms > 0, record
            assert record.version == (call.reply.get("version") or record.version) and record.version, record
        else:
            assert (record.batch_id, record.batch_size, record.predict_ms) == (None, None, None), record
        if call.outcome == "answered":
            assert record.alias == "Production" and record.version == "1", record
        if call.channel == "bus":
            assert record.job_id == call.reply["job_id"]


def test_the_traces_route_filters_and_pages_what_the_store_holds(run: Run) -> None:
    url = f"{run.serving.url}/v1/traces"
    since = {"since": str(run.started)}
    assert httpx.get(url, params=since).status_code == 401  # traces are for holders of read_traces only
    get = functools.partial(httpx.get, headers=run.serving.auth)
    everything = get(url, params=since | {"limit": 1000}).json()
    assert everything["total"] == len(run.calls)
    assert {t["trace_id"] for t in everything["traces"]} == {c.trace_id for c in run.calls}
    ats = [t["at"] for t in everything["traces"]]
    assert ats == sorted(ats, reverse=True)
    for outcome in ("answered", "refused", "failed"):
        page = get(url, params=since | {"outcome": outcome}).json()
        assert page["total"] == sum(c.outcome == outcome for c in run.calls)
        assert all(t["outcome"] == outcome for t in page["traces"])
    bus = get(url, params=since | {"channel": "bus", "model": "JPCP", "outcome": "refused"}).json()
    assert {t["error_code"] for t in bus["traces"]} == {"deadline_exceeded", "invalid_input"}
    pages = [get(url, params=since | {"limit": 4, "offset": o}).json()["traces"] for o in range(0, 20, 4)]
    assert [t["trace_id"] for page in pages for t in page] == [t["trace_id"] for t in everything["traces"]]
    one = get(f"{url}/{run.calls[0].trace_id}")
    assert one.status_code == 200 and one.json()["trace_id"] == run.calls[0].trace_id
    assert get(f"{url}/{'0' * 32}").json()["code"] == "not_found"
    assert get(url, params={"since": "yesterday"}).status_code == 422
    assert get(url, params={"limit": 0}).status_code == 422


def test_exa_trace_list_and_show_read_the_same_traces(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMLOPS_HOME", str(run.home))
    runner = CliRunner()
    listed = runner.invoke(exa, ["trace", "list", "--outcome", "failed", "--since", str(run.started), "--json"])
    assert listed.exit_code == 0, listed.output
    failed = json.loads(listed.stdout)
    assert {t["trace_id"] for t in failed} == {c.trace_id for c in run.calls if c.outcome == "failed"}
    assert all(t["time"] and t["error_code"] == "inference_failed" for t in failed)
    by_model = json.loads(runner.invoke(exa, ["trace", "list", "--model", "CRCP", "--json"]).stdout)
    assert len(by_model) == 2 and {t["channel"] for t in by_model} == {"http"}
    call = next(c for c in run.calls if c.channel == "bus" and c.outcome == "answered")
    shown = runner.invoke(exa, ["trace", "show", call.trace_id.upper(), "--json"])
    assert shown.exit_code == 0, shown.output
    record = json.loads(shown.stdout)
    assert (record["trace_id"], record["channel"], record["job_id"]) == (call.trace_id, "bus", call.reply["job_id"])
    assert "verdict" not in record
    missing = runner.invoke(exa, ["trace", "show", "0" * 32, "--json"])
    assert missing.exit_code == 4
    table = runner.invoke(exa, ["trace", "list", "--since", "1h", "--limit", "5"])  # 80 columns: ids still whole
    assert table.exit_code == 0 and "traces (newest first)" in table.stdout
    newest = json.loads(runner.invoke(exa, ["trace", "list", "--since", "1h", "--limit", "5", "--json"]).stdout)
    assert len(newest) == 5 and all(t["trace_id"] in table.stdout for t in newest)


def test_inference_served_audit_events_name_the_trace(run: Run) -> None:
    drain(recorder_on(run.redis, "traces-test"))
    events = served_events(run.redis)
    recorded = {c.reply["job_id"]: c.trace_id for c in run.calls if c.channel == "bus" and c.status != 0}
    recorded |= {c.reply["job_id"]: c.trace_id for c in run.calls if c.code == "invalid_input" and c.channel == "bus"}
    assert {e["job_id"]: e["trace"] for e in events} == recorded


def test_every_call_has_exactly_one_trace_and_the_counts_match_the_replies(run: Run) -> None:
    assert run.serving.stop() == 0, run.serving.log_tail()  # its writer flushes what it holds on the way out
    store = run.store()
    records = store.find(TraceQuery(since=run.started, limit=1000))
    assert Counter(r.trace_id for r in records) == Counter(c.trace_id for c in run.calls)
    assert len(run.calls) == 20
    outcomes = Counter((c.channel, c.outcome) for c in run.calls)
    assert outcomes == Counter((r.channel, r.outcome) for r in records)
    assert outcomes == {
        ("http", "answered"): 6,
        ("http", "refused"): 5,
        ("http", "failed"): 1,
        ("bus", "answered"): 4,
        ("bus", "refused"): 3,
        ("bus", "failed"): 1,
    }
