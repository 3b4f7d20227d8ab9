"""Who may use the bus, against a real redis-server: signed jobs, signed replies, revocation, task addresses.

The attacks of issue 16 are replayed here as an attacker with write access to Redis would run them: a
tampered copy of each real job, and a forged reply on each client's reply stream. The bridge's identities
are an in-test implementation of its ``BusKeys`` port (``Identities``) over a dict the tests change; the
identity store's resolver takes its place in ``bootstrap.bus_keys`` (to run these tests on it, give
``running_bridge`` that instead as ``keys=``). The task map is the real one, in SQL
(``bootstrap.task_addresses``); ``Tasks``, a dict, only splits tasks between bridges.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
import redis

from examlops.bootstrap import sql_engine
from examlops.bootstrap.bridge import bus_client, task_addresses
from examlops.bus import wire
from examlops.core.errors import DeadlineExceeded, Forbidden
from examlops.core.settings import Settings, TrafficSettings
from examlops.identity import bus_key_from_token
from examlops.tasks.sql import SqlTaskMap
from tests.integration.test_bus_bridge import (
    ADDRESS,
    CATALOG,
    PAYLOAD,
    StandIn,
    bus_settings,
    recorded,
    redis_url,
    replies_per_job,
    running_bridge,
    standin,
    until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

__all__ = ["redis_url", "standin"]  # the fixtures


def new_token() -> str:
    return f"exa_{secrets.token_hex(8)}_{secrets.token_urlsafe(32)}"


@dataclass
class Identity:
    """One identity of ``Identities``: ``models``/``tasks`` empty means every one."""

    name: str
    revoked: bool = False
    models: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()

    def may_call(self, *, task: str | None = None, model: str | None = None) -> None:
        if task is not None and self.tasks and task not in self.tasks:
            raise Forbidden(f"identity {self.name!r} lacks the permission 'call' on task {task!r}", permission="call")
        if model is not None and self.models and model not in self.models:
            raise Forbidden(f"identity {self.name!r} lacks 'call' on model {model!r}", permission="call")


@dataclass
class Identities:
    """``bus.ports.BusKeys`` over a dict of key id -> (identity, bus key), cached for ``ttl_s`` per key id
    as the identity store's resolver is: a change to the dict shows within the TTL."""

    ttl_s: float
    keys: dict[str, tuple[Identity, bytes]] = field(default_factory=dict)
    _cache: dict[str, tuple[float, tuple[Identity, bytes] | None]] = field(default_factory=dict)

    def add(self, identity: Identity) -> str:
        token = new_token()
        key_id, key = bus_key_from_token(token)
        self.keys[key_id] = (identity, key)
        return token

    def bus_key(self, key_id: str) -> tuple[Identity, bytes] | None:
        now = time.monotonic()
        cached = self._cache.get(key_id)
        if cached is None or cached[0] <= now:
            found = self.keys.get(key_id)
            # A copy, so that changing the dict's identity shows only when the cache is read again.
            cached = (now + self.ttl_s, None if found is None else (Identity(**vars(found[0])), found[1]))
            self._cache[key_id] = cached
        return cached[1]


@dataclass(frozen=True)
class Route:
    task: str
    model: str
    alias: str
    address: uuid.UUID


@dataclass
class Tasks:
    """``bus.ports.TaskAddresses`` over a dict of task -> route."""

    routes_by_task: dict[str, Route] = field(default_factory=dict)

    def routes(self) -> list[Route]:
        return list(self.routes_by_task.values())


def settings_with_ttl(tmp_path: Path, redis_url: str, standin: StandIn, ttl_s: float) -> Settings:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    return settings.model_copy(update={"traffic": TrafficSettings(rules_ttl_s=ttl_s)})


async def test_a_tampered_copy_of_each_real_job_is_dead_lettered_and_every_real_job_gets_its_prediction(
    tmp_path: Path, redis_url: str, standin: StandIn
) -> None:
    """Issue 16: re-adding each real job with node_count 12 -> 13 made the bridge answer bad_signature at the
    real job's id and reply stream (29 of 30 callers got it; one job id collected 5 replies)."""
    settings = bus_settings(tmp_path, redis_url, standin.port)
    standin.delay = 0.2  # the real answers come after the copies are refused
    stream = wire.jobs_stream(ADDRESS)
    jobs = [f"real-{i}" for i in range(30)]
    clients = [bus_client(settings) for _ in jobs]
    try:
        waits = [
            asyncio.create_task(client.request(ADDRESS, PAYLOAD, 20, job_id=job))
            for client, job in zip(clients, jobs, strict=True)
        ]
        with redis.Redis.from_url(redis_url, decode_responses=True) as attacker:
            await until(lambda: attacker.xlen(stream) == len(jobs))  # no bridge runs yet
            copies = 0
            for _id, fields in attacker.xrange(stream):
                altered = fields | {"payload": fields["payload"].replace('"node_count":12', '"node_count":13')}
                for _ in range(5 if fields["job_id"] == "real-0" else 1):
                    attacker.xadd(stream, altered)
                    copies += 1
            async with running_bridge(settings):
                replies = await asyncio.gather(*waits)
                await until(lambda: attacker.xlen(wire.DEAD_STREAM) == copies)
            dead = [orjson.loads(f["job"]) for _id, f in attacker.xrange(wire.DEAD_STREAM)]
    finally:
        for client in clients:
            await client.close()
    assert [(r["job_id"], r["prediction"], r["error"]) for r in replies] == [(j, 0.5, None) for j in jobs]
    for client, job in zip(clients, jobs, strict=True):
        assert replies_per_job(redis_url, client.reply_stream) == Counter({job: 1})
    assert Counter(d["reason"] for d in dead) == Counter({"bad_signature": copies})
    assert sorted(standin.seen) == sorted(jobs)
    assert sorted(r.job_id for r in recorded(redis_url)) == sorted(jobs)


async def test_a_forged_reply_on_every_clients_stream_is_ignored_counted_and_the_real_one_taken(
    tmp_path: Path, redis_url: str, standin: StandIn
) -> None:
    """Issue 16: a process that can write to Redis put a reply with prediction 999.0 on 30 jobs' reply
    streams, and 28 of 30 clients took it."""
    settings = bus_settings(tmp_path, redis_url, standin.port)
    standin.delay = 0.5  # the jobs are in flight while the forger writes
    jobs = [f"job-{i}" for i in range(30)]
    clients = [bus_client(settings) for _ in jobs]
    try:
        async with running_bridge(settings):
            waits = [
                asyncio.create_task(client.request(ADDRESS, PAYLOAD, 20, job_id=job))
                for client, job in zip(clients, jobs, strict=True)
            ]
            await until(lambda: len(standin.seen) == len(jobs))
            with redis.Redis.from_url(redis_url, decode_responses=True) as forger:
                for client, job in zip(clients, jobs, strict=True):
                    body: dict[str, object] = {
                        "model": "JPCP",
                        "alias": "Production",
                        "version": "1",
                        "run_id": "run-1",
                    }
                    body |= {"prediction": 999.0, "error": None, "job_id": job}
                    forged = {"job_id": job, "status": "200", "body": orjson.dumps(body).decode()}
                    forged |= {"key": client.key_id, "sig": secrets.token_hex(32)}
                    forger.xadd(client.reply_stream, forged)
            replies = await asyncio.gather(*waits)
    finally:
        for client in clients:
            await client.close()
    assert [(r["job_id"], r["prediction"]) for r in replies] == [(job, 0.5) for job in jobs]
    assert [client.unverified_replies for client in clients] == [1] * len(jobs)


async def test_jobs_are_served_as_their_identity_and_refused_without_permission_or_an_known_key(
    tmp_path: Path, redis_url: str, standin: StandIn
) -> None:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    identities = Identities(ttl_s=30)
    robot = identities.add(Identity("robot-7"))
    crcp_only = identities.add(Identity("crcp-app", models=("CRCP",)))
    stranger = new_token()  # well formed, in no identity's keys
    async with (
        running_bridge(settings, keys=identities),
        bus_client(settings, token=robot) as robot_client,
        bus_client(settings, token=crcp_only) as crcp_client,
        bus_client(settings, token=stranger) as stranger_client,
    ):
        served = await robot_client.request(ADDRESS, PAYLOAD, 10, job_id="robot-job")
        refused = await crcp_client.request(ADDRESS, PAYLOAD, 10, job_id="crcp-job")
        with pytest.raises(DeadlineExceeded):
            await stranger_client.request(ADDRESS, PAYLOAD, 1, job_id="stranger-job")
        with redis.Redis.from_url(redis_url, decode_responses=True) as sync_redis:
            await until(lambda: sync_redis.xlen(wire.DEAD_STREAM) == 1)
            [(_id, dead)] = sync_redis.xrange(wire.DEAD_STREAM)
            assert sync_redis.xlen(stranger_client.reply_stream) == 0
    assert served["error"] is None and served["prediction"] == 0.5
    assert (refused["code"], refused["prediction"], refused["model"]) == ("forbidden", 0.0, "JPCP")
    assert "crcp-app" in refused["error"]
    assert orjson.loads(dead["job"])["reason"] == "unknown_key"
    assert standin.seen == ["robot-job"] and standin.identities == ["robot-7"]
    assert [(r.job_id, r.caller) for r in recorded(redis_url)] == [("robot-job", "robot-7")]


async def test_revoking_an_identity_stops_its_jobs_within_the_ttl_with_an_unauthenticated_reply(
    tmp_path: Path, redis_url: str, standin: StandIn
) -> None:
    ttl_s = 1.0
    settings = settings_with_ttl(tmp_path, redis_url, standin, ttl_s)
    identities = Identities(ttl_s=ttl_s)
    token = identities.add(Identity("robot-7"))
    key_id, _ = bus_key_from_token(token)
    replies: list[tuple[float, str | None]] = []
    async with running_bridge(settings, keys=identities), bus_client(settings, token=token) as client:
        assert (await client.request(ADDRESS, PAYLOAD, 10, job_id="before"))["error"] is None
        identities.keys[key_id][0].revoked = True
        revoked_at = time.monotonic()
        for i in range(200):
            reply = await client.request(ADDRESS, PAYLOAD, 10, job_id=f"after-{i}")
            replies.append((time.monotonic() - revoked_at, reply["code"] if reply["error"] else None))
            if time.monotonic() - revoked_at > ttl_s + 1.0:
                break
            await asyncio.sleep(0.05)
    refused = [(at, code) for at, code in replies if code is not None]
    assert refused and {code for _, code in refused} == {"unauthenticated"}
    assert refused[0][0] <= ttl_s + 0.5  # within the TTL (and a job's round trip)
    first = replies.index(refused[0])
    assert all(code == "unauthenticated" for _, code in replies[first:])  # never served again
    served = {f"after-{i}" for i, (_, code) in enumerate(replies) if code is None}
    assert set(standin.seen) == {"before"} | served
    assert {r.job_id for r in recorded(redis_url)} == {"before"} | served  # refusals are never recorded


async def test_a_tasks_address_is_served_as_the_task_and_a_remap_under_load_fails_no_job(
    tmp_path: Path, redis_url: str, standin: StandIn
) -> None:
    ttl_s = 0.5
    settings = settings_with_ttl(tmp_path, redis_url, standin, ttl_s)
    task = "pavement.distress.test"
    engine = sql_engine(settings)
    task_map = SqlTaskMap(engine)
    address = task_map.map(task, "JPCP", "Production").route.address
    standin.task_models[task] = "JPCP"
    identities = Identities(ttl_s=30)
    token = identities.add(Identity("robot-7", tasks=(task,)))
    other = identities.add(Identity("other-app", tasks=("another.task",)))
    standin.delay = 0.2
    async with (
        running_bridge(settings, keys=identities, tasks=task_addresses(settings), sweep_s=0.1),
        bus_client(settings, token=token) as client,
        bus_client(settings, token=other) as other_client,
    ):
        first = await client.request(address, PAYLOAD, 10, job_id="task-0")
        denied = await other_client.request(address, PAYLOAD, 10, job_id="denied")
        before = [asyncio.create_task(client.request(address, PAYLOAD, 20, job_id=f"a-{i}")) for i in range(20)]
        await until(lambda: len(standin.seen) >= 10)
        task_map.map(task, "CRCP", "Production")  # in flight: the remap (the address stays)
        standin.task_models[task] = "CRCP"
        after: list[asyncio.Task[dict[str, object]]] = []
        for i in range(20):
            after.append(asyncio.create_task(client.request(address, PAYLOAD, 20, job_id=f"b-{i}")))
            await asyncio.sleep(0.1)
        await asyncio.sleep(ttl_s + 0.3)
        last = await client.request(address, PAYLOAD, 10, job_id="task-last")
        replies = await asyncio.gather(*before, *after)
    engine.dispose()
    assert (first["task"], first["model"], first["prediction"], first["error"]) == (task, "JPCP", 0.5, None)
    assert (denied["code"], denied["task"]) == ("forbidden", task)
    assert all(r["error"] is None and r["task"] == task for r in replies)
    assert (last["task"], last["model"]) == (task, "CRCP")
    assert set(standin.tasks) == {task} and "denied" not in standin.seen
    models = {r.job_id: r.model for r in recorded(redis_url)}
    assert models["task-0"] == "JPCP" and models["task-last"] == "CRCP"
    assert {r.address for r in recorded(redis_url)} == {str(address)}


async def test_a_task_whose_model_is_not_in_the_bridges_catalog_is_left_to_other_bridges(
    tmp_path: Path, redis_url: str, standin: StandIn
) -> None:
    settings = settings_with_ttl(tmp_path, redis_url, standin, 0.5)
    task, address = "pavement.distress.crcp", uuid.uuid4()
    tasks = Tasks({task: Route(task, "CRCP", "Production", address)})
    standin.task_models[task] = "CRCP"
    async with (
        running_bridge(settings, CATALOG.only(["JPCP"]), tasks=tasks, sweep_s=0.2) as jpcp_bridge,
        running_bridge(settings, CATALOG.only(["CRCP"]), tasks=tasks, sweep_s=0.2) as crcp_bridge,
        bus_client(settings) as client,
    ):
        reply = await client.request(address, PAYLOAD, 10, job_id="crcp-task")
        assert jpcp_bridge.addresses.handler_of(str(address)) is None
        assert crcp_bridge.addresses.handler_of(str(address)) is not None
    assert (reply["task"], reply["model"], reply["error"]) == (task, "CRCP", None)


async def test_exa_bus_send_task_sends_to_the_tasks_address_and_prints_the_reply_naming_it(
    tmp_path: Path, redis_url: str, standin: StandIn
) -> None:
    from typer.testing import CliRunner

    from examlops.cli.main import app

    settings = bus_settings(tmp_path, redis_url, standin.port)
    engine = sql_engine(settings)
    SqlTaskMap(engine).map("pavement.distress.cli", "JPCP", "Production")
    engine.dispose()
    standin.task_models["pavement.distress.cli"] = "JPCP"
    assert settings.token is not None
    env = {"EXAMLOPS_HOME": str(tmp_path), "EXAMLOPS_REDIS__URL": redis_url}
    env["EXAMLOPS_TOKEN"] = settings.token.get_secret_value()
    argv = ["bus", "send", "--task", "Pavement.Distress.CLI", "--random", "--node-count", "7", "--json"]
    async with running_bridge(settings, tasks=task_addresses(settings)):
        result = await asyncio.to_thread(CliRunner().invoke, app, argv, env=env)
    assert result.exit_code == 0, result.output
    reply = orjson.loads(result.stdout)
    assert (reply["task"], reply["model"], reply["error"]) == ("pavement.distress.cli", "JPCP", None)
    assert standin.tasks == ["pavement.distress.cli"] and standin.identities == ["admin"]
