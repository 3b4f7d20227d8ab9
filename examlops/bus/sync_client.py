"""``SyncBusClient``: a ``client.BusClient`` for sync code (the CLI), on its own event loop in a daemon thread.

Contract: it blocks no longer than its ``BusClient`` does. ``request`` returns or raises as
``BusClient.request`` does, which ends within the request's ``timeout``; should the event loop itself be
stuck, a backstop gives up ``SYNC_MARGIN_S`` later with ``DeadlineExceeded`` (the job may or may not have
been sent then). ``close()`` waits at most ``CLOSE_LIMIT_S`` for the client's close (the reader, then the
Redis connections), then stops the loop and its thread whatever happened.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Coroutine, Mapping
from types import TracebackType
from typing import Any, TypeVar

from examlops.bus.client import BusClient, Reply
from examlops.core.errors import DeadlineExceeded

log = logging.getLogger(__name__)

T = TypeVar("T")
SYNC_MARGIN_S = 2.0
"""``request``'s backstop past the request's timeout: it fires only when the event loop is stuck."""
CLOSE_LIMIT_S = 10.0
"""The most ``close`` waits for the client's close."""


class SyncBusClient:
    """A ``BusClient`` for sync code: its own event loop in a daemon thread; ``close()`` stops both."""

    def __init__(self, client: BusClient) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="bus-client", daemon=True)
        self._thread.start()
        self._client = client

    @property
    def unverified_replies(self) -> int:
        """Replies ignored because they did not verify (``BusClient.unverified_replies``)."""
        return self._client.unverified_replies

    def _run(self, work: Coroutine[Any, Any, T], limit_s: float) -> T:
        """``work``'s result, from the client's loop; ``TimeoutError`` after ``limit_s`` (``work`` is cancelled)."""
        running = asyncio.run_coroutine_threadsafe(work, self._loop)
        try:
            return running.result(limit_s)
        except TimeoutError:
            if running.done():  # the work's own TimeoutError, not the limit's
                raise
            running.cancel()
            raise TimeoutError(f"the bus client's event loop did not return within {limit_s:g} s") from None

    def request(
        self,
        address: str | uuid.UUID,
        payload: Mapping[str, Any],
        timeout: float,
        *,
        job_id: str | None = None,
        budget_ms: float | None = None,
    ) -> Reply:
        """``BusClient.request`` (its contract), from sync code."""
        work = self._client.request(address, payload, timeout, job_id=job_id, budget_ms=budget_ms)
        try:
            return self._run(work, timeout + SYNC_MARGIN_S)
        except TimeoutError as exc:
            raise DeadlineExceeded(f"no outcome within {timeout:g} s ({exc}); the job may not have been sent") from None

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._run(self._client.close(), CLOSE_LIMIT_S)
        except TimeoutError:
            log.warning("the bus client did not close within %g s; its connections are dropped", CLOSE_LIMIT_S)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            if not self._thread.is_alive():  # a loop still running cannot be closed; the thread is a daemon
                self._loop.close()

    def __enter__(self) -> SyncBusClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
