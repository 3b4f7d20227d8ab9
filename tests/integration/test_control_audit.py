"""Control actions are audit events: traffic changes, alias moves, reloads and refused reloads, for real; a
traffic change whose event cannot be written (Redis paused, as an operator's audit found) changes nothing."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from examlops.cli.main import app as exa
from examlops.core.settings import Settings
from examlops.platform.redis_server import EmbeddedRedis
from examlops.registry.catalog import load_catalog
from examlops.registry.demo import seed_demo
from tests.integration.servers import ServingProcess
from tests.ports import free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


@pytest.fixture(scope="module")
def platform(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ServingProcess, dict[str, str], EmbeddedRedis]]:
    home = tmp_path_factory.mktemp("control")
    redis = EmbeddedRedis(home / "redis", free_port())
    redis.start()
    settings = Settings(home=home)
    seed_demo(settings, load_catalog(settings.catalog_path))
    env = {"EXAMLOPS_REDIS__URL": redis.url, "EXAMLOPS_PREDICT__WORKERS": "1"}
    server = ServingProcess(home, env=env)
    try:
        server.wait_ready()
        yield server, {"EXAMLOPS_HOME": str(home), **env, "EXAMLOPS_SERVING__PORT": str(server.port)}, redis
    finally:
        server.stop()
        redis.stop()


def audit_events(runner: CliRunner, env: dict[str, str]) -> list[dict[str, object]]:
    tail = runner.invoke(exa, ["audit", "tail", "-n", "50", "--json"], env=env)
    assert tail.exit_code == 0, tail.output
    events: list[dict[str, object]] = json.loads(tail.stdout)
    return events


def test_traffic_changes_promotions_and_reloads_land_on_a_verified_audit_trail(
    platform: tuple[ServingProcess, dict[str, str], EmbeddedRedis], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    server, env, _ = platform
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    runner = CliRunner()

    split = httpx.put(
        f"{server.url}/v1/traffic/JPCP", json={"Production": 90, "Canary": 10}, timeout=30, headers=server.auth
    )
    assert split.status_code == 200, split.text
    promoted = runner.invoke(exa, ["promote", "AC", "--alias", "Production", "--from", "Canary", "--json"], env=env)
    assert promoted.exit_code == 0, promoted.output
    rolled_back = runner.invoke(exa, ["rollback", "AC", "--json"], env=env)
    assert rolled_back.exit_code == 0, rolled_back.output

    events = audit_events(runner, env)
    kinds = [(e["type"], e["subject"]) for e in events]
    actors = {(e["type"], e["data"]["actor"]) for e in events}  # type: ignore[index]
    assert {("traffic.changed", "admin"), ("alias.moved", "admin"), ("model.reloaded", "admin")} <= actors
    assert {actor for _, actor in actors} <= {
        "admin",
        "system:reload-poll",
        "system:catalog",
    }  # the poll may see a move first; serving seeds the task map
    assert ("traffic.changed", "JPCP") in kinds
    assert kinds.count(("alias.moved", "AC")) == 2
    assert kinds.count(("model.reloaded", "AC")) == 2

    verify = runner.invoke(exa, ["audit", "verify", "--json"], env=env)
    assert verify.exit_code == 0, verify.output
    report = json.loads(verify.stdout)
    assert report["ok"] is True
    assert report["checkpoints"] >= 1


def test_a_split_is_not_changed_while_redis_is_paused_and_the_command_exits_3(
    platform: tuple[ServingProcess, dict[str, str], EmbeddedRedis], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, env, redis = platform
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    runner = CliRunner()
    url = f"{server.url}/v1/traffic/CRCP"
    before = httpx.get(url, timeout=30, headers=server.auth).json()["weights"]
    pid = redis.process.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # the operator's reproduction: Redis holds its connections and answers nothing
    try:
        changed = runner.invoke(exa, ["serve", "traffic", "CRCP", "--production", "90", "--canary", "10"], env=env)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert changed.exit_code == 3, changed.output
    assert "CRCP: the traffic split was not changed" in " ".join(changed.output.split())
    # The append Redis took while paused may run when it resumes (the documented limit): never more than once.
    changes = [e["data"] for e in audit_events(runner, env) if (e["type"], e["subject"]) == ("traffic.changed", "CRCP")]
    assert changes in ([], [{"weights": {"Production": 90, "Canary": 10}, "actor": "admin"}])
    assert httpx.get(url, timeout=30, headers=server.auth).json()["weights"] == before  # nothing half-applied

    again = runner.invoke(exa, ["serve", "traffic", "CRCP", "--production", "90", "--canary", "10"], env=env)
    assert again.exit_code == 0, again.output  # the trail is back: the change goes through, with its event
    assert httpx.get(url, timeout=30, headers=server.auth).json()["weights"] == {"Production": 90, "Canary": 10}
