"""The fault suite's switches: every test here is marked ``faults``; ``EXAMLOPS_FAULTS=long`` picks the long runs.

The variable is read at import, before the autouse fixture of ``tests/conftest.py`` clears ``EXAMLOPS_*`` from
the environment of each test.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
import redis

from examlops.platform.redis_server import EmbeddedRedis
from tests.faults.checker import Figures
from tests.integration.servers import free_port

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


@pytest.fixture
def redis_url(shared_redis: EmbeddedRedis) -> str:
    with redis.Redis.from_url(shared_redis.url) as client:
        client.flushdb()
    return shared_redis.url


class Reporter:
    """Prints a scenario's figures and appends them to ``REPORT`` (one JSON line per scenario and length)."""

    def __call__(self, scenario: str, load: str, faults: str, figures: Figures) -> None:
        line = {"scenario": scenario, "long": LONG, "load": load, "faults": faults, **figures.summary()}
        print(json.dumps(line))
        if REPORT:
            with open(REPORT, "a") as out:
                out.write(json.dumps(line) + "\n")


@pytest.fixture
def report() -> Reporter:
    return Reporter()
