"""Run the serving app on uvicorn with a graceful drain.

On SIGTERM or SIGINT: ``/readyz`` turns 503 first (``app.state.draining``) and new
predictions are refused with a 503 (``NotReady``, retryable), while the socket
stays open so that a load balancer can see the 503. Once the requests in flight
when the drain began are answered (those that arrive after it are refusals and
probes, which never stop arriving under steady traffic), or ``serving.drain_grace_s``
has passed, uvicorn closes the listening socket,
closes idle connections, cancels what still runs after at most one more second,
the lifespan closes the pipeline and the predict workers, and the process exits 0.
A second signal skips the wait (a second SIGINT forces the exit).
"""

from __future__ import annotations

import asyncio
import logging
import math
import resource
import time
from types import FrameType

import uvicorn
from fastapi import FastAPI

from examlops.api.protocol import ConnectionLimits, guarded_protocol
from examlops.core.settings import ServingSettings

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI, *, grace_s: float) -> None:
        super().__init__(config)
        self._app = app
        self._grace_s = grace_s
        self._drain_until: float | None = None
        self._in_flight: set[asyncio.Task[None]] | None = None
        """The requests being answered at the first tick of the drain: the ones it waits for."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain_until is None:
            log.warning("signal %d: draining (readyz 503, finishing requests in flight)", sig)
            self._app.state.draining = True
            self._drain_until = time.monotonic() + self._grace_s
            return  # on_tick ends the drain
        super().handle_exit(sig, frame)
        # uvicorn re-raises a captured signal after shutting down, which makes the exit status
        # -SIGTERM; a drain that finished is a clean exit, so forget the signal.
        self._captured_signals.clear()

    async def on_tick(self, counter: int) -> bool:
        if self._drain_until is not None and not self.should_exit:
            left = self._drain_until - time.monotonic()
            # server_state.tasks: one per request being answered (predictions, reloads, probes).
            if self._in_flight is None:
                self._in_flight = set(self.server_state.tasks)
            running = [task for task in self._in_flight if not task.done()]
            if not running or left <= 0:
                if running:
                    log.warning("drain grace over: %d request(s) still in flight", len(running))
                self.config.timeout_graceful_shutdown = max(1, math.ceil(left))
                self.should_exit = True
        return await super().on_tick(counter)


FILES_RESERVED = 128
"""File descriptors kept free of connections: the predict pool's pipes, SQL, MLflow, log files."""


def connection_limits(serving: ServingSettings) -> ConnectionLimits:
    """The settings' limits, the connection cap lowered to fit under the open-files limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap = serving.max_connections
    if soft != resource.RLIM_INFINITY:
        cap = max(1, min(cap, soft - FILES_RESERVED))
    return ConnectionLimits(serving.header_timeout_s, serving.body_timeout_s, cap)


def draining_server(
    app: FastAPI, serving: ServingSettings, *, host: str, port: int, log_level: str = "warning"
) -> DrainingServer:
    """The uvicorn server of ``app``, not yet running: ``.run()`` serves until a signal or ``.handle_exit``.

    Connections get the deadlines and cap of ``api.protocol`` (from ``serving``); idle keep-alive
    connections are closed after ``serving.keep_alive_s``.
    """
    limits = connection_limits(serving)
    if limits.max_connections < serving.max_connections:
        log.warning(
            "open connections capped at %d (the open-files limit), below serving.max_connections=%d",
            limits.max_connections,
            serving.max_connections,
        )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=guarded_protocol(limits),
        timeout_keep_alive=serving.keep_alive_s,
        timeout_graceful_shutdown=1,
        lifespan="on",
        access_log=False,  # one log line per prediction costs more than the prediction; errors still log
    )
    return DrainingServer(config, app, grace_s=serving.drain_grace_s)
