"""One handler per model address: the features from the catalog schema, one POST to the pipeline, the reply.

Contract of ``ModelHandler.handle``: it never raises for a job (every outcome is
a reply body with ``prediction`` and ``error``), posts at most once (no retry
at this hop, seed 000 step 3) with the job's deadline in the body, and waits
no longer than the job's remaining time. The HTTP reply's body is kept as it
came, so ``code`` and ``inference_failed`` still tell a schema error (422) from
a model failure (5xx marked ``inference_failed``, or an empty prediction).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from examlops.core.errors import DeadlineExceeded, ExamlopsError, InferenceFailed, InvalidInput, PipelineUnavailable
from examlops.core.messages import canonical_alias
from examlops.core.settings import HttpSettings
from examlops.registry.catalog import ModelSpec
from examlops.serving.bus import Job, error_body

INFER_PATH = "/infer-pipeline/infer"


def http_client(http: HttpSettings, max_connections: int = 64) -> httpx.AsyncClient:
    """The one shared client of a bridge: 5 s to connect, 10 s to read by default, and no retry."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(http.read_timeout_s, connect=http.connect_timeout_s),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        transport=httpx.AsyncHTTPTransport(retries=0),
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a handler did: the reply body, serving's HTTP status (0 when it gave none) and whether to record it."""

    body: dict[str, Any]
    status: int
    recorded: bool


class ModelHandler:
    """Serves the jobs of one catalog model. The model is fixed by the address, never read from the job."""

    def __init__(
        self,
        spec: ModelSpec,
        http: httpx.AsyncClient,
        serving_url: str,
        timeouts: HttpSettings,
        clock: Callable[[], float],
    ) -> None:
        self.spec = spec
        self.http = http
        self.url = serving_url.rstrip("/") + INFER_PATH
        self.timeouts = timeouts
        self.clock = clock

    def features(self, job: Job) -> dict[str, Any]:
        """The request body, from the fields the model's input schema names; ``InvalidInput`` when they don't fit.

        Without an alias in the job none is sent, so serving applies the model's default alias (Production)
        with its traffic split, as seed 000 step 6 says bus jobs get; a named alias pins that alias.
        """
        payload = job.payload
        schema = self.spec.input_schema
        embedding = payload.get("embedding")
        if not isinstance(embedding, list) or len(embedding) != schema.embedding.length:
            raise InvalidInput(f"embedding: must be a list of {schema.embedding.length} numbers", field="embedding")
        if not all(type(v) in (int, float) and math.isfinite(v) for v in embedding):
            raise InvalidInput("embedding: must hold finite numbers only", field="embedding")
        nodes = payload.get("node_count")
        low, high = schema.node_count.minimum, schema.node_count.maximum
        if type(nodes) is not int or (low is not None and nodes < low) or (high is not None and nodes > high):
            raise InvalidInput(
                f"node_count: must be an integer of at least {self.spec.min_node_count}", field="node_count"
            )
        body: dict[str, Any] = {
            "model": self.spec.name,
            "embedding": embedding,
            "node_count": nodes,
            "job_id": job.job_id,
            "deadline": job.deadline,
        }
        if job.caller:
            body["user_id"] = job.caller[:128]
        alias = payload.get("alias")
        if alias is not None:
            if not isinstance(alias, str) or not alias.strip():
                raise InvalidInput("alias: must be a non-empty string", field="alias")
            body["alias"] = canonical_alias(alias)
        return body

    def _error(self, error: ExamlopsError, job: Job, status: int = 0, *, recorded: bool = True) -> Outcome:
        return Outcome(error_body(error, model=self.spec.name, job_id=job.job_id), status, recorded)

    async def handle(self, job: Job) -> Outcome:
        try:
            body = self.features(job)
        except InvalidInput as exc:
            return self._error(exc, job)
        remaining = job.deadline - self.clock()
        timeout = httpx.Timeout(
            max(0.001, min(self.timeouts.read_timeout_s, remaining)),
            connect=max(0.001, min(self.timeouts.connect_timeout_s, remaining)),
        )
        try:
            response = await self.http.post(self.url, json=body, timeout=timeout)
        except httpx.TimeoutException as exc:
            if self.clock() >= job.deadline:
                return self._error(
                    DeadlineExceeded("the job's deadline passed while serving worked on it"), job, 0, recorded=False
                )
            return self._error(PipelineUnavailable(f"serving did not answer in time ({type(exc).__name__})"), job)
        except httpx.TransportError as exc:
            return self._error(PipelineUnavailable(f"serving at {self.url} cannot be reached ({exc})"), job)
        return self._reply(job, response)

    def _reply(self, job: Job, response: httpx.Response) -> Outcome:
        status = response.status_code
        try:
            data = response.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            error = ExamlopsError(f"serving answered HTTP {status} without a JSON object")
            return self._error(error, job, status)
        if self.clock() > job.deadline or data.get("code") == DeadlineExceeded.code:
            # Its caller gave up: a late answer is refused like an early one, and never recorded.
            return self._error(
                DeadlineExceeded("the job's deadline passed before serving answered"), job, status, recorded=False
            )
        if status == 200:
            prediction: Any = data.get("prediction")
            if type(prediction) not in (int, float) or not math.isfinite(prediction):
                return self._error(InferenceFailed("serving returned an empty prediction"), job, status)
            return Outcome({**data, "error": None}, status, True)
        message = data.get("error")
        return Outcome(
            {
                **data,
                "error": message if isinstance(message, str) and message else f"serving answered HTTP {status}",
                "prediction": 0.0,
                "code": data.get("code") or f"http_{status}",
                "inference_failed": data.get("inference_failed") is True,
            },
            status,
            True,
        )
