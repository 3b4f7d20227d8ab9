"""One bus job from its stream entry to its reply: verify, refuse or serve, then finish once.

Contract (``JobRunner.process``, run by the bridge once per delivered entry):

- A job that cannot be read or verified (``wire.MalformedJob``: malformed, an unknown key id, a bad
  signature, which also covers a job copied onto another address's stream), and a verified copy older than
  its deadline plus ``wire.DONE_MARGIN_S``, is dead-lettered with the reason and never answered: neither
  the reply stream nor the done key it claims is written, so a tampered copy of a real job cannot take
  the real job's reply. A job delivered more than ``wire.MAX_DELIVERIES`` times gets an error reply and a
  dead letter.
- A job whose done key exists (answered before: a client's retry, a copy) is never served again. Its identity
  revoked or no longer allowed: acked, no reply. Another address or payload than the one the job id was
  answered for (``wire.Job.digest``): dead-lettered ``job_id_reused``, no reply. Else the job id's reply goes
  again to the copy's reply stream, marked ``resent`` (``scripts.RESEND_SCRIPT``), if it is still on its
  stream, was signed for the copy's key id and the copy is still pending (not the same entry, answered by a
  bridge that reclaimed it); else no reply.
- A verified job of a revoked identity gets an ``unauthenticated`` reply, one of an identity that may not
  call the address's model (or task, or the model the task maps to now) a ``forbidden`` reply naming the
  permission; neither reaches serving nor is recorded, so neither counts in the failure windows.
- A job without a budget of its own, on a task's address, gets the task's default budget counted from its
  submission (``ModelHandler.budgeted``); from then on its deadline is the earlier of the two, and the
  trace records its budget.
- Otherwise the address's handler answers, and the reply (signed with the job's bus key), the job's record
  (``core.records.ServedInference``, with the embedding's statistics, when ``record`` is on and the
  handler asks for it), the done key, XACK and XDEL are one script (``scripts.REPLY_SCRIPT``): a job is
  answered and recorded together, once.
- Every time here is on ``clock``, the bus's (``clock.RedisClock``: Redis's TIME), as the client's deadline
  is; only the trace's deadline is moved onto the tracer's own wall clock, which it is read against.
- A lost Redis is retried with backoff until the job's deadline (at least 30 s), by a reply and a resend
  alike; then the job stays pending and is reclaimed. Any other error (the key port's ``StoreUnavailable``
  too) leaves it pending (logged).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from examlops.bus import budget, replies, wire
from examlops.bus.hop import ModelHandler, Outcome
from examlops.bus.ports import BusCaller, BusKeys
from examlops.bus.record import packed_record
from examlops.bus.store import BusStore
from examlops.core.backoff import Outage
from examlops.core.errors import DeadlineExceeded, ExamlopsError, ModelNotFound, StoreUnavailable, Unauthenticated
from examlops.tracing import CallTrace, Tracer, trace_id_for_job

log = logging.getLogger(__name__)
T = TypeVar("T")

DoneCheck = asyncio.Task[dict[str, str]]
"""The pending check of a read's done keys (``JobRunner.done_among``): answered job id -> its done key's value."""


class JobRunner:
    """Serves and finishes single jobs for one bridge (``consumer``). ``handler_of`` gives the handler of an
    address (a model's or a task's) as it is when the job starts, or None for an address nobody serves."""

    def __init__(
        self,
        store: BusStore,
        handler_of: Callable[[str], ModelHandler | None],
        keys: BusKeys,
        consumer: str,
        *,
        record: bool,
        records_bound: int,
        clock: Callable[[], float],
        tracer: Tracer | None = None,
    ) -> None:
        self.tracer = tracer or Tracer(None)
        self.store = store
        self.handler_of = handler_of
        self.keys = keys
        self.consumer = consumer
        self.record = record
        self.records_bound = records_bound
        self.clock = clock
        # Finish tokens: this instance's own prefix (a consumer name may be given, and reused after a
        # restart) and a counter.
        self._token_prefix = f"{consumer}:{secrets.token_hex(4)}:"
        self._finishes = itertools.count()

    async def process(
        self, stream: str, entry_id: str, fields: Mapping[str, str], delivered: int, done: DoneCheck | None
    ) -> None:
        try:
            await self._serve(stream, entry_id, fields, delivered, done)
        except Exception:
            # The job stays pending and is reclaimed; a job that keeps failing ends in the dead-letter stream.
            log.exception("job %s on %s failed in the bridge", entry_id, stream)

    async def done_among(self, job_ids: list[str]) -> dict[str, str]:
        """The answered ids among ``job_ids``, each with its done key's value (``BusStore.done_among``)."""
        try:
            return await self.store.done_among(job_ids)
        except StoreUnavailable:
            return {}  # served then; the reply script still writes one reply per job id

    async def _serve(
        self, stream: str, entry_id: str, fields: Mapping[str, str], delivered: int, done: DoneCheck | None
    ) -> None:
        address = wire.address_of(stream)
        try:
            caller, key, job = await self._verified(address, fields)
        except wire.MalformedJob as exc:
            log.warning("dead-lettered entry %s on %s: %s", entry_id, stream, exc)
            self._traced(self.tracer.begin("bus"), replies.error_body(exc), None)
            await self._dead_letter(stream, entry_id, fields, exc.code, exc.message)
            return
        trace = self.tracer.begin("bus", trace_id_for_job(job.job_id))
        trace.identity = caller.name
        if self.clock() > job.deadline + wire.DONE_MARGIN_S:
            log.warning(
                "job %s on %s expired more than %.0f s ago: dead-lettered", job.job_id, stream, wire.DONE_MARGIN_S
            )
            self._traced(
                trace, replies.error_body(DeadlineExceeded("the job expired long ago"), job_id=job.job_id), job
            )
            await self._dead_letter(stream, entry_id, fields, "stale", "the job expired before it was read")
            return
        handler = self.handler_of(address)
        if handler is not None:
            trace.model, trace.task = handler.spec.name, handler.task
            job = handler.budgeted(job, budget.entry_time(entry_id))
        # The tracer reads its own wall clock: the deadline moved from the bus's clock (Redis's) onto it.
        trace.budget_ms, trace.deadline = job.budget_ms, job.deadline - self.clock() + self.tracer.wall()
        if delivered > wire.MAX_DELIVERIES:
            error = wire.Undeliverable(
                f"the job was delivered {delivered} times without an answer; it was dead-lettered"
            )
            dead: dict[str, Any] = {"stream": stream, "reason": error.code, "delivered": delivered}
            dead["fields"] = dict(fields)
            body = handler.error_body(error, job.job_id) if handler else replies.error_body(error, job_id=job.job_id)
            await self.finish(stream, entry_id, job, key, self._traced(trace, body, job), dead=dead)
            return
        answered = await (done if done is not None else self.done_among([job.job_id]))
        if job.job_id in answered:
            allowed = self._refusal(caller, handler) is None
            await self._again(stream, entry_id, fields, job, allowed, answered[job.job_id])
            return
        outcome = await self._answer(job, caller, handler, trace.trace_id)
        if outcome.status == 0 or outcome.verdict:
            body = self._traced(trace, outcome.body, job, status=outcome.status)
        else:  # serving's reply passed on: serving traced the call under this id
            body = {**outcome.body, "trace": trace.trace_id}
        outcome = Outcome(body, outcome.status, outcome.recorded, outcome.verdict)
        record = ""
        if self.record and handler is not None and outcome.recorded:  # with the embedding's statistics
            record = packed_record(job, handler.spec.name, caller.name, outcome.body, outcome.status, self.clock())
        await self.finish(stream, entry_id, job, key, outcome.body, status=outcome.status, record=record)

    async def _verified(self, address: str, fields: Mapping[str, str]) -> tuple[BusCaller, bytes, wire.Job]:
        """The job, its identity and bus key; ``wire.MalformedJob`` (``UnknownKey``, ``BadSignature``) else."""
        key_id = wire.job_key_id(fields)
        if self.keys.is_cached(key_id):
            found = self.keys.bus_key(key_id)
        else:  # a store read: off the event loop, so unknown key ids cannot stall the bridge
            found = await asyncio.to_thread(self.keys.bus_key, key_id)
        if found is None:
            raise wire.UnknownKey(f"no identity has the key id {key_id[:64]!r}")
        caller, key = found
        return caller, key, wire.decode_job(key, address, fields, self.clock())

    async def _again(
        self, stream: str, entry_id: str, fields: Mapping[str, str], job: wire.Job, allowed: bool, done: str
    ) -> None:
        """A copy of an answered job id: its reply resent, unless the caller may no longer have it (acked, no
        reply) or the copy asks something else (dead-lettered ``job_id_reused``, no reply)."""
        reply = wire.reply_location(done)
        if not allowed:
            log.info("job %s was answered before; its identity may no longer call: acked without a reply", job.job_id)
            reply = None
        elif reply is not None and reply.digest != job.digest:
            log.warning("job id %s was answered for another request: dead-lettered", job.job_id)
            message = "the job id was answered for another address or payload; use a new job id"
            await self._dead_letter(stream, entry_id, fields, "job_id_reused", message)
            return
        resent = await self._retried(
            job,
            "resend",
            lambda: self.store.resend(stream, entry_id, reply=reply, reply_to=job.reply_to, key_id=job.key_id),
        )
        if not resent:  # gone, another identity's, this copy answered already, or Redis lost past the deadline
            log.info("job %s was answered before; no reply resent to entry %s", job.job_id, entry_id)

    @staticmethod
    def _refusal(caller: BusCaller, handler: ModelHandler | None) -> ExamlopsError | None:
        """Why ``caller`` may not have a job of ``handler``'s address answered (revoked, not allowed), or None."""
        if caller.revoked:
            return Unauthenticated()
        try:
            # A task's address names its model too (as `POST /v1/tasks/{task}/infer` checks both): an identity
            # whose model list lacks the task's model may not reach that model through the task.
            if handler is not None:
                caller.may_call(task=handler.task, model=handler.spec.name)
        except ExamlopsError as refused:
            return refused
        return None

    async def _answer(self, job: wire.Job, caller: BusCaller, handler: ModelHandler | None, trace_id: str) -> Outcome:
        """Serve the job, or the refusal it gets (never recorded, never sent to serving)."""
        refused = self._refusal(caller, handler)
        if refused is not None and (caller.revoked or handler is None):
            return Outcome(replies.error_body(refused, job_id=job.job_id), 0, False)
        if handler is None:
            missing = ModelNotFound(f"no model or task has the bus address {job.address[:64]}")
            return Outcome(replies.error_body(missing, job_id=job.job_id), 0, False)
        if refused is not None:
            return Outcome(handler.error_body(refused, job.job_id), 0, False)
        expired = job.expired(self.clock())
        if expired is not None:
            return Outcome(handler.error_body(expired, job.job_id), 0, False)
        return await handler.handle(job, caller.name, trace_id)

    def _traced(
        self, trace: CallTrace, body: dict[str, Any], job: wire.Job | None, *, status: int = 0
    ) -> dict[str, Any]:
        """``body`` with its trace id, traced here as the call's verdict: the caller gets ``body`` whatever
        serving saw (nothing, or a reply the bridge turned into this error: a late answer, a hop that timed
        out after serving answered), so the store keeps this outcome over serving's record of the call."""
        trace.job_id = job.job_id if job is not None else None
        code = None if body.get("error") is None else str(body.get("code") or "error")
        self.tracer.finish(trace, error_code=code, status=status, verdict=True)
        return {**body, "trace": trace.trace_id}

    async def _dead_letter(
        self, stream: str, entry_id: str, fields: Mapping[str, str], reason: str, message: str
    ) -> None:
        """Ack the entry into the dead letters with the reason; no reply, and no done key but the entry's own."""
        dead = {"stream": stream, "reason": reason, "message": message, "fields": dict(fields)}
        by_entry = f"entry:{stream}:{entry_id}"  # never the job id it claims: that belongs to the real job
        await self.finish(stream, entry_id, None, b"", {}, dead=dead, done_id=by_entry)

    async def finish(
        self,
        stream: str,
        entry_id: str,
        job: wire.Job | None,
        key: bytes,
        body: Mapping[str, Any],
        *,
        status: int = 0,
        dead: Mapping[str, Any] | None = None,
        record: str = "",
        done_id: str = "",
    ) -> bool:
        """Run the reply script, retrying a lost Redis until the job's deadline (at least 30 s).

        With a ``job``, the reply (signed with ``key``) goes to its reply stream once per job id; without
        one (a dead letter), nothing is replied and ``done_id`` names the entry's own done key.
        """
        token = f"{self._token_prefix}{next(self._finishes)}"  # this finish's, kept across its retries
        if job is not None:
            done_id, reply_to = job.job_id, job.reply_to
            fields = replies.reply_fields(job.key_id, key, job.job_id, body, status)
        else:
            reply_to, fields = None, {}
        first = await self._retried(
            job,
            "reply",
            lambda: self.store.finish(
                stream,
                entry_id,
                done_id=done_id,
                reply_to=reply_to,
                reply=fields,
                dead=dead,
                done_ttl_s=wire.done_ttl(job.deadline if job else None, self.clock()),
                token=token,
                record=record,
                records_bound=self.records_bound,
                digest=job.digest if job is not None else "",
            ),
        )
        if first is None:
            log.warning("gave up replying to %s on %s; it stays pending and will be reclaimed", entry_id, stream)
        return bool(first)

    async def _retried(self, job: wire.Job | None, what: str, call: Callable[[], Awaitable[T]]) -> T | None:
        """``call()``, retried on a lost Redis until the job's deadline (at least 30 s); None when it gave up."""
        give_up = max(job.deadline if job else 0.0, self.clock() + 30.0)
        outage: Outage | None = None  # built on the first failure only: this runs once per job
        while True:
            try:
                result = await call()
            except StoreUnavailable as exc:
                outage = outage or Outage(f"bridge {self.consumer} {what}", log)
                if self.clock() >= give_up:
                    return None
                await asyncio.sleep(outage.lost(exc))
            else:
                if outage is not None:
                    outage.back()
                return result
