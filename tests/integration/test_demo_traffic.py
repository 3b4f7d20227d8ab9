"""`exa demo traffic --fail-rate` against the real stack: redis, serving with the demo models, a bridge process.

Jobs pinned to alias Staging reach the seeded version that fails while predicting, serving answers them 500
``inference_failed``, the bridge counts them as model failures, and a full window of them asks for a retrain.
No Prefect runs here: the request stays in the retrain outbox, and ``exa bridge status`` shows it as not
delivered yet.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from examlops.bootstrap import upgrade_database
from examlops.cli.main import app as exa
from examlops.core.settings import Settings
from examlops.registry.catalog import load_catalog
from examlops.registry.demo import seed_demo
from tests.integration.servers import ServingProcess, examlops_env, known_token
from tests.integration.test_bus_bridge import TOKEN
from tests.ports import free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning"),
]

DB = 11
"""A Redis database of this module's own on the session's redis-server: no other test's windows or streams."""


@dataclass(frozen=True)
class Stack:
    env: dict[str, str]
    """What the CLI needs to reach this stack (and the variables its callback sets, so CliRunner restores them)."""
    bridge_log: Path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_server: str) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("demo-traffic")
    catalog_dir = home / "catalog"
    catalog_dir.mkdir()
    shutil.copy(Settings().catalog_path / "jpcp.yaml", catalog_dir)  # one model keeps the seed short
    url = f"{redis_server.rsplit('/', 1)[0]}/{DB}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()
    settings = Settings(home=home, catalog_dir=catalog_dir)
    seed_demo(settings, load_catalog(settings.catalog_path))
    upgrade_database(settings)
    known_token(settings, TOKEN)
    env = {
        "EXAMLOPS_HOME": str(home),
        "EXAMLOPS_CATALOG_DIR": str(catalog_dir),
        "EXAMLOPS_REDIS__URL": url,
        # The platform token the bridge knows and `exa demo traffic` signs with (`exa up` would write one).
        "EXAMLOPS_TOKEN": TOKEN,
        # Nothing listens there: the retrain request waits in the outbox.
        "EXAMLOPS_PREFECT__API_URL": f"http://127.0.0.1:{free_port()}/api",
    }
    serving = ServingProcess(home, env={**env, "EXAMLOPS_PREDICT__WORKERS": "1", "EXAMLOPS_HOTSET__RELOAD_POLL_S": "0"})
    env["EXAMLOPS_SERVING__PORT"] = str(serving.port)
    bridge_log = home / "bridge.log"
    with bridge_log.open("wb") as log:
        bridge = subprocess.Popen(
            [sys.executable, "-m", "examlops.cli.main", "bridge", "start", "--log-level", "warning"],
            env=examlops_env(home, **env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        serving.wait_ready(60)
        cli_env = {**env, "PREFECT_HOME": str(home / "prefect")}
        cli_env |= {"MLFLOW_DISABLE_TELEMETRY": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        yield Stack(cli_env, bridge_log)
    finally:
        bridge.send_signal(signal.SIGTERM)
        try:
            bridge.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(bridge.pid, signal.SIGKILL)
            bridge.wait()
        assert serving.stop() == 0, serving.log_tail()


def bridge_status(runner: CliRunner, env: dict[str, str]) -> dict[str, Any]:
    result = runner.invoke(exa, ["bridge", "status", "--json"], env=env)
    assert result.exit_code == 0, result.output
    status: dict[str, Any] = json.loads(result.stdout)
    return status


def test_a_fail_rate_of_1_fills_the_window_with_model_failures_and_a_retrain_is_requested(stack: Stack) -> None:
    runner = CliRunner()
    sent = runner.invoke(exa, ["demo", "traffic", "--jobs", "60", "--fail-rate", "1.0", "--json"], env=stack.env)
    assert sent.exit_code == 0, f"{sent.output}\n{stack.bridge_log.read_text(errors='replace')}"
    tally = json.loads(sent.stdout)
    assert tally == {
        "served": 0,
        "model_failures": 60,
        "other_errors": 0,
        "other_errors_by_code": {},
        "pinned_to_staging": 60,
    }

    # The bridge's recording child counts the outcomes: its last ones may land just after the replies.
    deadline = time.monotonic() + 20
    while True:
        row = next(m for m in bridge_status(runner, stack.env)["models"] if m["model"].lower() == "jpcp")
        if row["window_size"] == row["window_capacity"] and row["last_request"] is not None:
            break
        assert time.monotonic() < deadline, row
        time.sleep(0.2)
    assert row["failure_rate"] == 1.0 and row["failures"] == 50 == row["window_capacity"]
    assert row["cooldown_left_s"] > 0
    last = row["last_request"]
    assert last["model"] == "JPCP" and "failure rate 50/50" in last["reason"]
    assert last["delivered_at"] is None  # no Prefect: the request waits in the outbox


def test_traffic_without_a_fail_rate_is_served_and_points_at_the_retrain_trigger(stack: Stack) -> None:
    result = CliRunner().invoke(exa, ["demo", "traffic", "--jobs", "6"], env=stack.env)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "served │ 6" in text and "model failures (count toward a retrain) │ 0" in text, result.output
    assert "exa bridge status" in text and "/runs" in text
