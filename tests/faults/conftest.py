"""The fault suite's switches: every test here is marked ``faults``; ``EXAMLOPS_FAULTS=long`` picks the long runs.

The variable is read at import, before the autouse fixture of ``tests/conftest.py`` clears ``EXAMLOPS_*`` from
the environment of each test.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis

from examlops.platform.redis_server import EmbeddedRedis
from tests.faults.checker import Figures
from tests.faults.cluster import Cluster
from tests.integration.servers import ServingProcess
from tests.ports import free_port

LONG = os.environ.get("EXAMLOPS_FAULTS", "short").strip().lower() == "long"
"""True under `make faults`: each scenario holds its load and faults longer (see tests/faults/README.md)."""
REPORT = os.environ.get("EXAMLOPS_FAULTS_REPORT", "")
"""A JSON-lines file each scenario appends its figures to (`make faults` sets it); none when empty."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.faults)


@pytest.fixture(scope="session")
def shared_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """One real redis-server for the tests that do not kill it; each test flushes it (``redis_url``)."""
    server = EmbeddedRedis(tmp_path_factory.mktemp("faults-redis"), free_port())
    server.start()
    yield server
    server.stop()


MAX_BODY = 64 * 1024
HEADER_TIMEOUT_S, BODY_TIMEOUT_S = 2.0, 3.0
"""The shared serving's body limit and slow-sender timeouts (``test_hostile_http.py`` tests them)."""


@pytest.fixture(scope="session")
def hostile_serving(tmp_path_factory: pytest.TempPathFactory, shared_redis: EmbeddedRedis) -> Iterator[ServingProcess]:
    """One `exa serve start` with the demo models for the scenarios that send it hostile input and fuzz its
    permissions (``test_hostile_http.py``, ``test_permission_fuzz.py``): its start (seeding MLflow, loading the
    models) was most of their time, twice. Both only read what they need of it: each asserts statuses and
    bodies per request, and the permission fuzz adds identities of its own."""
    from examlops.core.settings import Settings
    from examlops.registry.demo import seed_demo
    from tests.faults.cluster import CATALOG

    home = tmp_path_factory.mktemp("hostile-serving")
    seed_demo(Settings(home=home), CATALOG)
    env = {
        "EXAMLOPS_SERVING__MAX_BODY_BYTES": str(MAX_BODY),
        "EXAMLOPS_SERVING__HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        "EXAMLOPS_SERVING__BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
        "EXAMLOPS_PREDICT__WORKERS": "2" if LONG else "1",  # one worker process is enough for what is sent here
        "EXAMLOPS_HOTSET__RELOAD_POLL_S": "0",
        "EXAMLOPS_AUTH__CACHE_TTL_S": "0.5",  # a revocation holds within the permission fuzz's first requests
        # The audit trail (a split is refused without its event) in a database the per-test flushes leave alone.
        "EXAMLOPS_REDIS__URL": f"{shared_redis.url.rsplit('/', 1)[0]}/13",
    }
    proc = ServingProcess(home, env)
    try:
        proc.wait_ready(180)
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def redis_url(shared_redis: EmbeddedRedis) -> str:
    with redis.Redis.from_url(shared_redis.url) as client:
        client.flushdb()
    return shared_redis.url


def this_run() -> dict[str, str]:
    """What names this pytest run in the report: when it started (UTC), the commit (``+dirty`` with edits
    not committed) and the command, so that lines appended by many runs to one file are told apart."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=REPO, check=False).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", False
    command = shlex.join(["pytest", *sys.argv[1:]])
    if LONG:
        command = f"EXAMLOPS_FAULTS=long {command}"
    return {"started": RUN_STARTED, "commit": commit + ("+dirty" if dirty else ""), "command": command}


RUN_STARTED = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
REPO = Path(__file__).resolve().parents[2]


class Reporter:
    """Prints a scenario's figures and appends them to ``REPORT`` (one JSON line per scenario and length, with
    the run's date, commit and command: ``this_run``)."""

    def __init__(self, run: dict[str, str]) -> None:
        self.run = run

    def __call__(self, scenario: str, load: str, faults: str, figures: Figures) -> None:
        line = {"scenario": scenario, "long": LONG, "load": load, "faults": faults, **figures.summary()}
        line["run"] = self.run
        print(json.dumps(line))
        if REPORT:
            with open(REPORT, "a") as out:
                out.write(json.dumps(line) + "\n")


@pytest.fixture(scope="session")
def run_named() -> dict[str, str]:
    return this_run()


@pytest.fixture
def report(run_named: dict[str, str]) -> Reporter:
    return Reporter(run_named)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A cluster of the test's own with a serving stand-in answering in 20 ms; a module that needs another
    (more bridges, a failing model, one shared by its tests) defines its own."""
    cluster = Cluster(tmp_path)
    try:
        cluster.serving(delay_s=0.02)
        yield cluster
    finally:
        cluster.close()
