"""Retrain requests: the ``RetrainRequester`` port, a durable outbox in Redis, its delivery loop, the Prefect adapter.

Keys::

    examlops:retrain:outbox   hash idempotency key -> request JSON; removed only once the control plane accepted it
    examlops:retrain:last     hash model (lower-cased) -> JSON of that model's last request and how its delivery went

A request is written to the outbox first (by the failure tracker, atomically
with the cooldown it takes: ``failures.FAILURE_SCRIPT``), then ``OutboxDelivery``
sends it. A requester that fails (Prefect unreachable, deployment missing) is
retried with backoff (1 s doubling to 60 s); nothing is dropped. Exactly once:
the request's idempotency key goes to Prefect, which makes one flow run per key
however often (or by however many bridges) the request is delivered, and the
``retrain.requested`` audit event uses the same key as its once key.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import redis

from examlops.adapters.redis import translated
from examlops.core.backoff import Backoff
from examlops.core.errors import DependencyUnavailable, StoreUnavailable
from examlops.monitoring.audit import RETRAIN_REQUESTED, AuditTrail

log = logging.getLogger(__name__)

OUTBOX = "examlops:retrain:outbox"
LAST = "examlops:retrain:last"
DEFAULT_DEPLOYMENT = "retrain/retrain"


@dataclass(frozen=True, slots=True)
class RetrainRequest:
    model: str
    reason: str
    idempotency_key: str
    requested_at: float

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RetrainRequest:
        data = json.loads(text)
        return cls(str(data["model"]), str(data["reason"]), str(data["idempotency_key"]), float(data["requested_at"]))


class RetrainRequester(Protocol):
    def request(self, model: str, reason: str, idempotency_key: str, requested_at: float = 0.0) -> str:
        """Ask the control plane to retrain ``model``; the id of the run it made (the same run for the same key).
        ``requested_at`` is when the trigger fired (the closed loop ignores a request older than its promotion).

        Raises ``DependencyUnavailable`` (or anything else) when it could not; the outbox retries.
        """
        ...


class OutboxStore(Protocol):
    def pending(self) -> list[RetrainRequest]: ...

    def delivered(self, request: RetrainRequest, run_id: str, now: float) -> None: ...

    def attempt_failed(self, request: RetrainRequest, error: str, attempts: int) -> None: ...


class RedisOutbox:
    """The outbox and the last-request record in Redis; ``StoreUnavailable`` when Redis is down."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client

    def add(self, request: RetrainRequest) -> bool:
        """Queue a request outside the tracker (an operator's ``exa`` command); False when its key is queued."""
        with translated("queueing a retrain request"):
            added = bool(self.redis.hsetnx(OUTBOX, request.idempotency_key, request.to_json()))
            if added:
                self.redis.hset(LAST, request.model.lower(), json.dumps(last_record(request)))
        return added

    def pending(self) -> list[RetrainRequest]:
        with translated("reading the retrain outbox"):
            raw: Any = self.redis.hgetall(OUTBOX)
        requests = []
        for key, text in raw.items():
            try:
                requests.append(RetrainRequest.from_json(text))
            except (ValueError, KeyError, TypeError):
                log.error("dropping unreadable retrain request %s from the outbox: %.200s", key, text)
                self.redis.hdel(OUTBOX, key)
        return sorted(requests, key=lambda r: r.requested_at)

    def delivered(self, request: RetrainRequest, run_id: str, now: float) -> None:
        self._update_last(request, delivered_at=now, flow_run_id=run_id, error=None)
        with translated("clearing the retrain outbox"):
            self.redis.hdel(OUTBOX, request.idempotency_key)

    def attempt_failed(self, request: RetrainRequest, error: str, attempts: int) -> None:
        self._update_last(request, attempts=attempts, error=error[:500])

    def _update_last(self, request: RetrainRequest, **changes: Any) -> None:
        with translated("recording a retrain request"):
            current: Any = self.redis.hget(LAST, request.model.lower())
            record = json.loads(current) if current else {}
            if record.get("idempotency_key") not in (None, request.idempotency_key):
                return  # a newer request of this model is recorded already
            self.redis.hset(LAST, request.model.lower(), json.dumps({**last_record(request), **record, **changes}))

    def last(self) -> dict[str, dict[str, Any]]:
        """model (lower-cased) -> its last request: key, reason, requested_at, delivered_at, flow_run_id, error."""
        with translated("reading retrain requests"):
            raw: Any = self.redis.hgetall(LAST)
        return {model: json.loads(text) for model, text in raw.items()}


def last_record(request: RetrainRequest) -> dict[str, Any]:
    """The ``examlops:retrain:last`` record of a request not delivered yet."""
    return {**asdict(request), "delivered_at": None, "flow_run_id": None, "attempts": 0, "error": None}


DELIVERY = Backoff(1.0, 60.0)
"""Waits between deliveries of one retrain request that the control plane did not accept."""


class OutboxDelivery:
    """Sends queued requests until accepted: ``deliver_due`` is one pass; ``start`` runs passes in a thread.

    Backoff per request (``backoff``: 1 s doubling to 60 s by default) after each failure, on the injected clock.
    After acceptance the ``retrain.requested`` event is appended (once per key), then the entry is removed:
    a crash in between re-delivers, and Prefect's idempotency key and the once key absorb it.
    """

    def __init__(
        self,
        store: OutboxStore,
        requester: RetrainRequester,
        trail: AuditTrail | None = None,
        *,
        backoff: Backoff = DELIVERY,
        poll_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.requester = requester
        self.trail = trail
        self.backoff = backoff
        self.poll_s = poll_s
        self.clock = clock
        self._failures: dict[str, tuple[int, float]] = {}
        """idempotency key -> (failed attempts, time of the next attempt)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._store_down = False

    def deliver_due(self) -> int:
        """Try every request whose backoff has passed; how many were accepted. ``StoreUnavailable``."""
        accepted = 0
        for request in self.store.pending():
            key = request.idempotency_key
            attempts, next_at = self._failures.get(key, (0, 0.0))
            if self.clock() < next_at:
                continue
            try:
                run_id = self.requester.request(request.model, request.reason, key, request.requested_at)
            except Exception as exc:
                attempts += 1
                delay = self.backoff.delay(attempts)
                self._failures[key] = (attempts, self.clock() + delay)
                (log.warning if attempts == 1 else log.info)(
                    "retrain request %s for %s not accepted (attempt %d, next in %.0f s): %s",
                    key,
                    request.model,
                    attempts,
                    delay,
                    exc,
                )
                self.store.attempt_failed(request, str(exc), attempts)
                continue
            if self.trail is not None:
                data: dict[str, Any] = {"idempotency_key": key, "reason": request.reason, "flow_run_id": run_id}
                data["requested_at"] = request.requested_at
                self.trail.append(RETRAIN_REQUESTED, request.model, data, once_key=f"examlops:audit:once:{key}")
            self.store.delivered(request, run_id, self.clock())
            self._failures.pop(key, None)
            accepted += 1
            log.info("retrain of %s requested: flow run %s (key %s)", request.model, run_id, key)
        return accepted

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="examlops-retrain-outbox", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.deliver_due()
                if self._store_down:
                    log.warning("retrain outbox: Redis reachable again")
                self._store_down = False
            except StoreUnavailable as exc:
                if not self._store_down:
                    log.warning("retrain outbox: %s; retrying", exc)
                self._store_down = True
            except Exception:
                log.exception("retrain outbox: delivery pass failed")
            self._stop.wait(self.poll_s)


class PrefectRetrainRequester:
    """Creates a flow run of the retrain deployment with the request's idempotency key (Prefect dedupes on it).

    The run gets the parameters ``model``, ``reason``, ``source`` (``failure-trigger``) and ``requested_at``.
    Prefect is imported on the first request only: the import is slow and creates ``PREFECT_HOME``.
    """

    def __init__(self, api_url: str, deployment: str = DEFAULT_DEPLOYMENT, *, timeout_s: float = 10.0) -> None:
        self.api_url = api_url
        self.deployment = deployment
        self.timeout_s = timeout_s

    def request(self, model: str, reason: str, idempotency_key: str, requested_at: float = 0.0) -> str:
        from prefect.client.orchestration import SyncPrefectClient

        try:
            with SyncPrefectClient(self.api_url, httpx_settings={"timeout": self.timeout_s}) as client:
                deployment = client.read_deployment_by_name(self.deployment)
                run = client.create_flow_run_from_deployment(
                    deployment.id,
                    parameters={
                        "model": model,
                        "reason": reason,
                        "source": "failure-trigger",
                        "requested_at": requested_at,
                    },
                    idempotency_key=idempotency_key,
                    tags=["examlops", "retrain-trigger"],
                )
        except Exception as exc:
            # Prefect raises httpx errors, its own ObjectNotFound (deployment not served yet) and more: all of
            # them mean "not accepted now", and the outbox tries again.
            raise DependencyUnavailable(
                f"Prefect at {self.api_url} did not accept a run of {self.deployment}: {type(exc).__name__}: {exc}"
            ) from exc
        return str(run.id)
