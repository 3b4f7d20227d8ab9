"""The bus half of issue 16's permission matrix, revocation and rotation, on the real identity store
(SQLite, and Postgres for the matrix) and a real redis-server.

Identities are made with ``IdentityService`` (or `exa identity`) in the test's SQL; bridges verify jobs with
``bootstrap.bus_keys``, the identity store's resolver, cached ``auth.cache_ttl_s``. Serving is the stand-in
of ``test_bus_bridge``, so a test sees exactly which jobs reached it; a real recorder then drains what the
bridge recorded into audit events and failure windows.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from pydantic import SecretStr

from examlops.adapters.redis import connect
from examlops.bootstrap import sql_engine, upgrade_database
from examlops.bootstrap.bridge import bus_client
from examlops.bootstrap.clients import bus_redis
from examlops.bootstrap.identity import identity_service
from examlops.bus import wire
from examlops.bus.store import BusStore
from examlops.core.settings import AuthSettings, FailureSettings, RedisSettings, ServingSettings, Settings
from examlops.identity import bus_key_from_token, parse_token
from examlops.monitoring.failure_store import RedisFailureStore
from examlops.monitoring.failures import FailureTracker
from examlops.tasks.sql import SqlTaskMap
from tests.integration.servers import known_token
from tests.integration.test_bus_auth import add_identity
from tests.integration.test_bus_bridge import (
    ADDRESS,
    FAST_HTTP,
    PAYLOAD,
    TOKEN,
    StandIn,
    recorded,
    redis_url,
    running_bridge,
    standin,
    until,
)
from tests.integration.test_recording import drain, recorder_on, served_events

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

__all__ = ["redis_url", "standin"]  # the fixtures

TASK = "pavement.distress.matrix"
WINDOW = FailureSettings().window


def site_settings(
    home: Path, redis_url: str, standin: StandIn, database_url: str | None = None, *, cache_ttl_s: float = 30.0
) -> Settings:
    """Settings on the test's SQL (``database_url``, default SQLite under ``home``) upgraded as `exa up` does,
    where ``TOKEN`` is an admin's; ``TASK`` is mapped to JPCP."""
    settings = Settings(
        home=home,
        redis=RedisSettings(url=redis_url),
        serving=ServingSettings(port=standin.port),
        http=FAST_HTTP,
        token=SecretStr(TOKEN),
        database_url=database_url,
        auth=AuthSettings(cache_ttl_s=cache_ttl_s),
    )
    upgrade_database(settings)
    known_token(settings, TOKEN)
    engine = sql_engine(settings)
    try:
        SqlTaskMap(engine).map(TASK, "JPCP", "Production")
    finally:
        engine.dispose()
    standin.task_models[TASK] = "JPCP"
    return settings


def task_address(settings: Settings) -> str:
    engine = sql_engine(settings)
    try:
        route = SqlTaskMap(engine).get(TASK)
    finally:
        engine.dispose()
    assert route is not None
    return str(route.address)


async def send_signed(settings: Settings, address: str, key_id: str, key: bytes, job_id: str) -> str:
    """Put one job signed with ``key`` under ``key_id`` on ``address``'s stream, as a client would; the reply
    stream it names."""
    reply_to = wire.replies_stream(f"raw-{job_id}")
    fields = wire.encode_job(
        key_id, key, address=address, job_id=job_id, reply_to=reply_to, deadline=time.time() + 10, payload=PAYLOAD
    )
    store = BusStore(bus_redis(settings))
    try:
        await store.submit(address, fields)
    finally:
        await store.aclose()
    return reply_to


def everything_in(redis_url: str) -> str:
    """Every key name and value in Redis, as text: streams, strings, hashes, sets and lists."""
    parts: list[str] = []
    with connect(redis_url) as client:
        for key in client.scan_iter():
            parts.append(key)
            kind = client.type(key)
            value: Any = {
                "stream": lambda k: client.xrange(k),
                "string": lambda k: client.get(k),
                "hash": lambda k: client.hgetall(k),
                "set": lambda k: client.smembers(k),
                "zset": lambda k: client.zrange(k, 0, -1),
                "list": lambda k: client.lrange(k, 0, -1),
            }[kind](key)
            parts.append(repr(value))
    return "\n".join(parts)


def drained(redis_url: str) -> tuple[list[str], int]:
    """A real recorder drains the records stream: the job ids of the ``inference.served`` audit events, and
    how many replies JPCP's failure window holds."""
    with connect(redis_url) as client:
        drain(recorder_on(client, "matrix", tracker=FailureTracker(RedisFailureStore(client), FailureSettings())))
        return [e["job_id"] for e in served_events(client)], RedisFailureStore(client).window("JPCP", WINDOW).size


@pytest.mark.parametrize("kind", ["model", "task"])
async def test_every_refused_bus_job_gets_its_documented_outcome_and_is_never_served_recorded_or_counted(
    tmp_path: Path, redis_url: str, standin: StandIn, database_url: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    settings = site_settings(tmp_path, redis_url, standin, database_url)
    address = ADDRESS if kind == "model" else task_address(settings)
    tokens = {
        "robot-7": add_identity(settings, "robot-7", tasks=(TASK,), models=("JPCP",)),
        "retired-app": add_identity(settings, "retired-app", tasks=(TASK,), models=("JPCP",)),
        "crcp-app": add_identity(settings, "crcp-app", models=("CRCP",)),
    }
    if kind == "task":  # a model's address names no task: a task list narrows only calls of tasks
        tokens["other-task-app"] = add_identity(settings, "other-task-app", tasks=("another.task",))
    with identity_service(settings) as service:
        service.revoke("retired-app")
    stranger_key_id, stranger_key = bus_key_from_token(f"exa_{secrets.token_hex(8)}_{secrets.token_urlsafe(32)}")
    robot_key_id, _ = bus_key_from_token(tokens["robot-7"])
    _, wrong_key = bus_key_from_token(f"exa_{robot_key_id}_{secrets.token_urlsafe(32)}")  # not robot-7's secret
    async with running_bridge(settings, task_map=True, sweep_s=0.2):
        replies: dict[str, dict[str, Any]] = {}
        for name, token in tokens.items():
            async with bus_client(settings, token=token) as client:
                replies[name] = await client.request(address, PAYLOAD, 10, job_id=f"{name}-job")
        silent = {
            "unknown-key": await send_signed(settings, address, stranger_key_id, stranger_key, "unknown-key-job"),
            "bad-signature": await send_signed(settings, address, robot_key_id, wrong_key, "bad-signature-job"),
        }
        with redis.Redis.from_url(redis_url, decode_responses=True) as sync_redis:
            await until(lambda: sync_redis.xlen(wire.DEAD_STREAM) == len(silent))
            dead = {
                orjson.loads(f["job"])["fields"]["job_id"]: orjson.loads(f["job"])
                for _id, f in sync_redis.xrange(wire.DEAD_STREAM)
            }
            await asyncio.sleep(0.5)  # time for anything a bridge should never write
            assert [sync_redis.xlen(stream) for stream in silent.values()] == [0, 0]  # no reply
            assert sync_redis.exists(*(wire.done_key(f"{name}-job") for name in silent)) == 0  # nor done key
        records = recorded(redis_url)

    def outcome(name: str) -> tuple[str | None, float]:
        return replies[name]["code"] if replies[name]["error"] else None, replies[name]["prediction"]

    assert outcome("robot-7") == (None, 0.5)
    assert outcome("retired-app") == ("unauthenticated", 0.0)
    forbidden = ["crcp-app"] + (["other-task-app"] if kind == "task" else [])
    for name in forbidden:
        assert outcome(name) == ("forbidden", 0.0)
        assert replies[name]["permission"] == "call" and f"identity {name!r}" in replies[name]["error"]
    assert "model 'JPCP'" in replies["crcp-app"]["error"]  # the task's model, for a task's address
    if kind == "task":
        assert "task 'pavement.distress.matrix'" in replies["other-task-app"]["error"]
        assert all(reply["task"] == TASK for name, reply in replies.items() if name != "retired-app")
    assert replies["retired-app"]["model"] is None  # unauthenticated: nothing about the address's model
    assert {job: d["reason"] for job, d in dead.items()} == {
        "unknown-key-job": "unknown_key",
        "bad-signature-job": "bad_signature",
    }
    # Only the permitted job reached serving, was recorded, audited and counted in the failure window.
    assert standin.seen == ["robot-7-job"] and standin.identities == ["robot-7"]
    assert [(r.job_id, r.caller) for r in records] == [("robot-7-job", "robot-7")]
    assert drained(redis_url) == (["robot-7-job"], 1)
    # No token's secret (nor its bus key) is in the bridge's log, a dead letter, a reply or anywhere in Redis.
    stored = everything_in(redis_url)
    for token in [*tokens.values(), TOKEN]:
        secret, bus_key = parse_token(token)[1], bus_key_from_token(token)[1].hex()
        assert secret not in caplog.text and secret not in stored
        assert bus_key not in caplog.text and bus_key not in stored


async def test_revoking_an_identity_with_exa_identity_revoke_stops_its_jobs_within_the_ttl(
    tmp_path: Path, redis_url: str, standin: StandIn
) -> None:
    from typer.testing import CliRunner

    from examlops.cli.main import app

    ttl_s = 1.0
    settings = site_settings(tmp_path, redis_url, standin, cache_ttl_s=ttl_s)
    token = add_identity(settings, "robot-7", tasks=(TASK,))
    env = {"EXAMLOPS_HOME": str(tmp_path), "EXAMLOPS_REDIS__URL": redis_url, "EXAMLOPS_TOKEN": TOKEN}
    replies: list[tuple[float, str | None]] = []
    address = task_address(settings)
    async with (
        running_bridge(settings, task_map=True, sweep_s=0.2),
        bus_client(settings, token=token) as client,
    ):
        assert (await client.request(address, PAYLOAD, 10, job_id="before"))["error"] is None
        result = await asyncio.to_thread(CliRunner().invoke, app, ["identity", "revoke", "robot-7", "--json"], env=env)
        assert result.exit_code == 0, result.output
        revoked_at = time.monotonic()
        for i in range(200):
            reply = await client.request(address, PAYLOAD, 10, job_id=f"after-{i}")
            replies.append((time.monotonic() - revoked_at, reply["code"] if reply["error"] else None))
            if time.monotonic() - revoked_at > ttl_s + 1.0:
                break
            await asyncio.sleep(0.05)
        records = recorded(redis_url)
    refused = [(at, code) for at, code in replies if code is not None]
    assert refused and {code for _, code in refused} == {"unauthenticated"}
    assert refused[0][0] <= ttl_s + 0.5  # within the TTL (and a job's round trip)
    first = replies.index(refused[0])
    assert all(code == "unauthenticated" for _, code in replies[first:])  # never served again
    served = {f"after-{i}" for i, (_, code) in enumerate(replies) if code is None}
    assert set(standin.seen) == {"before"} | served
    assert {r.job_id for r in records} == {"before"} | served  # refusals are never recorded
    audited, window = drained(redis_url)
    assert set(audited) == {"before"} | served and window == len(served) + 1


async def test_a_rotated_identitys_old_token_works_on_the_bus_through_its_grace_and_stops_after(
    tmp_path: Path, redis_url: str, standin: StandIn
) -> None:
    ttl_s, grace_s = 0.5, 2.0
    settings = site_settings(tmp_path, redis_url, standin, cache_ttl_s=ttl_s)
    old = add_identity(settings, "robot-7", tasks=(TASK,), models=("JPCP",))
    old_replies: list[tuple[float, str | None]] = []
    async with running_bridge(settings), bus_client(settings, token=old) as old_client:
        assert (await old_client.request(ADDRESS, PAYLOAD, 10, job_id="old-before"))["error"] is None
        with identity_service(settings) as service:
            issued, _ = service.rotate("robot-7", grace_s)
        rotated_at = time.monotonic()
        async with bus_client(settings, token=issued.token) as new_client:
            i = 0
            while (since := time.monotonic() - rotated_at) < grace_s + ttl_s + 1.0:
                reply = await old_client.request(ADDRESS, PAYLOAD, 10, job_id=f"old-{i}")
                old_replies.append((since, reply["code"] if reply["error"] else None))
                assert (await new_client.request(ADDRESS, PAYLOAD, 10, job_id=f"new-{i}"))["error"] is None
                i += 1
                await asyncio.sleep(0.1)
    during = [code for since, code in old_replies if since < grace_s - 0.3]
    # The resolver read the key's end within the TTL, long before the grace ends: it then holds to the second.
    after = [code for since, code in old_replies if since > grace_s + 0.2]
    assert during and all(code is None for code in during)  # the grace: both tokens work
    assert after and all(code == "unauthenticated" for code in after)  # then only the new one
    refused = {f"old-{i}" for i, (_, code) in enumerate(old_replies) if code is not None}
    assert not refused & set(standin.seen)
    records = recorded(redis_url)
    assert {r.caller for r in records} == {"robot-7"} and {r.job_id for r in records} == set(standin.seen)
