"""The bus and the bridge against a real redis-server: request/reply, refusals, reclaim, Redis restarts.

Most tests put a small stand-in for serving (uvicorn in a thread, answering
``/infer-pipeline/infer`` and logging every job id it sees) behind the bridge,
so that they can slow it down and see exactly what reached it. The tests
marked ``real_serving`` run `exa serve start` with the demo models instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import SecretStr

from examlops.bootstrap import sql_engine, upgrade_database
from examlops.bootstrap.bridge import bus_client, bus_keys, sync_bus_client, task_addresses
from examlops.bootstrap.clients import bus_redis, hop_client
from examlops.bootstrap.identity import identity_service
from examlops.bus import replies, wire
from examlops.bus.bridge import Bridge
from examlops.bus.store import BusStore
from examlops.core import records
from examlops.core.errors import DeadlineExceeded, StoreUnavailable
from examlops.core.settings import BusSettings, HttpSettings, RedisSettings, ServingSettings, Settings
from examlops.identity import bus_key_from_token
from examlops.platform.redis_server import EmbeddedRedis
from examlops.registry.catalog import Catalog, load_catalog
from examlops.tracing import trace_id_for_job
from tests.integration.servers import examlops_env, known_token, upgraded
from tests.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CATALOG = load_catalog(Settings().catalog_path)
JPCP = CATALOG.get("JPCP")
ADDRESS = str(JPCP.seanerbus_uuid)
PAYLOAD = {"embedding": [0.01] * 384, "node_count": 12}
FAST_HTTP = HttpSettings(connect_timeout_s=1.0, read_timeout_s=2.0)
"""Reclaim after 1 + 2 + 2 = 5 s idle instead of 17 s."""
TOKEN = f"exa_{secrets.token_hex(8)}_{secrets.token_urlsafe(32)}"
"""The platform token of these tests (EXAMLOPS_TOKEN): clients sign with its bus key; ``bus_settings`` makes it
an identity's key in the test's SQL, so bridges know it."""


class StandIn:
    """A stand-in for serving: answers like `/infer-pipeline/infer` and `/v1/tasks/{task}/infer` (a task is
    answered by ``task_models[task]``), refuses passed deadlines, logs job ids, the identity header of each
    call and the tasks called."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.identities: list[str | None] = []
        self.tasks: list[str] = []
        self.task_models: dict[str, str] = {}
        self.delay = 0.0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = FastAPI()

        @app.post("/infer-pipeline/infer")
        async def infer(request: Request) -> JSONResponse:
            body = await request.json()
            if body.get("deadline") is not None and body["deadline"] < time.time():
                error = {"error": "deadline passed", "prediction": 0.0, "code": "deadline_exceeded"}
                return JSONResponse(error, status_code=504)
            self.seen.append(body["job_id"])
            self.identities.append(request.headers.get("x-examlops-identity"))
            await asyncio.sleep(self.delay)
            reply = {"model": body["model"], "alias": body.get("alias") or "Production", "version": "1"}
            reply |= {"run_id": "run-1", "prediction": 0.5, "error": None, "job_id": body["job_id"]}
            return JSONResponse(reply)

        @app.post("/v1/tasks/{task}/infer")
        async def infer_task(task: str, request: Request) -> JSONResponse:
            body = await request.json()
            assert "model" not in body and "alias" not in body
            self.seen.append(body["job_id"])
            self.identities.append(request.headers.get("x-examlops-identity"))
            self.tasks.append(task)
            model = self.task_models[task]
            await asyncio.sleep(self.delay)
            reply: dict[str, Any] = {
                "task": task,
                "model": model,
                "alias": "Production",
                "version": "1",
                "run_id": "run-1",
            }
            reply |= {"prediction": 0.5, "error": None, "job_id": body["job_id"]}
            return JSONResponse(reply)

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> StandIn:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "the stand-in did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def recorded(redis_url: str) -> list[records.ServedInference]:
    """The records the bridges wrote with their replies, in stream order (no recorder drains them here)."""
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        return [records.read_record(i, f) for i, f in client.xrange(records.RECORDS_STREAM)]


@pytest.fixture
def standin() -> Iterator[StandIn]:
    with StandIn() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: str) -> str:
    """The session's redis-server, emptied for this test."""
    with redis.Redis.from_url(redis_server) as client:
        client.flushdb()
    return redis_server


def bus_settings(home: Path, redis_url: str, serving_port: int, http_client: str = "aiohttp") -> Settings:
    """``http_client``: the hop's transport switch (``EXAMLOPS_BUS__HTTP_CLIENT``)."""
    settings = Settings(
        home=home,
        redis=RedisSettings(url=redis_url),
        serving=ServingSettings(port=serving_port),
        http=FAST_HTTP,
        bus=BusSettings(http_client=http_client),
        token=SecretStr(TOKEN),
    )
    upgrade_database(settings)  # as `exa up` does first: the bridge's recording writes audit checkpoints
    known_token(settings, TOKEN)  # the identity ("tests") whose key the clients sign with and the bridges verify
    return settings


@contextlib.asynccontextmanager
async def running_bridge(
    settings: Settings, catalog: Catalog = CATALOG, *, task_map: bool = False, **options: Any
) -> AsyncIterator[Bridge]:
    """A bridge in this loop; ``keys`` (a ``BusKeys``) defaults to bootstrap's, which knows the settings' token;
    ``task_map``: serve the task addresses of the settings' task map (bootstrap's ``task_addresses``). Both
    read SQL on one engine, disposed with the bridge."""
    redis_client = bus_redis(settings)
    engine = sql_engine(settings)
    keys = options.pop("keys", None) or bus_keys(settings, engine)
    if task_map:
        options["tasks"] = task_addresses(settings, engine)
    try:
        async with hop_client(settings) as http:
            bridge = Bridge(settings, catalog, redis_client, http, keys, **options)
            stop = asyncio.Event()
            task = asyncio.create_task(bridge.run(stop))
            try:
                yield bridge
            finally:
                stop.set()
                await asyncio.wait_for(task, 20)
                await redis_client.aclose()
    finally:
        engine.dispose()


def signed_job(
    settings: Settings,
    job_id: str,
    reply_to: str,
    *,
    deadline_in: float,
    address: str = ADDRESS,
    payload: dict[str, Any] = PAYLOAD,
) -> dict[str, str]:
    """The stream fields of a job signed with the bus key of the settings' token, as a client would send it."""
    assert settings.token is not None
    key_id, key = bus_key_from_token(settings.token.get_secret_value())
    return wire.encode_job(
        key_id,
        key,
        address=address,
        job_id=job_id,
        reply_to=reply_to,
        deadline=time.time() + deadline_in,
        payload=payload,
    )


async def until(check: Any, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def replies_per_job(redis_url: str, stream: str, *, resent: bool | None = None) -> Counter[str]:
    """Reply entries per job id on ``stream``; ``resent``: only those a retry got again (True) or only the
    first ones (False)."""
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        return Counter(
            fields["job_id"]
            for _id, fields in client.xrange(stream)
            if resent is None or ("resent" in fields) == resent
        )


@pytest.mark.parametrize("http_client", ["library", "aiohttp"])
async def test_a_job_is_answered_with_the_models_reply(
    tmp_path: Path, redis_url: str, standin: StandIn, http_client: str
) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port, http_client)
    async with running_bridge(settings), bus_client(settings) as client:
        reply = await client.request(ADDRESS, PAYLOAD, 10, job_id="job-one")
    assert 0 < reply["budget_remaining_ms"] <= 10_000  # what was left of the job's 10 s when it was answered
    assert {k: v for k, v in reply.items() if k != "budget_remaining_ms"} == {
        "model": "JPCP",
        "alias": "Production",
        "version": "1",
        "run_id": "run-1",
        "prediction": 0.5,
        "error": None,
        "job_id": "job-one",
        "budget_ms": None,
        "trace": trace_id_for_job("job-one"),
    }
    assert standin.seen == ["job-one"] and standin.identities == ["tests"]  # the token's identity, by name
    [record] = recorded(redis_url)  # written with the reply, in the same step
    assert (record.job_id, record.model, record.caller, record.node_count) == ("job-one", "JPCP", "tests", 12)
    assert record.reply == reply and record.status == 200 and record.address == ADDRESS
    assert (record.norm, record.mean, record.std) == pytest.approx((0.01 * 384**0.5, 0.01, 0.0), abs=1e-9)
    with redis.Redis.from_url(redis_url) as sync_redis:  # the done key lives to the deadline plus the margin
        assert wire.DONE_MARGIN_S < sync_redis.ttl(wire.done_key("job-one")) <= 10 + wire.DONE_MARGIN_S


async def test_a_job_for_an_unknown_uuid_gets_an_error_reply(tmp_path: Path, redis_url: str, standin: StandIn) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    async with running_bridge(settings, sweep_s=0.2), bus_client(settings) as client:
        reply = await client.request(uuid.uuid4(), PAYLOAD, 10)
    assert reply["code"] == "model_not_found"
    assert reply["prediction"] == 0.0 and reply["error"]
    assert standin.seen == []


async def test_bridges_for_disjoint_models_each_serve_their_own_and_an_unserved_model_gets_an_error_reply(
    tmp_path: Path, redis_url: str, standin: StandIn
) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    crcp, ac = CATALOG.get("CRCP"), CATALOG.get("AC")
    async with (
        running_bridge(settings, CATALOG.only(["JPCP"]), sweep_s=0.2),
        running_bridge(settings, CATALOG.only(["crcp"]), sweep_s=0.2),
        bus_client(settings) as client,
    ):
        replies = await asyncio.gather(
            *(client.request(ADDRESS, PAYLOAD, 10, job_id=f"j-{i}") for i in range(5)),
            *(client.request(crcp.seanerbus_uuid, PAYLOAD, 10, job_id=f"c-{i}") for i in range(5)),
        )
        unserved = await client.request(ac.seanerbus_uuid, PAYLOAD, 10, job_id="a-0")
    assert all(reply["error"] is None for reply in replies)
    models = {s.job_id: s.model for s in recorded(redis_url)}
    assert models == {f"j-{i}": "JPCP" for i in range(5)} | {f"c-{i}": "CRCP" for i in range(5)}
    assert unserved["code"] == "model_not_found" and "a-0" not in standin.seen


async def test_a_job_past_its_deadline_is_not_served(tmp_path: Path, redis_url: str, standin: StandIn) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    async with bus_client(settings) as client:
        with pytest.raises(DeadlineExceeded):
            await client.request(ADDRESS, PAYLOAD, 0.2, job_id="too-late")  # no bridge runs yet
        async with running_bridge(settings):
            await until(lambda: replies_per_job(redis_url, client.reply_stream)["too-late"] == 1)
            assert (await client.request(ADDRESS, PAYLOAD, 10, job_id="in-time"))["error"] is None
    assert standin.seen == ["in-time"]
    assert [s.job_id for s in recorded(redis_url)] == ["in-time"]


async def test_an_altered_job_is_dead_lettered_with_its_reason_and_never_answered(
    tmp_path: Path, redis_url: str, standin: StandIn
) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    reply_to = wire.replies_stream("tamper-test")
    fields = signed_job(settings, "altered", reply_to, deadline_in=10)
    fields["payload"] = fields["payload"].replace('"node_count":12', '"node_count":13')
    unsigned = {k: v for k, v in fields.items() if k != "sig"} | {"job_id": "unsigned"}
    stranger = fields | {"job_id": "stranger", "key": "nobodyskey0"}
    with redis.Redis.from_url(redis_url, decode_responses=True) as sync_redis:
        for job in (fields, unsigned, stranger):
            sync_redis.xadd(wire.jobs_stream(ADDRESS), job)
        async with running_bridge(settings):
            await until(lambda: sync_redis.xlen(wire.DEAD_STREAM) == 3)
        dead = [orjson.loads(f["job"]) for _id, f in sync_redis.xrange(wire.DEAD_STREAM)]
        assert sync_redis.xlen(reply_to) == 0
        assert not any(sync_redis.exists(wire.done_key(j)) for j in ("altered", "unsigned", "stranger"))
    assert Counter(d["reason"] for d in dead) == Counter({"bad_signature": 2, "unknown_key": 1})  # jobs run at once
    assert standin.seen == []


async def test_a_job_delivered_more_than_three_times_is_dead_lettered_with_an_error_reply(
    tmp_path: Path, redis_url: str, standin: StandIn
) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    stream = wire.jobs_stream(ADDRESS)
    async with bus_client(settings) as client:
        with redis.Redis.from_url(redis_url, decode_responses=True) as sync_redis:
            sync_redis.xgroup_create(stream, wire.GROUP, id="0", mkstream=True)
            waiting = asyncio.create_task(client.request(ADDRESS, PAYLOAD, 20, job_id="cursed"))
            await until(lambda: sync_redis.xlen(stream) == 1)
            # Three bridges took it and died: three deliveries, idle for a minute.
            [(_name, [(entry_id, _fields)])] = sync_redis.xreadgroup(wire.GROUP, "ghost", {stream: ">"})
            sync_redis.xclaim(stream, wire.GROUP, "ghost", 0, [entry_id], idle=60_000, retrycount=3)
            async with running_bridge(settings, sweep_s=0.2):
                reply = await waiting
            [(_id, dead)] = sync_redis.xrange(wire.DEAD_STREAM)
            assert '"job_id":"cursed"' in dead["job"]
    assert reply["code"] == "undeliverable" and reply["prediction"] == 0.0
    assert standin.seen == []


async def test_a_reclaimed_job_that_was_answered_is_acked_without_serving_it_again(
    tmp_path: Path, redis_url: str, standin: StandIn
) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    stream = wire.jobs_stream(ADDRESS)
    async with bus_client(settings) as client:
        async with running_bridge(settings):
            assert (await client.request(ADDRESS, PAYLOAD, 10, job_id="twice"))["error"] is None
        # The same signed job, taken by a bridge that died before acking it: pending and idle for a minute.
        with redis.Redis.from_url(redis_url, decode_responses=True) as sync_redis:
            job = signed_job(settings, "twice", client.reply_stream, deadline_in=10)
            sync_redis.xadd(stream, job)
            [(_name, [(entry_id, _fields)])] = sync_redis.xreadgroup(wire.GROUP, "ghost", {stream: ">"})
            sync_redis.xclaim(stream, wire.GROUP, "ghost", 0, [entry_id], idle=60_000)
            async with running_bridge(settings, sweep_s=0.2):
                await until(lambda: sync_redis.xlen(stream) == 0)
    assert standin.seen == ["twice"]
    assert replies_per_job(redis_url, client.reply_stream, resent=False) == Counter({"twice": 1})


async def test_a_job_id_submitted_twice_is_served_and_recorded_once_and_the_retry_gets_the_same_reply(
    tmp_path: Path, redis_url: str, standin: StandIn
) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    async with running_bridge(settings), bus_client(settings) as client, bus_client(settings) as other:
        first = await client.request(ADDRESS, PAYLOAD, 10, job_id="again")
        # A retry (the same client's, or another process's with the same identity) is not served again: it
        # gets the job id's one reply, resent.
        assert await client.request(ADDRESS, PAYLOAD, 10, job_id="again") == first
        assert await other.request(ADDRESS, PAYLOAD, 10, job_id="again") == first
    assert first["error"] is None and standin.seen == ["again"]
    assert replies_per_job(redis_url, client.reply_stream, resent=False) == Counter({"again": 1})
    assert replies_per_job(redis_url, client.reply_stream, resent=True) == Counter({"again": 1})
    assert replies_per_job(redis_url, other.reply_stream, resent=True) == Counter({"again": 1})
    assert [served.job_id for served in recorded(redis_url)] == ["again"]


async def test_a_retry_of_an_answered_job_id_by_another_identity_gets_no_reply(
    tmp_path: Path, redis_url: str, standin: StandIn
) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    stranger_token = f"exa_{secrets.token_hex(8)}_{secrets.token_urlsafe(32)}"
    known_token(settings, stranger_token, name="stranger")
    stranger = settings.model_copy(update={"token": SecretStr(stranger_token)})
    async with running_bridge(settings), bus_client(settings) as client, bus_client(stranger) as other:
        assert (await client.request(ADDRESS, PAYLOAD, 10, job_id="mine"))["error"] is None
        with pytest.raises(DeadlineExceeded):  # job ids are global: the id is used up, its reply not theirs
            await other.request(ADDRESS, PAYLOAD, 1, job_id="mine")
        with redis.Redis.from_url(redis_url) as sync_redis:
            await until(lambda: sync_redis.xlen(wire.jobs_stream(ADDRESS)) == 0)  # the bridge acked the copy
            assert sync_redis.xlen(other.reply_stream) == 0
    assert standin.seen == ["mine"]


async def test_a_resend_that_lost_redis_is_retried_by_the_same_bridge_not_left_to_a_reclaim(
    tmp_path: Path, redis_url: str, standin: StandIn, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    resend = BusStore.resend
    tries: list[str] = []

    async def losing_redis_once(self: BusStore, stream: str, entry_id: str, **options: Any) -> bool:
        tries.append(entry_id)
        if len(tries) == 1:
            raise StoreUnavailable("connection refused")  # before the script ran
        return await resend(self, stream, entry_id, **options)

    monkeypatch.setattr(BusStore, "resend", losing_redis_once)
    async with running_bridge(settings), bus_client(settings) as client:
        first = await client.request(ADDRESS, PAYLOAD, 10, job_id="shaky")
        assert await client.request(ADDRESS, PAYLOAD, 10, job_id="shaky") == first
    assert len(tries) == 2 and tries[0] == tries[1]  # the same entry, retried
    assert "failed in the bridge" not in caplog.text  # not an error left pending for another bridge to reclaim
    assert replies_per_job(redis_url, client.reply_stream, resent=True) == Counter({"shaky": 1})


async def test_a_retry_of_an_answered_job_id_by_a_revoked_identity_gets_no_reply(
    tmp_path: Path, redis_url: str, standin: StandIn
) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    leaver_token = f"exa_{secrets.token_hex(8)}_{secrets.token_urlsafe(32)}"
    known_token(settings, leaver_token, name="leaver")
    leaver = settings.model_copy(update={"token": SecretStr(leaver_token)})
    async with bus_client(leaver) as client:
        async with running_bridge(settings):
            assert (await client.request(ADDRESS, PAYLOAD, 10, job_id="before-revoke"))["error"] is None
        with identity_service(settings) as service:
            service.revoke("leaver")
        with redis.Redis.from_url(redis_url, decode_responses=True) as sync_redis:
            sync_redis.xadd(
                wire.jobs_stream(ADDRESS), signed_job(leaver, "before-revoke", client.reply_stream, deadline_in=10)
            )
            async with running_bridge(settings):  # a new bridge: its key cache knows of the revocation
                await until(lambda: sync_redis.xlen(wire.jobs_stream(ADDRESS)) == 0)
    # Acked without a reply, as a fresh job of a revoked identity is never served: the first answer is not
    # resent to an identity that may no longer have it.
    assert replies_per_job(redis_url, client.reply_stream) == Counter({"before-revoke": 1})
    assert replies_per_job(redis_url, client.reply_stream, resent=True) == Counter()
    assert standin.seen == ["before-revoke"]


async def test_a_job_id_reused_for_another_payload_is_dead_lettered_and_never_gets_the_first_answer(
    tmp_path: Path, redis_url: str, standin: StandIn
) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    other_payload = {**PAYLOAD, "node_count": 13}
    async with running_bridge(settings), bus_client(settings) as client:
        assert (await client.request(ADDRESS, PAYLOAD, 10, job_id="reused"))["error"] is None
        with redis.Redis.from_url(redis_url, decode_responses=True) as sync_redis:
            reused = signed_job(settings, "reused", client.reply_stream, deadline_in=10, payload=other_payload)
            sync_redis.xadd(wire.jobs_stream(ADDRESS), reused)
            await until(lambda: sync_redis.xlen(wire.DEAD_STREAM) == 1)
            [(_id, dead)] = sync_redis.xrange(wire.DEAD_STREAM)
        # The same request again still gets the first answer.
        assert (await client.request(ADDRESS, PAYLOAD, 10, job_id="reused"))["error"] is None
    assert orjson.loads(dead["job"])["reason"] == "job_id_reused"
    assert replies_per_job(redis_url, client.reply_stream, resent=True) == Counter({"reused": 1})
    assert replies_per_job(redis_url, client.reply_stream) == Counter({"reused": 2})
    assert standin.seen == ["reused"] and [served.job_id for served in recorded(redis_url)] == ["reused"]


async def test_two_copies_of_a_job_in_flight_at_once_are_served_twice_but_answered_and_recorded_once(
    tmp_path: Path, redis_url: str, standin: StandIn
) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    standin.delay = 0.3  # both copies pass the check for a done key before either is answered
    reply_stream = wire.replies_stream("copies")
    job = signed_job(settings, "copied", reply_stream, deadline_in=10)
    with redis.Redis.from_url(redis_url, decode_responses=True) as sync_redis:
        sync_redis.xadd(wire.jobs_stream(ADDRESS), job)
        sync_redis.xadd(wire.jobs_stream(ADDRESS), job)
        async with running_bridge(settings):
            await until(lambda: sync_redis.xlen(wire.jobs_stream(ADDRESS)) == 0)
    assert standin.seen == ["copied", "copied"]
    assert replies_per_job(redis_url, reply_stream) == Counter({"copied": 1})
    assert [served.job_id for served in recorded(redis_url)] == ["copied"]


async def test_a_reply_whose_answer_was_lost_is_retried_and_the_job_still_recorded_once(
    tmp_path: Path, redis_url: str, standin: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    finish = BusStore.finish
    lost: list[str] = []

    async def losing_the_first_answer(self: BusStore, stream: str, entry_id: str, **options: Any) -> bool:
        first = await finish(self, stream, entry_id, **options)  # the script ran: reply written, job acked
        if options["done_id"] == "lossy" and not lost:
            lost.append(entry_id)
            raise StoreUnavailable("connection reset while reading the script's answer")
        return first

    monkeypatch.setattr(BusStore, "finish", losing_the_first_answer)
    async with running_bridge(settings), bus_client(settings) as client:
        assert (await client.request(ADDRESS, PAYLOAD, 10, job_id="fine"))["error"] is None
        assert (await client.request(ADDRESS, PAYLOAD, 10, job_id="lossy"))["error"] is None
    assert lost and standin.seen == ["fine", "lossy"]
    assert replies_per_job(redis_url, client.reply_stream) == Counter({"fine": 1, "lossy": 1})
    assert [served.job_id for served in recorded(redis_url)] == ["fine", "lossy"]


async def test_a_copy_of_a_job_older_than_its_done_key_gets_no_second_reply(
    tmp_path: Path, redis_url: str, standin: StandIn
) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    reply_stream = wire.replies_stream("old-client")
    job = signed_job(settings, "ancient", reply_stream, deadline_in=-wire.DONE_MARGIN_S - 60)
    with redis.Redis.from_url(redis_url, decode_responses=True) as sync_redis:
        sync_redis.xadd(wire.jobs_stream(ADDRESS), job)
        async with running_bridge(settings):
            await until(lambda: sync_redis.xlen(wire.jobs_stream(ADDRESS)) == 0)
        [(_id, dead)] = sync_redis.xrange(wire.DEAD_STREAM)
        assert '"reason":"stale"' in dead["job"] and sync_redis.xlen(reply_stream) == 0
    assert standin.seen == []


async def test_jobs_xadded_directly_to_an_unknown_address_before_any_bridge_ran_get_an_error_reply(
    tmp_path: Path, redis_url: str, standin: StandIn
) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    unknown, reply_stream = str(uuid.uuid4()), wire.replies_stream("direct-client")
    job = signed_job(settings, "direct", reply_stream, deadline_in=30, address=unknown)
    with redis.Redis.from_url(redis_url, decode_responses=True) as sync_redis:
        sync_redis.xadd(wire.jobs_stream(unknown), job)  # not through the client: the address is in no set
        async with running_bridge(settings, sweep_s=0.2):
            await until(lambda: sync_redis.xlen(reply_stream) == 1)
            [(_id, fields)] = sync_redis.xrange(reply_stream)
            verified = replies.verify_reply(*bus_key_from_token(TOKEN), fields)
            assert verified is not None and verified[1]["code"] == "model_not_found"
            # Answered, its stream is empty: the next sweeps forget the address.
            await until(lambda: not sync_redis.sismember(wire.ADDRESSES_KEY, unknown))
    assert standin.seen == []


async def test_an_unknown_address_whose_only_job_a_dead_bridge_holds_does_not_stall_the_sweeps(
    tmp_path: Path, redis_url: str, standin: StandIn
) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    unknown = str(uuid.uuid4())
    stream = wire.jobs_stream(unknown)
    with redis.Redis.from_url(redis_url, decode_responses=True) as sync_redis:
        sync_redis.xadd(stream, signed_job(settings, "held", wire.replies_stream("c"), deadline_in=30, address=unknown))
        sync_redis.xgroup_create(stream, wire.GROUP, id="0")
        sync_redis.xreadgroup(wire.GROUP, "a-dead-bridge", {stream: ">"})  # pending, nothing new to read
        sync_redis.sadd(wire.ADDRESSES_KEY, unknown)
        async with running_bridge(settings, sweep_s=0.2):
            await until(lambda: sync_redis.hget(wire.HANDLERS_KEY, ADDRESS) is not None)
            first = float(sync_redis.hget(wire.HANDLERS_KEY, ADDRESS) or 0)
            # The orphan sweep reads that stream without waiting (BLOCK 0 would wait forever) and the
            # heartbeat goes on, so other bridges keep seeing this one's models as served.
            await until(lambda: float(sync_redis.hget(wire.HANDLERS_KEY, ADDRESS) or 0) > first + 1.5, 10)


def start_bridge_process(
    home: Path, redis_url: str, port: int, concurrency: int, extra: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    log = home / f"bridge-{port}-{concurrency}-{uuid.uuid4().hex[:6]}.log"
    env = examlops_env(
        home,
        **(extra or {}),
        EXAMLOPS_REDIS__URL=redis_url,
        EXAMLOPS_TOKEN=TOKEN,
        EXAMLOPS_SERVING__PORT=str(port),
        EXAMLOPS_HTTP__CONNECT_TIMEOUT_S=str(FAST_HTTP.connect_timeout_s),
        EXAMLOPS_HTTP__READ_TIMEOUT_S=str(FAST_HTTP.read_timeout_s),
    )
    upgraded(env)
    code = "from examlops.cli.bus import bridge_app; bridge_app()"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, "start", "--concurrency", str(concurrency)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, log


async def wait_logged(proc: subprocess.Popen[bytes], log: Path, text: str) -> None:
    await until(lambda: proc.poll() is None and text in log.read_text(errors="replace"), 30)


async def test_a_bridge_killed_mid_job_loses_nothing_and_every_job_is_answered_once(
    tmp_path: Path, redis_url: str
) -> None:
    settings = bus_settings(tmp_path, redis_url, 1)
    with StandIn() as slow, StandIn() as fast:
        slow.delay = 1.5
        doomed, doomed_log = start_bridge_process(tmp_path, redis_url, slow.port, concurrency=2)
        survivor, survivor_log = None, None
        try:
            await wait_logged(doomed, doomed_log, "ready")
            async with bus_client(settings) as client:
                jobs = [f"job-{i}" for i in range(12)]
                waits = [asyncio.create_task(client.request(ADDRESS, PAYLOAD, 40, job_id=j)) for j in jobs[:4]]
                await until(lambda: len(slow.seen) >= 1)
                survivor, survivor_log = start_bridge_process(tmp_path, redis_url, fast.port, concurrency=64)
                await wait_logged(survivor, survivor_log, "ready")
                waits += [asyncio.create_task(client.request(ADDRESS, PAYLOAD, 40, job_id=j)) for j in jobs[4:]]
                await until(lambda: len(fast.seen) >= 2)
                os.killpg(doomed.pid, signal.SIGKILL)  # mid-job: the slow stand-in holds its calls for 1.5 s
                doomed.wait()
                replies = await asyncio.gather(*waits)
            assert [r["error"] for r in replies] == [None] * len(jobs)
            assert [r["job_id"] for r in replies] == jobs
            assert replies_per_job(redis_url, client.reply_stream) == Counter(dict.fromkeys(jobs, 1))
            # What the killed bridge held (read from the stream, posted to serving or not yet) the survivor
            # reclaimed, and every job was answered once (above): under load the kill may fall after the slow
            # stand-in answered the posts, so which jobs it saw is not asserted.
            assert "reclaimed job" in survivor_log.read_text(), "no job held by the killed bridge was reclaimed"
            with redis.Redis.from_url(redis_url) as sync_redis:
                assert sync_redis.xpending(wire.jobs_stream(ADDRESS), wire.GROUP)["pending"] == 0
        finally:
            for proc in (doomed, survivor):
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(30)
        assert survivor is not None and survivor.returncode == 0


@pytest.mark.parametrize("http_client", ["library", "aiohttp"])
async def test_jobs_survive_a_redis_restart_and_both_sides_reconnect(
    tmp_path: Path, standin: StandIn, http_client: str
) -> None:
    server = EmbeddedRedis(tmp_path / "redis", free_port())
    server.start()
    try:
        settings = bus_settings(tmp_path, server.url, standin.port, http_client)
        async with bus_client(settings) as client:
            async with running_bridge(settings):
                assert (await client.request(ADDRESS, PAYLOAD, 10, job_id="before"))["error"] is None
                standin.delay = 1.0
                in_flight = asyncio.create_task(client.request(ADDRESS, PAYLOAD, 30, job_id="across"))
                await until(lambda: "across" in standin.seen)
                server.stop()
                server.start()
                assert (await in_flight)["error"] is None  # replied once Redis was back
                standin.delay = 0.0
                assert (await client.request(ADDRESS, PAYLOAD, 10, job_id="after"))["error"] is None
            # Accepted while no bridge runs, then Redis restarts: the AOF keeps the job.
            queued = asyncio.create_task(client.request(ADDRESS, PAYLOAD, 30, job_id="queued"))
            with redis.Redis.from_url(server.url) as sync_redis:
                await until(lambda: sync_redis.xlen(wire.jobs_stream(ADDRESS)) == 1)
            server.stop()
            server.start()
            async with running_bridge(settings):
                assert (await queued)["error"] is None
        assert replies_per_job(server.url, client.reply_stream) == Counter(
            dict.fromkeys(("before", "across", "after", "queued"), 1)
        )
    finally:
        server.stop()


async def test_an_external_redis_without_an_append_only_file_is_warned_about(
    tmp_path: Path, redis_url: str, standin: StandIn, caplog: pytest.LogCaptureFixture
) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    with redis.Redis.from_url(redis_url) as sync_redis:
        sync_redis.config_set("appendonly", "no")
        try:
            async with running_bridge(settings):
                pass
        finally:
            sync_redis.config_set("appendonly", "yes")
    assert any("jobs accepted before a Redis restart can be lost" in r.message for r in caplog.records)


def test_the_sync_client_gets_a_reply(tmp_path: Path, redis_url: str, standin: StandIn) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port)

    async def serve_one() -> None:
        async with running_bridge(settings):
            await until(lambda: bool(standin.seen))
            await asyncio.sleep(0.2)

    thread = threading.Thread(target=asyncio.run, args=(serve_one(),))
    thread.start()
    with sync_bus_client(settings) as client:
        reply = client.request(JPCP.seanerbus_uuid, PAYLOAD, 10)
    thread.join(30)
    assert reply["error"] is None and reply["model"] == "JPCP"


# Against the real serving process with the demo models.


def requests_total(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("examlops_requests_total{")
    )


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from examlops.registry.demo import seed_demo
    from tests.integration.servers import ServingProcess

    home = tmp_path_factory.mktemp("bus-serving")
    seed_demo(Settings(home=home), CATALOG)
    proc = ServingProcess(home)
    try:
        proc.wait_ready(60)
        yield proc
    finally:
        proc.stop()


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning")
async def test_real_serving_answers_a_bus_job_and_never_sees_an_expired_one(
    tmp_path: Path, redis_url: str, serving: Any
) -> None:
    # The bridge presents the admin token of serving's state folder, as `exa up`'s bridge does.
    settings = bus_settings(tmp_path, redis_url, serving.port).model_copy(update={"token": SecretStr(serving.token)})
    known_token(settings, serving.token, "admin")  # the bridge's identity store must know the key it signs with
    async with bus_client(settings) as client:
        with pytest.raises(DeadlineExceeded):
            await client.request(ADDRESS, PAYLOAD, 0.2, job_id="expired")
        before = requests_total(serving.url)
        async with running_bridge(settings):
            await until(lambda: replies_per_job(redis_url, client.reply_stream)["expired"] == 1)
            assert requests_total(serving.url) == before
            reply = await client.request(ADDRESS, PAYLOAD, 10, job_id="real")
            canary = await client.request(ADDRESS, PAYLOAD | {"alias": "canary"}, 10)
    assert (reply["model"], reply["alias"], reply["version"], reply["job_id"]) == ("JPCP", "Production", "1", "real")
    assert reply["run_id"] and reply["error"] is None
    assert (canary["alias"], canary["version"]) == ("Canary", "2")
    assert requests_total(serving.url) == before + 2
