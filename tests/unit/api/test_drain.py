"""The serving drain ends once the requests in flight when it began are answered, whatever keeps arriving."""

from __future__ import annotations

import asyncio
import signal

import pytest
import uvicorn
from fastapi import FastAPI

from examlops.api.server import DrainingServer


def _server(grace_s: float = 60.0) -> DrainingServer:
    app = FastAPI()
    app.state.draining = False
    return DrainingServer(uvicorn.Config(app), app, grace_s=grace_s)


def _request(server: DrainingServer) -> tuple[asyncio.Task[None], asyncio.Event]:
    """A request being answered, as uvicorn tracks it; it ends when its event is set."""
    answered = asyncio.Event()

    async def answer() -> None:
        await answered.wait()

    task = asyncio.get_running_loop().create_task(answer())
    server.server_state.tasks.add(task)
    task.add_done_callback(server.server_state.tasks.discard)
    return task, answered


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_the_drain_waits_for_the_requests_in_flight_and_not_for_those_arriving_after() -> None:
    server = _server()
    _, held = _request(server)
    server.handle_exit(signal.SIGTERM, None)
    assert server.server_state.tasks and server.config.app.state.draining
    assert await server.on_tick(1) is False
    refusals = [_request(server) for _ in range(3)]  # 503s and /readyz polls keep coming
    assert await server.on_tick(2) is False
    held.set()
    await _settle()
    assert await server.on_tick(3) is True
    assert server.server_state.tasks  # the drain ended with the late arrivals still being answered
    for _, answered in refusals:
        answered.set()
    await _settle()


async def test_the_drain_ends_at_the_grace_with_a_request_still_running(caplog: pytest.LogCaptureFixture) -> None:
    server = _server(grace_s=0.0)
    _, held = _request(server)
    server.handle_exit(signal.SIGTERM, None)
    assert await server.on_tick(1) is True
    assert "drain grace over: 1 request(s) still in flight" in caplog.text
    held.set()
    await _settle()


async def test_without_a_signal_the_server_keeps_serving() -> None:
    server = _server()
    assert await server.on_tick(1) is False and server.should_exit is False
