"""The bus client: ``request(uuid, payload, timeout) -> reply``, from async code (``BusClient``) or sync code
(``sync_client.SyncBusClient``, which runs a ``BusClient`` on an event loop in a thread of its own).

Contract of ``request``:

- signs the job with the bus key of the client's identity (its key id and
  key, from its token: ``examlops.identity.bus_key_from_token``) and puts it on the
  address's stream (a model's or a task's); the deadline it carries is
  now plus what is left of ``timeout`` (at most ``wire.MAX_JOB_TTL_S``) on the bus's clock
  (``clock.RedisClock``: Redis's TIME, which the bridges judge it by, so this
  machine's wall clock plays no part), and bridges and serving refuse work past it;
- ``budget_ms`` (seed 001) travels signed with the submission time: the job's
  deadline is then the earlier of the two, the bridge passes serving only what
  is left of it, and the reply carries ``budget_ms`` and ``budget_remaining_ms``;
- returns the reply body: a prediction (``error`` is None) or an error body
  (``error``, ``prediction`` 0.0, ``code``); an error reply is not raised,
  except a refusal (code ``refused``: no placement could meet the budget, or it
  ran out while queued), raised as ``Refused`` with the reply's ``refused``
  reason, ``estimate_ms`` and ``retry_after_s``: a normal outcome the caller
  falls back from, and does not retry at once;
- ``timeout`` bounds the whole call, on this machine's monotonic clock: reading the bus's clock, putting
  the job on its stream and waiting for the reply all end within it (one ``asyncio.timeout``; cancelling
  a Redis command costs a loop pass on top, not a round trip). redis-py's retries with backoff run
  inside that bound: against a Redis that accepts connections and never answers (paused by SIGSTOP, a
  black hole) they hold one command for minutes (``adapters.redis.connect_async``);
- raises ``DeadlineExceeded`` when the job is on its stream (Redis acknowledged it) and no reply came
  within ``timeout``: the job may or may not be done (the README's "Retrying a job id"); and
  ``StoreUnavailable`` when Redis did not take the job: it could not be reached (after the connection's
  retries with backoff), or it did not answer within ``timeout``. In the latter case the job may still
  reach the stream when Redis wakes up; it carries its deadline, so no bridge serves it past that (a
  bridge replies ``deadline_exceeded`` to the reply stream nobody reads any more);
- ``job_id`` (a fresh UUID when not given) is global and answered once: a
  retry with the same id, the same address and the same payload gets the first
  answer again (the bus README's "Retrying a job id"; the entry's ``resent``
  mark is not returned: the body is the same); the same id with another address
  or payload gets no reply (``DeadlineExceeded``; the bridge dead-letters it
  ``job_id_reused``), nor does a retry by an identity revoked or no longer
  allowed since. A new request needs a new id.

One reader task per client reads the client's reply stream with XREAD BLOCK
and resolves the waiting request by job id; replies nobody waits for (late or
duplicate) are dropped. A reply that does not carry the bridge's signature with
this identity's bus key (forged by anything that can write to Redis, altered,
or unsigned) is ignored and counted in ``unverified_replies`` (logged at
WARNING at most once per ``UNVERIFIED_LOG_EVERY_S``): the request keeps
waiting for the real one. The reader survives a Redis restart: it logs the
outage once, backs off and resumes after the last reply it read. If it dies
of anything else, every waiting request fails instead of hanging.

The client owns the ``RedisCommands`` port it is given (``bootstrap.bus_client``
builds one from the settings): ``close()`` closes it. ``close()`` waits for the reader's current XREAD
only while it can still end by itself (its BLOCK plus ``READ_GRACE_S``: 1.5 s at most): a reader held by
a Redis that does not answer is cancelled (nothing is lost: the stream is the client's own, read without
a group). Closing the connections then takes at most redis-py's connect timeout (2 s). So a caller that
closes the client after a request that ran out waits its timeout plus at most 3.5 s
(``tests/faults/test_bus_client_faults.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from examlops.adapters.redis import RedisCommands
from examlops.bus import replies, wire
from examlops.bus.clock import RedisClock, refresh, resync
from examlops.bus.store import BusStore
from examlops.core.backoff import Outage
from examlops.core.errors import DeadlineExceeded, InvalidInput, ModelNotFound, Refused, StoreUnavailable

log = logging.getLogger(__name__)

Reply = dict[str, Any]
BLOCK_MS = 500
"""How long one XREAD waits; replies wake it at once, so this only bounds how long ``close()`` takes."""
READ_GRACE_S = 1.0
"""How long past its BLOCK ``close()`` still waits for the reader's XREAD before it cancels the reader."""
UNVERIFIED_LOG_EVERY_S = 10.0
"""At most one warning per this many seconds about replies that failed verification (they are all counted)."""


class BusClient:
    def __init__(
        self,
        redis: RedisCommands,
        key_id: str,
        key: bytes,
        *,
        client_id: str | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """``key_id`` and ``key``: the identity's key id and bus key (``examlops.identity.bus_key_from_token``);
        ``clock``: the bus's (default: a ``RedisClock`` on ``redis``), injected in tests."""
        self.client_id = client_id or secrets.token_hex(12)
        self.reply_stream = wire.replies_stream(self.client_id)
        self.key_id = key_id
        self.store = BusStore(redis)
        self.unverified_replies = 0
        self._key = key
        self._clock = clock or RedisClock(redis, errs="behind")  # its deadlines never later than meant
        self._warned_at = -UNVERIFIED_LOG_EVERY_S
        self._waiting: dict[str, asyncio.Future[Reply]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._read_since: float | None = None  # when the reader's current XREAD began (the loop's clock)
        self._closing = False

    async def __aenter__(self) -> BusClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def request(
        self,
        address: str | uuid.UUID,
        payload: Mapping[str, Any],
        timeout: float,  # noqa: ASYNC109  # it is also the job's deadline on the wire, not only a local wait
        *,
        job_id: str | None = None,
        budget_ms: float | None = None,
    ) -> Reply:
        try:
            address = str(uuid.UUID(str(address)))
        except ValueError as exc:
            raise ModelNotFound(f"{str(address)[:64]!r} is not a bus address (a UUID)") from exc
        if not 0 < timeout <= wire.MAX_JOB_TTL_S:
            raise InvalidInput(f"the timeout must lie in (0, {wire.MAX_JOB_TTL_S:.0f}] seconds", field="timeout")
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read_replies(), name=f"bus-replies-{self.client_id}")
        job_id = job_id or uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        gives_up = loop.time() + timeout
        sent = False
        try:
            async with asyncio.timeout_at(gives_up) as bound:
                await refresh(self._clock)
                submitted = self._clock()
                left = gives_up - loop.time()  # reading the clock came out of the timeout: the job has the rest
                fields = wire.encode_job(
                    self.key_id,
                    self._key,
                    address=address,
                    job_id=job_id,
                    reply_to=self.reply_stream,
                    deadline=submitted + max(0.0, left),
                    payload=payload,
                    submitted=submitted,
                    budget_ms=budget_ms,
                )
                waiter: asyncio.Future[Reply] = loop.create_future()
                self._waiting[job_id] = waiter
                await self.store.submit(address, fields)
                sent = True
                reply = await waiter
        except TimeoutError:
            if not bound.expired():
                raise
            if sent:
                raise DeadlineExceeded(f"no reply to job {job_id} within {timeout:g} s") from None
            raise StoreUnavailable(
                f"Redis did not take job {job_id} within {timeout:g} s: it accepts no connection or does not "
                "answer (down, paused or overloaded). The job may still reach its stream; it carries its "
                "deadline, so no bridge serves it after that"
            ) from None
        finally:
            self._waiting.pop(job_id, None)
        if reply.get("code") == Refused.code:
            raise RefusedJob(reply)
        return reply

    async def _read_replies(self) -> None:
        outage = Outage(f"bus client {self.client_id}", log)
        after = "0-0"  # the stream is this client's own: everything on it is for us
        loop = asyncio.get_running_loop()
        try:
            while not self._closing:
                self._read_since = loop.time()
                try:
                    entries = await self.store.replies(self.reply_stream, after, BLOCK_MS)
                except StoreUnavailable as exc:
                    self._read_since = None
                    resync(self._clock)  # Redis may come back elsewhere, on another clock
                    await asyncio.sleep(outage.lost(exc))
                    continue
                self._read_since = None
                outage.back()
                for entry_id, fields in entries:
                    after = entry_id
                    verified = replies.verify_reply(self.key_id, self._key, fields)
                    if verified is None:
                        self._unverified(fields)
                        continue
                    waiter = self._waiting.get(verified[0])
                    if waiter is not None and not waiter.done():
                        waiter.set_result(verified[1])
        except Exception as exc:
            log.exception("bus client %s: the reply reader died", self.client_id)
            self._fail_waiting(StoreUnavailable(f"the reply reader died: {exc}"))
            raise

    def _unverified(self, fields: Mapping[str, str]) -> None:
        self.unverified_replies += 1
        now = time.monotonic()
        if now - self._warned_at >= UNVERIFIED_LOG_EVERY_S:
            self._warned_at = now
            log.warning(
                "bus client %s ignored a reply it could not verify (for job %.64r; %d so far): a forged or "
                "altered reply, or one signed for another identity",
                self.client_id,
                str(fields.get("job_id", "")),
                self.unverified_replies,
            )

    def _fail_waiting(self, error: Exception) -> None:
        for waiter in self._waiting.values():
            if not waiter.done():
                waiter.set_exception(error)

    async def close(self) -> None:
        """Stop the reader, fail whatever still waits, close the Redis port (the module docstring: a reader that
        Redis does not answer is cancelled, not waited for)."""
        self._closing = True
        if self._reader is not None:
            # Not cancelled outright while its XREAD can still end: a cancelled XREAD BLOCK in redis-py 8.1 was
            # seen to hang (see bridge.py). Not awaited once cancelled, for the same reason.
            with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(self._reader), self._reader_grace())
            self._reader.cancel()
        self._fail_waiting(StoreUnavailable("the bus client was closed"))
        await self.store.aclose()

    def _reader_grace(self) -> float:
        """Until the reader's current XREAD should have returned (0 when it is not reading: backing off)."""
        since = self._read_since
        if since is None:
            return 0.0
        return max(0.0, since + BLOCK_MS / 1000 + READ_GRACE_S - asyncio.get_running_loop().time())


class RefusedJob(Refused):
    """A bus job's refusal: ``Refused`` with the whole reply (``reply``: its job id, trace, budget)."""

    def __init__(self, reply: Mapping[str, Any]) -> None:
        estimate, retry_after = reply.get("estimate_ms"), reply.get("retry_after_s")
        super().__init__(
            str(reply.get("error") or "refused: the budget cannot be met"),
            reason=str(reply.get("refused") or "budget"),
            estimate_ms=float(estimate) if isinstance(estimate, int | float) else None,
            retry_after_s=float(retry_after) if isinstance(retry_after, int | float) else 1.0,
        )
        self.reply: Reply = dict(reply)
