"""The retrain trigger: classify bus replies, keep each model's failure window, take the shared cooldown.

Seed 000's table, read from the reply the bridge produced (the error's meaning, not only the status):

- a model failure (``inference_failed`` set, a code whose error is a ``model_failure``, or an answer
  without a finite prediction) is a ``FAILURE``;
- a served prediction, and a schema error (422, ``invalid_input`` and its kind) are ``OK``: counted in
  the window, not failures;
- anything else (model not found, pipeline unreachable, transport failure, a passed deadline) is
  ``IGNORED``: it says nothing about the model, so it takes no place in the window.

The window and the cooldown are shared by every bridge (``failure_store.RedisFailureStore``). At a rate
of ``threshold`` or more over a full window, ``FailureTracker.check`` claims the model's cooldown and
queues a retrain request in one step: one request per cooldown, however many trackers cross together.

Failure mode: the store's ``StoreUnavailable``; ``push`` and ``check`` are separate steps, so a caller
retries only the one that failed.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from examlops.core import errors
from examlops.core.settings import FailureSettings
from examlops.monitoring.retrain import RetrainRequest

log = logging.getLogger(__name__)


class Outcome(Enum):
    OK = "ok"
    FAILURE = "failure"
    IGNORED = "ignored"


def classify(status: int, reply: Mapping[str, Any]) -> Outcome:
    """The outcome of one bus reply for the retrain trigger (the table in the module docstring)."""
    kind = errors.error_class(reply.get("code"))
    if reply.get("inference_failed") is True or (kind is not None and kind.model_failure):
        return Outcome.FAILURE
    if reply.get("error") is None:
        prediction = reply.get("prediction")
        finite = isinstance(prediction, int | float) and not isinstance(prediction, bool) and math.isfinite(prediction)
        return Outcome.OK if finite else Outcome.FAILURE
    if status == 422 or (kind is not None and issubclass(kind, errors.InvalidInput)):
        return Outcome.OK
    return Outcome.IGNORED


@dataclass(frozen=True, slots=True)
class WindowState:
    size: int
    failures: int
    capacity: int

    @property
    def full(self) -> bool:
        return self.size >= self.capacity

    @property
    def rate(self) -> float:
        return self.failures / self.size if self.size else 0.0


class FailureStore(Protocol):
    def push(self, model: str, failed: bool, capacity: int) -> WindowState: ...

    def push_many(
        self, outcomes: Sequence[tuple[str, bool]], capacity: int, *, call_key: str = ""
    ) -> list[WindowState]:
        """``push`` for each (model, failed) in order, atomically; the state after each push, lined up.

        A call whose ``call_key`` was seen before pushes nothing and gives the states that call gave:
        retrying after a lost answer never counts an outcome twice, nor changes which states are due.
        """
        ...

    def claim(self, model: str, cooldown_s: float, request: RetrainRequest) -> bool:
        """Take the model's cooldown and queue ``request``, atomically; False when the cooldown is running."""
        ...

    def window(self, model: str, capacity: int) -> WindowState: ...

    def cooldown_left(self, model: str) -> float: ...

    def models(self) -> list[str]: ...

    def last_requests(self) -> dict[str, dict[str, Any]]: ...


class FailureTracker:
    """Feeds outcomes into the shared windows and claims a retrain when a full window's rate reaches the threshold.

    ``push`` and ``check`` are separate steps so that a caller retrying a lost Redis retries only the step
    that failed (a retried push would count one outcome twice).
    """

    def __init__(
        self,
        store: FailureStore,
        settings: FailureSettings,
        *,
        clock: Callable[[], float] = time.time,
        new_token: Callable[[], str] = lambda: uuid.uuid4().hex,
    ) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.new_token = new_token

    def push(self, model: str, outcome: Outcome) -> WindowState | None:
        """Count one outcome; None for an ignored one. ``StoreUnavailable``."""
        if outcome is Outcome.IGNORED:
            return None
        return self.store.push(model, outcome is Outcome.FAILURE, self.settings.window)

    def push_many(self, outcomes: Sequence[tuple[str, Outcome]], *, call_key: str = "") -> list[WindowState | None]:
        """``push`` for each (model, outcome) in order, in one store call; None for the ignored ones.

        Retried after a lost answer with the same ``call_key``, it counts nothing twice.
        """
        counted = [(model, outcome is Outcome.FAILURE) for model, outcome in outcomes if outcome is not Outcome.IGNORED]
        states = iter(self.store.push_many(counted, self.settings.window, call_key=call_key) if counted else [])
        return [None if outcome is Outcome.IGNORED else next(states) for _model, outcome in outcomes]

    def due(self, state: WindowState) -> bool:
        """Whether this window state asks for a retrain (a full window at or above the threshold)."""
        return state.full and state.rate >= self.settings.threshold

    def check(self, model: str, state: WindowState) -> RetrainRequest | None:
        """The request queued when this tracker took the cooldown, else None. ``StoreUnavailable``."""
        if not self.due(state):
            return None
        reason = (
            f"failure rate {state.failures}/{state.size} = {state.rate:.2f} >= {self.settings.threshold} "
            f"over the last {state.size} bus requests"
        )
        key = f"examlops-retrain-{model.lower()}-{self.new_token()}"
        request = RetrainRequest(model, reason, key, self.clock())
        if not self.store.claim(model, self.settings.cooldown_s, request):
            return None
        log.warning("asking for a retrain of %s: %s (key %s)", model, reason, key)
        return request

    def observe(self, model: str, outcome: Outcome) -> RetrainRequest | None:
        state = self.push(model, outcome)
        return None if state is None else self.check(model, state)


@dataclass(frozen=True, slots=True)
class ModelFailureStatus:
    model: str
    window: WindowState
    cooldown_left_s: float
    last_request: dict[str, Any] | None

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "failure_rate": round(self.window.rate, 4),
            "failures": self.window.failures,
            "window_size": self.window.size,
            "window_capacity": self.window.capacity,
            "cooldown_left_s": round(self.cooldown_left_s, 3),
            "last_request": self.last_request,
        }


def failure_status(store: FailureStore, models: Iterable[str], capacity: int) -> list[ModelFailureStatus]:
    """Per model (those given and those with a window): rate, window fill, cooldown left, last request."""
    names = {m.lower(): m for m in store.models()} | {m.lower(): m for m in models}
    last = store.last_requests()
    return [
        ModelFailureStatus(name, store.window(name, capacity), store.cooldown_left(name), last.get(key))
        for key, name in sorted(names.items())
    ]
