"""Run the serving app on uvicorn with a graceful drain.

On SIGTERM or SIGINT: ``/readyz`` turns 503 first (``app.state.draining``), the
listening socket closes so no new connection is accepted, requests in flight
finish within the grace period (``serving.drain_grace_s``), the lifespan closes
the pipeline and the predict workers, and the process exits 0.
"""

from __future__ import annotations

import logging
from types import FrameType

import uvicorn
from fastapi import FastAPI

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self._app.state.draining:
            log.warning("signal %d: draining (readyz 503, finishing requests in flight)", sig)
        self._app.state.draining = True
        super().handle_exit(sig, frame)
        # uvicorn re-raises a captured signal after shutting down, which makes the exit status
        # -SIGTERM; a drain that finished is a clean exit, so forget the signal.
        self._captured_signals.clear()


def run_server(app: FastAPI, *, host: str, port: int, grace_s: float, log_level: str = "warning") -> None:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=max(1, round(grace_s)),
        lifespan="on",
    )
    DrainingServer(config, app).run()
