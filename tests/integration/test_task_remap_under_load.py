"""Calls by task against the real serving process: a remap under load loses no call and takes effect
within the rules TTL, with no restart and no caller change; `exa predict --task`; an unknown task."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from examlops.cli.main import app as exa
from examlops.core.settings import Settings
from examlops.registry.catalog import load_catalog
from examlops.registry.demo import seed_demo
from tests.integration.servers import ServingProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

TTL_S = 1.0
CALLS, CONCURRENCY, REMAP_AT = 300, 16, 100


@pytest.fixture(scope="module")
def platform(
    tmp_path_factory: pytest.TempPathFactory, redis_server: str
) -> Iterator[tuple[ServingProcess, dict[str, str]]]:
    home = tmp_path_factory.mktemp("tasks")
    settings = Settings(home=home)
    seed_demo(settings, load_catalog(settings.catalog_path))
    env = {
        "EXAMLOPS_REDIS__URL": redis_server,
        "EXAMLOPS_TRAFFIC__RULES_TTL_S": str(TTL_S),
        "EXAMLOPS_PREDICT__WORKERS": "2",
    }
    server = ServingProcess(home, env=env)
    try:
        server.wait_ready()
        yield server, {"EXAMLOPS_HOME": str(home), **env, "EXAMLOPS_SERVING__PORT": str(server.port)}
    finally:
        assert server.stop() == 0, server.log_tail()


@pytest.fixture
def env(platform: tuple[ServingProcess, dict[str, str]], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name, value in platform[1].items():
        monkeypatch.setenv(name, value)
    return platform[1]


def embedding(seed: int) -> list[float]:
    return [float(v) for v in np.random.default_rng(seed).normal(0, 0.05, 384)]


def task_map(runner: CliRunner, *args: str) -> dict[str, object]:
    result = runner.invoke(exa, ["task", "map", *args, "--json"])
    assert result.exit_code == 0, result.output
    data: dict[str, object] = json.loads(result.stdout)
    return data


def test_serving_maps_the_catalog_tasks_when_it_starts(env: dict[str, str]) -> None:
    listed = CliRunner().invoke(exa, ["task", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    routes = {r["task"]: (r["model"], r["alias"]) for r in json.loads(listed.stdout)}
    assert routes["pavement.distress.jpcp"] == ("JPCP", "Production")
    assert routes["pavement.distress.crcp"] == ("CRCP", "Production")
    assert routes["pavement.distress.ac"] == ("AC", "Production")


def test_a_call_by_task_names_the_task_model_alias_and_version(
    platform: tuple[ServingProcess, dict[str, str]], env: dict[str, str]
) -> None:
    server = platform[0]
    reply = httpx.post(
        f"{server.url}/v1/tasks/pavement.distress.ac/infer",
        json={"embedding": embedding(1), "node_count": 12, "job_id": "t-1"},
        headers=server.auth,
        timeout=30,
    )
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert (data["task"], data["model"], data["alias"], data["version"], data["job_id"]) == (
        "pavement.distress.ac",
        "AC",
        "Production",
        "1",
        "t-1",
    )


def test_an_unknown_task_is_a_404_naming_it_over_real_http(platform: tuple[ServingProcess, dict[str, str]]) -> None:
    reply = httpx.post(
        f"{platform[0].url}/v1/tasks/pavement.distress.nope/infer",
        json={"embedding": embedding(2), "node_count": 3},
        headers=platform[0].auth,
        timeout=30,
    )
    assert reply.status_code == 404
    assert reply.json()["code"] == "unknown_task" and "pavement.distress.nope" in reply.json()["error"]


def test_exa_predict_by_task(platform: tuple[ServingProcess, dict[str, str]], env: dict[str, str]) -> None:
    runner = CliRunner()
    url = platform[0].url
    result = runner.invoke(
        exa, ["predict", "--task", "pavement.distress.crcp", "--random", "--node-count", "4", "--url", url, "--json"]
    )
    assert result.exit_code == 0, result.output
    reply = json.loads(result.stdout)
    assert (reply["task"], reply["model"]) == ("pavement.distress.crcp", "CRCP")
    unknown = runner.invoke(exa, ["predict", "--task", "no.such.task", "--random", "--node-count", "4", "--url", url])
    assert unknown.exit_code == 4 and "no.such.task" in unknown.output
    both = runner.invoke(exa, ["predict", "JPCP", "--task", "x", "--random", "--node-count", "4", "--url", url])
    assert both.exit_code == 2


@dataclass(frozen=True)
class Call:
    started: float
    ended: float
    status: int
    body: dict[str, object]


@dataclass
class Remap:
    """When the remap was asked for (the load sets ``asked``), began and was stored (monotonic seconds)."""

    asked: asyncio.Event = field(default_factory=asyncio.Event)
    begun: asyncio.Event = field(default_factory=asyncio.Event)
    stored: asyncio.Event = field(default_factory=asyncio.Event)
    begun_at: float = 0.0
    stored_at: float = 0.0


async def load_with_a_remap(url: str, auth: dict[str, str], remap: Remap) -> list[Call]:
    """``CALLS`` calls to one task at ``CONCURRENCY``: the remap is asked for once ``REMAP_AT`` calls have
    started (so calls are in flight across it); the next ``REMAP_AT`` are spread over the TTL after it
    began; the rest start once the TTL has passed since it was stored."""
    calls: list[Call] = []
    started = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal started
        while started < CALLS:
            n = started = started + 1
            if n == REMAP_AT:
                remap.asked.set()
            if REMAP_AT < n <= 2 * REMAP_AT:
                await remap.begun.wait()
                await asyncio.sleep(max(0.0, remap.begun_at + TTL_S * (n - REMAP_AT) / REMAP_AT - time.monotonic()))
            elif n > 2 * REMAP_AT:
                await remap.stored.wait()
                await asyncio.sleep(max(0.0, remap.stored_at + TTL_S + 0.05 - time.monotonic()))
            t0 = time.monotonic()
            reply = await client.post(
                f"{url}/v1/tasks/test.remap/infer", json={"embedding": embedding(n), "node_count": 1 + n % 40}
            )
            calls.append(Call(t0, time.monotonic(), reply.status_code, reply.json()))

    limits = httpx.Limits(max_connections=CONCURRENCY)
    async with httpx.AsyncClient(timeout=30, limits=limits, headers=auth) as client:
        await asyncio.gather(*(worker(client) for _ in range(CONCURRENCY)))
    return calls


async def test_a_remap_under_load_loses_no_call_and_applies_within_the_ttl(
    platform: tuple[ServingProcess, dict[str, str]], env: dict[str, str]
) -> None:
    runner = CliRunner()
    first = task_map(runner, "test.remap", "JPCP")
    await asyncio.sleep(TTL_S + 0.1)  # serving may hold a snapshot read before the task existed
    remap = Remap()

    async def remapper() -> dict[str, object]:
        await remap.asked.wait()
        remap.begun_at = time.monotonic()
        remap.begun.set()
        moved = await asyncio.to_thread(task_map, runner, "test.remap", "CRCP")  # `exa task map`, as an operator
        remap.stored_at = time.monotonic()
        remap.stored.set()
        return moved

    moving = asyncio.create_task(remapper())
    calls = await load_with_a_remap(platform[0].url, platform[0].auth, remap)
    moved = await moving

    assert moved["address"] == first["address"] and moved["model"] == "CRCP"
    assert len(calls) == CALLS
    assert [(c.status, c.body) for c in calls if c.status != 200] == []
    assert {c.body["task"] for c in calls} == {"test.remap"}
    before = [c for c in calls if c.ended < remap.begun_at]
    after = [c for c in calls if c.started >= remap.stored_at + TTL_S]
    assert before and {c.body["model"] for c in before} == {"JPCP"}
    assert len(after) >= CALLS - 2 * REMAP_AT
    assert {c.body["model"] for c in after} == {"CRCP"}
    assert [c for c in calls if c.started < remap.begun_at < c.ended], "no call was in flight when the remap began"
