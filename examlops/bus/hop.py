"""One handler per bus address: the features from the catalog schema, one POST to serving, the reply.

A model's address posts to ``/infer-pipeline/infer`` with the model's name; a task's address posts to
``/v1/tasks/{task}/infer`` with the same body less ``model`` and ``alias`` (serving resolves the task), and
its reply names the task. Every post carries the job's identity in ``X-Examlops-Identity``; whatever
proves the bridge's own credential to serving is the shared client's (``bootstrap.clients.hop_client``).

Contract of ``ModelHandler.handle``: it never raises for a job (every outcome is
a reply body with ``prediction`` and ``error``), posts at most once (no retry
at this hop, seed 000 step 3), and waits no longer than the job's remaining
time. Every job is posted with ``budget_ms`` = what is left until its deadline
at the hop (on the bus's clock), rounded down, never more, and no absolute
``deadline``: serving counts that budget from when it receives the call, so
its wall clock, which may differ from Redis's, plays no part. Budgets only
tighten on the way (seed 001): the deadline of a job with a budget (its own,
or its task's default: ``budgeted``) is the earlier of the two, and a job with
nothing left is not posted (``deadline_exceeded``). An answer
carries the job's ``budget_ms`` and ``budget_remaining_ms``; serving's refusal
(503, code ``refused``) is passed on with its ``refused`` reason, ``estimate_ms``
and ``retry_after_s`` (from ``Retry-After``) and is never recorded, so it
never counts toward the retrain trigger. The HTTP reply's body is kept as it
came, so ``code`` and ``inference_failed`` still tell a schema error (422) from
a model failure (5xx marked ``inference_failed``, or an empty prediction).

The client (``hop_http.http_client``, one shared by a bridge over the transport ``bootstrap`` picks), the
hop's headers and what counts as a timeout are ``hop_http``; the handler is the same on every transport. The
hop is on every job's critical path: the body is encoded once with orjson and
no ``Timeout`` is built per request unless the job has less time left than the
client's (figures: ``bench/RESULTS.md``).
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import orjson

from examlops.bus import budget
from examlops.bus.hop_http import hop_request, timed_out, trace_headers
from examlops.bus.replies import error_body
from examlops.bus.wire import Job
from examlops.core.errors import (
    DeadlineExceeded,
    ExamlopsError,
    InferenceFailed,
    InvalidInput,
    PipelineUnavailable,
    Refused,
)
from examlops.core.jsoncodec import dumps
from examlops.core.messages import canonical_alias
from examlops.core.settings import HttpSettings
from examlops.registry.catalog import ModelSpec

if TYPE_CHECKING:
    from httpx._client import UseClientDefault  # the type of httpx.USE_CLIENT_DEFAULT, not re-exported

INFER_PATH = "/infer-pipeline/infer"
TASK_INFER_PATH = "/v1/tasks/{task}/infer"
_NUMBERS = frozenset((int, float))
_READ = httpx.ByteStream(b"")


def task_path(task: str) -> str:
    """Serving's infer route of one task (the name quoted, though task names need no quoting today)."""
    return TASK_INFER_PATH.format(task=urllib.parse.quote(task, safe=""))


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a handler did: the reply body, serving's HTTP status (0 when it gave none) and whether to record it.

    ``verdict``: the body is the bridge's own answer, not serving's reply passed on (serving gave none, or
    one the bridge turned into an error: late, unreadable, empty); the job's trace must then say so.
    """

    body: dict[str, Any]
    status: int
    recorded: bool
    verdict: bool = False


class ModelHandler:
    """Serves the jobs of one catalog model, or of one task (``task``) that ``spec``'s model answers now.
    The model or task is fixed by the address, never read from the job."""

    def __init__(
        self,
        spec: ModelSpec,
        http: httpx.AsyncClient,
        serving_url: str,
        timeouts: HttpSettings,
        clock: Callable[[], float],
        *,
        task: str | None = None,
        budget_ms: float | None = None,
    ) -> None:
        self.spec = spec
        self.task = task
        self.budget_ms = budget_ms
        """The task's default budget (a task's address only): a job that declares none gets it."""
        self.http = http
        self.url = serving_url.rstrip("/") + (INFER_PATH if task is None else task_path(task))
        self._url = httpx.URL(self.url)  # parsed once, not on every post
        self.timeouts = timeouts
        self.clock = clock
        self._slowest = max(timeouts.read_timeout_s, timeouts.connect_timeout_s)

    def budgeted(self, job: Job, entry_time: float | None) -> Job:
        """``job`` with this address's default budget when it declared none, counted from its submission (the
        job's ``submitted``, else ``entry_time``: when Redis took the entry)."""
        return job.with_default_budget(self.budget_ms, entry_time)

    def features(self, job: Job, identity: str = "", budget_left_ms: float | None = None) -> dict[str, Any]:
        """The request body, from the fields the model's input schema names; ``InvalidInput`` when they don't fit.

        Without an alias in the job none is sent, so serving applies the model's default alias (Production)
        with its traffic split, as seed 000 step 6 says bus jobs get; a named alias pins that alias. A task's
        body has neither model nor alias: the task map names them.
        """
        payload = job.payload
        schema = self.spec.input_schema
        embedding = payload.get("embedding")
        if not isinstance(embedding, list) or len(embedding) != schema.embedding.length:
            raise InvalidInput(f"embedding: must be a list of {schema.embedding.length} numbers", field="embedding")
        if not _NUMBERS.issuperset(map(type, embedding)):  # finiteness is checked as the body is encoded
            raise InvalidInput("embedding: must hold finite numbers only", field="embedding")
        nodes = payload.get("node_count")
        low, high = schema.node_count.minimum, schema.node_count.maximum
        if type(nodes) is not int or (low is not None and nodes < low) or (high is not None and nodes > high):
            raise InvalidInput(
                f"node_count: must be an integer of at least {self.spec.min_node_count}", field="node_count"
            )
        body: dict[str, Any] = {"embedding": embedding, "node_count": nodes, "job_id": job.job_id}
        if budget_left_ms is not None:
            body["budget_ms"] = budget_left_ms
        if identity:
            body["user_id"] = identity[:128]
        if self.task is not None:
            return body
        body["model"] = self.spec.name
        alias = payload.get("alias")
        if alias is not None:
            if not isinstance(alias, str) or not alias.strip():
                raise InvalidInput("alias: must be a non-empty string", field="alias")
            body["alias"] = canonical_alias(alias)
        return body

    def encoded(self, job: Job, identity: str = "", budget_left_ms: float | None = None) -> bytes:
        """The request body as bytes; ``InvalidInput`` when the job's fields don't fit or a number is not finite."""
        body = self.features(job, identity, budget_left_ms)
        try:
            return dumps(body)
        except ValueError as exc:  # inf or nan (a payload's 1e309 parses as inf)
            raise InvalidInput("embedding: must hold finite numbers only", field="embedding") from exc

    def _timeout(self, remaining: float) -> httpx.Timeout | UseClientDefault:
        if remaining >= self._slowest:
            return httpx.USE_CLIENT_DEFAULT
        return httpx.Timeout(
            max(0.001, min(self.timeouts.read_timeout_s, remaining)),
            connect=max(0.001, min(self.timeouts.connect_timeout_s, remaining)),
        )

    def error_body(self, error: ExamlopsError, job_id: str) -> dict[str, Any]:
        """An error reply of this address: it names the model, and the task of a task's address."""
        body = error_body(error, model=self.spec.name, job_id=job_id)
        if self.task is not None:
            body["task"] = self.task
        return body

    def _error(self, error: ExamlopsError, job: Job, status: int = 0, *, recorded: bool = True) -> Outcome:
        return Outcome(self.error_body(error, job.job_id), status, recorded, verdict=True)

    async def handle(self, job: Job, identity: str = "", trace_id: str = "") -> Outcome:
        """Serve ``job`` on behalf of ``identity``; both it and ``trace_id`` travel to serving in the hop's
        headers (``trace_headers``), and serving traces the call under that id."""
        now = self.clock()
        left_ms = budget.left_ms(job.deadline, now)
        if job.budget_ms is not None:
            left_ms = min(left_ms, job.budget_ms)  # never more than the budget, whatever the clocks' samples
        if left_ms <= 0:
            return self._error(
                DeadlineExceeded("the job's time ran out before it reached serving"), job, recorded=False
            )
        try:
            content = self.encoded(job, identity, left_ms)
        except InvalidInput as exc:
            return self._error(exc, job)
        timeout = self._timeout(job.deadline - now)
        headers = trace_headers(trace_id, identity)
        try:
            response = await self.http.send(hop_request(self.http, self._url, content, headers, timeout))
        except (httpx.TransportError, TimeoutError) as exc:
            return self._transport_error(exc, job)
        # httpx binds a response's stream back to the response, a reference cycle of ~15 objects that only
        # the garbage collector frees; the body is read, so cut it: the response goes by reference counting.
        response.stream = _READ
        return self._reply(job, response)

    def _budget(self, job: Job) -> dict[str, Any]:
        return budget.reply_budget(job.budget_ms, job.deadline, self.clock())

    def _refused(self, job: Job, data: dict[str, Any], response: httpx.Response) -> Outcome:
        """Serving's refusal passed on as a normal outcome: never recorded, so never counted as a failure."""
        body = {**budget.refused_body(data, response.headers.get("retry-after")), **self._budget(job)}
        return Outcome(self._named(body), response.status_code, False)

    def _transport_error(self, exc: Exception, job: Job) -> Outcome:
        if not timed_out(exc):
            return self._error(PipelineUnavailable(f"serving at {self.url} cannot be reached ({exc})"), job)
        if self.clock() >= job.deadline:
            return self._error(
                DeadlineExceeded("the job's deadline passed while serving worked on it"), job, 0, recorded=False
            )
        return self._error(PipelineUnavailable(f"serving did not answer in time ({type(exc).__name__})"), job)

    def _reply(self, job: Job, response: httpx.Response) -> Outcome:
        status = response.status_code
        try:
            data = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            data = None
        if not isinstance(data, dict):
            error = ExamlopsError(f"serving answered HTTP {status} without a JSON object")
            return self._error(error, job, status)
        if data.get("code") == Refused.code:  # before the deadline check: a late refusal is still a refusal
            return self._refused(job, data, response)
        if self.clock() > job.deadline or data.get("code") == DeadlineExceeded.code:
            # Its caller gave up: a late answer is refused like an early one, and never recorded.
            return self._error(
                DeadlineExceeded("the job's deadline passed before serving answered"), job, status, recorded=False
            )
        if status == 200:
            prediction: Any = data.get("prediction")
            if type(prediction) not in (int, float) or not math.isfinite(prediction):
                return self._error(InferenceFailed("serving returned an empty prediction"), job, status)
            return Outcome(self._named({**data, "error": None, **self._budget(job)}), status, True)
        message = data.get("error")
        return Outcome(
            self._named(
                {
                    **data,
                    "error": message if isinstance(message, str) and message else f"serving answered HTTP {status}",
                    "prediction": 0.0,
                    "code": data.get("code") or f"http_{status}",
                    "inference_failed": data.get("inference_failed") is True,
                }
            ),
            status,
            True,
        )

    def _named(self, body: dict[str, Any]) -> dict[str, Any]:
        """A task's reply names the task, whatever serving's own body says."""
        if self.task is not None:
            body["task"] = self.task
        return body
