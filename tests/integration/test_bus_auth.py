"""Who may use the bus, against a real redis-server and the real identity store: signed jobs, signed replies,
task addresses.

The attacks of issue 16 are replayed here as an attacker with write access to Redis would run them: a
tampered copy of each real job, and a forged reply on each client's reply stream. Identities are made with
``IdentityService`` in the test's SQL and bridges verify with ``bootstrap.bus_keys`` (the identity store's
resolver); the task map is the real one too (``bootstrap.task_addresses``), and ``Tasks``, a dict, only
splits tasks between bridges. The permission matrix, revocation and rotation are in
``test_bus_permissions``.
"""

from __future__ import annotations

import asyncio
import secrets
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
import redis

from examlops.bootstrap import sql_engine
from examlops.bootstrap.bridge import bus_client
from examlops.bootstrap.identity import identity_service
from examlops.bus import wire
from examlops.core.settings import Settings, TrafficSettings
from examlops.identity import Role
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


@dataclass(frozen=True)
class Route:
    task: str
    model: str
    alias: str
    address: uuid.UUID
    budget_ms: float | None = None


@dataclass
class Tasks:
    """``bus.ports.TaskAddresses`` over a dict of task -> route."""

    routes_by_task: dict[str, Route] = field(default_factory=dict)

    def routes(self) -> list[Route]:
        return list(self.routes_by_task.values())


def settings_with_ttl(tmp_path: Path, redis_url: str, standin: StandIn, ttl_s: float) -> Settings:
    settings = bus_settings(tmp_path, redis_url, standin.port)
    return settings.model_copy(update={"traffic": TrafficSettings(rules_ttl_s=ttl_s)})


def add_identity(
    settings: Settings, name: str, role: Role = Role.CALLER, *, tasks: Sequence[str] = (), models: Sequence[str] = ()
) -> str:
    """A new identity in the settings' SQL, as `exa identity add` makes it; its token."""
    with identity_service(settings) as service:
        return service.add(name, role, tasks=tasks, models=models)[1].token


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
    token = add_identity(settings, "robot-7", tasks=(task,))
    other = add_identity(settings, "other-app", tasks=("another.task",))
    standin.delay = 0.2
    async with (
        running_bridge(settings, task_map=True, sweep_s=0.1),
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
    async with running_bridge(settings, task_map=True):
        result = await asyncio.to_thread(CliRunner().invoke, app, argv, env=env)
    assert result.exit_code == 0, result.output
    reply = orjson.loads(result.stdout)
    assert (reply["task"], reply["model"], reply["error"]) == ("pavement.distress.cli", "JPCP", None)
    assert standin.tasks == ["pavement.distress.cli"] and standin.identities == ["tests"]
