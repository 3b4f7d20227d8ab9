"""EmbeddedRedis against the real redis-server binary."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import redis

from examlops.core.errors import PortInUse
from examlops.platform.process import pid_alive
from examlops.platform.redis_server import EmbeddedRedis
from tests.ports import free_port

pytestmark = pytest.mark.integration


def test_session_server_answers_ping(redis_server: str) -> None:
    client = redis.Redis.from_url(redis_server)
    try:
        assert client.ping()
    finally:
        client.close()


def test_started_server_answers_ping_and_keeps_an_append_only_file(redis_dir: Path) -> None:
    server = EmbeddedRedis(redis_dir, free_port())
    with server:
        client = redis.Redis.from_url(server.url)
        try:
            assert client.ping()
            client.xadd("events", {"k": "v"})
            assert client.config_get("appendonly") == {"appendonly": "yes"}
            assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
            assert client.config_get("bind") == {"bind": "127.0.0.1"}
        finally:
            client.close()
        assert server.aof_path.exists()
    assert server.aof_path.stat().st_size > 0, "SIGTERM must flush the AOF"


def test_stop_leaves_no_process_and_a_second_stop_is_harmless(redis_dir: Path) -> None:
    server = EmbeddedRedis(redis_dir, free_port())
    server.start()
    pid = server.process.pid
    assert pid is not None and pid_alive(pid)
    server.stop()
    assert not pid_alive(pid)
    server.stop()
    assert not server.process.alive()


def test_stop_before_start_is_harmless(redis_dir: Path) -> None:
    EmbeddedRedis(redis_dir, free_port()).stop()


def test_taken_port_is_refused_with_the_port_and_the_setting_to_change(redis_dir: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        server = EmbeddedRedis(redis_dir, port)
        with pytest.raises(PortInUse, match=rf"port {port}.*EXAMLOPS_REDIS__PORT"):
            server.start()
    assert server.process.pid is None, "nothing may be started when the port is taken"


def test_data_survives_a_restart_from_the_append_only_file(redis_dir: Path) -> None:
    port = free_port()
    with EmbeddedRedis(redis_dir, port) as server:
        client = redis.Redis.from_url(server.url)
        client.set("kept", "1")
        client.close()
    with EmbeddedRedis(redis_dir, port) as server:
        client = redis.Redis.from_url(server.url)
        try:
            assert client.get("kept") == b"1"
        finally:
            client.close()
