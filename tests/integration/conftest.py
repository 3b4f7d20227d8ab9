"""Fixtures for tests against real components: a redis-server on a free port in a temp folder."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from examlops.platform.process import pid_alive
from examlops.platform.redis_server import EmbeddedRedis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def embedded_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """One real redis-server for the session (it starts in ~0.1 s, but every test would pay the fixture churn).

    Tests share it: use keys or streams of your own, or FLUSHDB at the start.
    Teardown asserts the server process is gone.
    """
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"), free_port())
    server.start()
    pid = server.process.pid
    assert pid is not None
    yield server
    server.stop()
    assert not pid_alive(pid), f"redis-server {pid} outlived its fixture"


@pytest.fixture(scope="session")
def redis_server(embedded_redis: EmbeddedRedis) -> str:
    """The URL (``redis://127.0.0.1:<port>/0``) of the session's real redis-server."""
    return embedded_redis.url


@pytest.fixture
def client(redis_server: str) -> Iterator[redis.Redis]:
    """A client (decoded strings) of the session's Redis, whose database starts empty for each test."""
    from examlops.adapters.redis import connect

    client = connect(redis_server)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def redis_dir(tmp_path: Path) -> Path:
    return tmp_path / "redis"
