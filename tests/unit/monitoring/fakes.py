"""Fakes at the monitoring ports: they keep state in memory, move on an injected clock and can be steered."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from examlops.core.errors import DependencyUnavailable
from examlops.monitoring.failures import WindowState
from examlops.monitoring.retrain import RetrainRequest, last_record


@dataclass
class Clock:
    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class InMemoryOutbox:
    queued: dict[str, RetrainRequest] = field(default_factory=dict)
    last: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, request: RetrainRequest) -> bool:
        if request.idempotency_key in self.queued:
            return False
        self.queued[request.idempotency_key] = request
        self.last[request.model.lower()] = last_record(request)
        return True

    def pending(self) -> list[RetrainRequest]:
        return sorted(self.queued.values(), key=lambda r: r.requested_at)

    def delivered(self, request: RetrainRequest, run_id: str, now: float) -> None:
        self.last[request.model.lower()].update(delivered_at=now, flow_run_id=run_id, error=None)
        del self.queued[request.idempotency_key]

    def attempt_failed(self, request: RetrainRequest, error: str, attempts: int) -> None:
        self.last[request.model.lower()].update(attempts=attempts, error=error)


@dataclass
class InMemoryFailureStore:
    """Windows and cooldowns in memory; the cooldown expires on the injected clock."""

    clock: Clock
    outbox: InMemoryOutbox = field(default_factory=InMemoryOutbox)
    windows: dict[str, list[bool]] = field(default_factory=dict)
    cooldown_until: dict[str, float] = field(default_factory=dict)
    calls: dict[str, list[WindowState]] = field(default_factory=dict)

    def push(self, model: str, failed: bool, capacity: int) -> WindowState:
        window = self.windows.setdefault(model.lower(), [])
        window.append(failed)
        del window[:-capacity]
        return WindowState(len(window), sum(window), capacity)

    def push_many(
        self, outcomes: Sequence[tuple[str, bool]], capacity: int, *, call_key: str = ""
    ) -> list[WindowState]:
        if call_key in self.calls:
            return self.calls[call_key]
        states = [self.push(model, failed, capacity) for model, failed in outcomes]
        if call_key:
            self.calls[call_key] = states
        return states

    def claim(self, model: str, cooldown_s: float, request: RetrainRequest) -> bool:
        if self.cooldown_until.get(model.lower(), 0.0) > self.clock():
            return False
        if cooldown_s > 0:
            self.cooldown_until[model.lower()] = self.clock() + cooldown_s
        return self.outbox.add(request)

    def window(self, model: str, capacity: int) -> WindowState:
        window = self.windows.get(model.lower(), [])[-capacity:]
        return WindowState(len(window), sum(window), capacity)

    def cooldown_left(self, model: str) -> float:
        return max(0.0, self.cooldown_until.get(model.lower(), 0.0) - self.clock())

    def models(self) -> list[str]:
        return sorted(self.windows)

    def last_requests(self) -> dict[str, dict[str, Any]]:
        return self.outbox.last


@dataclass
class FakeRequester:
    """Acts like Prefect with idempotency keys: one run per key. Fails the first ``fail_first`` calls."""

    fail_first: int = 0
    calls: list[str] = field(default_factory=list)
    runs: dict[str, str] = field(default_factory=dict)

    def request(self, model: str, reason: str, idempotency_key: str, requested_at: float = 0.0) -> str:
        self.calls.append(idempotency_key)
        if len(self.calls) <= self.fail_first:
            raise DependencyUnavailable("Prefect cannot be reached")
        return self.runs.setdefault(idempotency_key, f"run-{len(self.runs) + 1}")
