"""One bus job from its stream entry to its reply: verify, refuse or serve, then finish once.

Contract (``JobRunner.process``, run by the bridge once per delivered entry):

- A job that cannot be read or verified gets an error reply (when its reply address can be trusted) and a
  dead letter; a copy older than its deadline plus ``wire.DONE_MARGIN_S`` is dead-lettered without a reply
  (its done key may be gone, so its job id never gets a second one); a job delivered more than
  ``wire.MAX_DELIVERIES`` times gets an error reply and a dead letter.
- A job whose done key exists (answered before) is acked without asking serving again.
- Otherwise its handler answers, and the reply, the job's record (``core.records.ServedInference``, with
  the embedding's statistics, when ``record`` is on and the handler asks for it), the done key, XACK and
  XDEL are one script (``scripts.REPLY_SCRIPT``): a job is answered and recorded together, once.
- A lost Redis is retried with backoff until the job's deadline (at least 30 s); then the job stays
  pending and is reclaimed. Any other error leaves it pending too (logged).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from examlops.bus import wire
from examlops.bus.hop import ModelHandler, Outcome
from examlops.bus.store import BusStore
from examlops.core.backoff import Outage
from examlops.core.errors import DeadlineExceeded, ModelNotFound, StoreUnavailable
from examlops.core.records import ServedInference, embedding_stats
from examlops.tracing import CallTrace, Tracer, trace_id_for_job

log = logging.getLogger(__name__)


class JobRunner:
    """Serves and finishes single jobs for one bridge (``consumer``)."""

    def __init__(
        self,
        store: BusStore,
        handlers: Mapping[str, ModelHandler],
        secret: bytes,
        consumer: str,
        *,
        record: bool,
        records_bound: int,
        clock: Callable[[], float],
        tracer: Tracer | None = None,
    ) -> None:
        self.tracer = tracer or Tracer(None)
        self.store = store
        self.handlers = handlers
        self.consumer = consumer
        self.record = record
        self.records_bound = records_bound
        self.clock = clock
        self._secret = secret
        # Finish tokens: this instance's own prefix (a consumer name may be given, and reused after a
        # restart) and a counter.
        self._token_prefix = f"{consumer}:{secrets.token_hex(4)}:"
        self._finishes = itertools.count()

    async def process(
        self, stream: str, entry_id: str, fields: Mapping[str, str], delivered: int, done: asyncio.Task[set[str]] | None
    ) -> None:
        try:
            await self._serve(stream, entry_id, fields, delivered, done)
        except Exception:
            # The job stays pending and is reclaimed; a job that keeps failing ends in the dead-letter stream.
            log.exception("job %s on %s failed in the bridge", entry_id, stream)

    async def done_among(self, job_ids: list[str]) -> set[str]:
        try:
            return await self.store.done_among(job_ids)
        except StoreUnavailable:
            return set()  # served then; the reply script still writes one reply per job id

    async def _serve(
        self, stream: str, entry_id: str, fields: Mapping[str, str], delivered: int, done: asyncio.Task[set[str]] | None
    ) -> None:
        address = wire.address_of(stream)
        by_entry = f"entry:{stream}:{entry_id}"
        try:
            job = wire.decode_job(self._secret, address, fields, self.clock())
        except wire.MalformedJob as exc:
            log.warning("refused entry %s on %s: %s", entry_id, stream, exc)
            refused: dict[str, Any] = {"stream": stream, "reason": exc.code, "message": exc.message}
            refused["fields"] = dict(fields)
            # Keyed by entry, not by the unverified job id, so a forged job cannot use up a real job's reply.
            body = self._traced(self.tracer.begin("bus"), wire.error_body(exc, job_id=exc.job_id), None)
            await self.finish(stream, entry_id, by_entry, exc.reply_to, body, dead=refused)
            return
        trace = self.tracer.begin("bus", trace_id_for_job(job.job_id))
        if self.clock() > job.deadline + wire.DONE_MARGIN_S:
            log.warning(
                "job %s on %s expired more than %.0f s ago: dead-lettered", job.job_id, stream, wire.DONE_MARGIN_S
            )
            stale = {"stream": stream, "reason": "stale", "fields": dict(fields)}
            self._traced(trace, wire.error_body(DeadlineExceeded("the job expired long ago"), job_id=job.job_id), job)
            await self.finish(stream, entry_id, by_entry, None, {}, dead=stale)
            return
        handler = self.handlers.get(address)
        model = handler.spec.name if handler else None
        trace.model = model
        if delivered > wire.MAX_DELIVERIES:
            error = wire.Undeliverable(
                f"the job was delivered {delivered} times without an answer; it was dead-lettered"
            )
            dead: dict[str, Any] = {"stream": stream, "reason": error.code, "delivered": delivered}
            dead["fields"] = dict(fields)
            body = self._traced(trace, wire.error_body(error, model=model, job_id=job.job_id), job)
            await self.finish(stream, entry_id, job.job_id, job.reply_to, body, dead=dead, job=job)
            return
        answered = await (done if done is not None else self.done_among([job.job_id]))
        if job.job_id in answered:
            await self.finish(stream, entry_id, job.job_id, job.reply_to, {}, job=job)
            return
        outcome: Outcome
        expired = job.expired(self.clock())
        if handler is None:
            missing = ModelNotFound(f"no model has the bus address {address[:64]}")
            outcome = Outcome(wire.error_body(missing, job_id=job.job_id), 0, False)
        elif expired is not None:
            outcome = Outcome(wire.error_body(expired, model=model, job_id=job.job_id), 0, False)
        else:
            outcome = await handler.handle(job, trace.trace_id)
        if outcome.status == 0 or outcome.verdict:
            body = self._traced(trace, outcome.body, job, status=outcome.status)
        else:  # serving's reply passed on: serving traced the call under this id
            body = {**outcome.body, "trace": trace.trace_id}
        outcome = Outcome(body, outcome.status, outcome.recorded, outcome.verdict)
        record = self._record(job, handler, outcome) if handler is not None and outcome.recorded else ""
        await self.finish(
            stream, entry_id, job.job_id, job.reply_to, outcome.body, status=outcome.status, job=job, record=record
        )

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

    def _record(self, job: wire.Job, handler: ModelHandler, outcome: Outcome) -> str:
        """The job's record (``ServedInference.packed``), or '' when recording is off."""
        if not self.record:
            return ""
        embedding, nodes = job.payload.get("embedding"), job.payload.get("node_count")
        valid = outcome.body.get("code") != "invalid_input" and isinstance(embedding, list)
        try:
            norm, mean, std = embedding_stats(embedding) if valid else (0.0, 0.0, 0.0)  # type: ignore[arg-type]  # a list, checked above
        except TypeError:  # an embedding serving answered with an error, holding non-numbers
            norm, mean, std = 0.0, 0.0, 0.0
        served = ServedInference(
            job_id=job.job_id,
            address=job.address,
            model=handler.spec.name,
            caller=job.caller,
            node_count=nodes if valid and type(nodes) is int else 0,
            reply=outcome.body,
            status=outcome.status,
            served_at=self.clock(),
            norm=norm,
            mean=mean,
            std=std,
        )
        return served.packed()

    async def finish(
        self,
        stream: str,
        entry_id: str,
        done_id: str,
        reply_to: str | None,
        body: Mapping[str, Any],
        *,
        status: int = 0,
        dead: Mapping[str, Any] | None = None,
        job: wire.Job | None = None,
        record: str = "",
    ) -> bool:
        """Run the reply script, retrying a lost Redis until the job's deadline (at least 30 s)."""
        give_up = max(job.deadline if job else 0.0, self.clock() + 30.0)
        token = f"{self._token_prefix}{next(self._finishes)}"  # this finish's, kept across its retries
        outage: Outage | None = None  # built on the first failure only: this runs once per job
        fields = wire.reply_fields(done_id if job else str(body.get("job_id") or ""), body, status)
        while True:
            try:
                first = await self.store.finish(
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
                )
                if outage is not None:
                    outage.back()
                return first
            except StoreUnavailable as exc:
                outage = outage or Outage(f"bridge {self.consumer} reply", log)
                if self.clock() >= give_up:
                    log.warning(
                        "gave up replying to %s on %s; it stays pending and will be reclaimed", entry_id, stream
                    )
                    return False
                await asyncio.sleep(outage.lost(exc))
